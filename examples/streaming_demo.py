"""A short, self-checking tour of Structured Streaming in and out of kafkakv maps (Spark local
mode, the embedded log in a temporary directory).

A query streams the changes of map ``prices`` (``startingOffsets=earliest``: its contents
first), doubles each price, leaves key ``test`` out and applies the result to map
``doubled``, with a checkpoint. It runs with ``trigger(availableNow=True)``: what is there now,
then it stops. The prices change; the query runs again from its checkpoint and applies only
the changes since. Then ``doubled`` must equal the doubled prices, and the checkpoint must hold
two micro-batches. The demo prints "demo ok: ..." and exits 0 when that holds, 1 otherwise.

Run it from the project root::

    .venv/bin/python examples/streaming_demo.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

from pyspark.sql import functions as F

import kafkakv
from kafkakv.pipeline import spark_session


def run_query(spark: Any, target: str, checkpoint: Path) -> None:
    """prices -> (price * 2, key 'test' left out) -> doubled, over what prices holds now."""
    changes = (
        spark.readStream.format("kafkakv")
        .options(target=target, map="prices", startingOffsets="earliest")
        .load()
    )
    doubled = changes.where(F.col("key") != "test").select(
        "key",
        (F.col("new").cast("int") * 2).cast("string").alias("value"),  # null: remove
    )
    query = (
        doubled.writeStream.format("kafkakv")
        .options(target=target, map="doubled")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()


def main() -> int:
    spark = spark_session(app_name="kafkakv-streaming-demo")
    with tempfile.TemporaryDirectory(prefix="kafkakv-streaming-") as home:
        target, checkpoint = str(Path(home) / "log"), Path(home) / "checkpoint"
        with kafkakv.connect(target) as db:
            prices = db.map("prices", partitions=2)
            db.map("doubled", partitions=2).close()
            prices.update({"apple": 3, "pear": 4, "plum": 5, "test": 1})
        run_query(spark, target, checkpoint)
        print("first run:  ", _contents(target, "doubled"))
        with kafkakv.connect(target) as db:
            prices = db.map("prices")
            prices["apple"] = 6  # changed twice: the last value wins
            prices["apple"] = 7
            del prices["pear"]
            prices["fig"] = 10
            want = {k: v * 2 for k, v in prices.items() if k != "test"}
        run_query(spark, target, checkpoint)  # from the checkpoint: the changes since
        got = _contents(target, "doubled")
        print("second run: ", got)
        batches = sorted(p.name for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    if got != want or batches != ["0", "1"]:
        print(f"demo FAILED: doubled is {got}, not {want}; micro-batches {batches}")
        return 1
    print(f"demo ok: doubled equals the doubled prices after {len(batches)} micro-batches")
    return 0


def _contents(target: str, name: str) -> dict[str, Any]:
    with kafkakv.connect(target) as db:
        return dict(sorted(db.map(name).items()))


if __name__ == "__main__":
    sys.exit(main())
