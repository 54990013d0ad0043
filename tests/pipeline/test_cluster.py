"""The data source on a Spark standalone cluster: a master and two workers, each with its own
executor JVM and Python workers, sharing nothing with the driver but the log.

A process runs one Spark context, and this one's is the ``spark`` fixture's (local): the
driver of the cluster's application is a child process, which prints what it found as JSON.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

import pytest

import kafkakv

_DRIVER = textwrap.dedent(
    """
    import json, sys, urllib.request
    from pyspark.sql import functions as F
    from kafkakv.pipeline import spark_session

    master, target, config = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    config.update({"spark.ui.enabled": "true", "spark.ui.port": "0"})
    spark = spark_session(master=master, app_name="kafkakv-cluster-test", config=config)
    df = spark.range(0, 1000, numPartitions=4).select(
        F.concat(F.lit("k"), F.col("id").cast("string")).alias("key"),
        F.to_json(F.struct(F.col("id").alias("n"))).alias("value"),
    )
    df.write.format("kafkakv").options(target=target, map="m").mode("append").save()
    rows = spark.read.format("kafkakv").options(target=target, map="m").load().count()
    imported = spark.sparkContext.parallelize(range(4), 4).map(
        lambda _: __import__("kafkakv").__file__).distinct().collect()
    app = spark.sparkContext.applicationId
    url = f"{spark.sparkContext.uiWebUrl}/api/v1/applications/{app}/executors"
    with urllib.request.urlopen(url, timeout=30) as response:
        executors = {e["id"]: {"tasks": e["totalTasks"], "host": e["hostPort"]}
                     for e in json.load(response)}
    print("RESULT " + json.dumps({"rows": rows, "executors": executors, "kafkakv": imported}))
    spark.stop()
    """
)


@pytest.mark.timeout(1200)
def test_the_data_source_writes_and_reads_on_the_cluster_executors(
    spark_cluster: Any, tmp_path: Any
) -> None:
    target = str(tmp_path / "log")
    with kafkakv.connect(target) as db:
        db.map("m", partitions=2)
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            _DRIVER,
            spark_cluster.master_url,
            target,
            json.dumps(spark_cluster.app_config()),
        ],
        capture_output=True,
        text=True,
        timeout=900,  # five JVMs: minutes on a loaded 2-core machine
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, done.stderr[-3000:]
    result = json.loads(lines[-1].removeprefix("RESULT "))
    assert result["rows"] == 1000
    assert result["kafkakv"] == [kafkakv.__file__]  # the executors import this kafkakv
    executors = result["executors"]
    workers = {name: e for name, e in executors.items() if name != "driver"}
    assert len(workers) == 2, executors  # one executor per worker
    # Spark's own status: every task ran on the workers' executors, none on the driver.
    assert executors["driver"]["tasks"] == 0, executors
    assert sum(e["tasks"] for e in workers.values()) >= 4 + 2 + 4, executors
    with kafkakv.connect(target) as db:
        m = db.map("m")
        assert len(m) == 1000 and m["k999"] == {"n": 999}
