"""Benchmark of the Spark pipeline (issue 6): ingest of a PostgreSQL table into a map, and the
snapshot read of that map into a Spark DataFrame, each next to Spark reading or writing the
same data without kafkakv, in the same run.

Command (from the project root)::

    .venv/bin/python benchmarks/bench_pipeline.py [--rows N] [--repeat R] [--only NAMES]
                                                  [--dir DIR]

NAMES is a comma-separated subset of ``ingest,read,stream`` (``read`` and ``stream`` need an
ingest first, so it runs one, untimed, when ``ingest`` is left out). The script prints the machine, the versions
and the load, one line per measurement, a table and, last, one JSON object with every number.

Set-up: a private PostgreSQL (:class:`~kafkakv.dev.postgres.EmbeddedPostgres`, ``fsync=off``) with
a table ``terminal_acquirer`` of N rows (default 1,000,000) built server-side with
``INSERT ... SELECT ... FROM generate_series`` and then ``ANALYZE``d: ``id bigserial`` primary
key, ``terminal_id text unique`` (``T00000042``), ``acquirer_id``, ``merchant_name``, ``mcc
int``, ``country``, ``is_active boolean`` (true on every row, so the map ends with N keys) and
``updated_at timestamptz`` (one millisecond apart), with an index on ``(updated_at, id)``. A JSON
value is about 190 bytes. Spark is :func:`~kafkakv.pipeline.spark_session` (``local[2]``) with
the PostgreSQL JDBC driver.

1. ``ingest``: ``IngestJob(...).run()`` of the whole table into map ``terminals`` (2 partitions)
   on a fresh embedded log directory every run, with ``TableMapping(key="terminal_id",
   camel_case=True, active_column="is_active")``, ``timestamp_column="updated_at"``,
   ``id_column="id"``. Timed: the whole ``run()`` (its queries, the JDBC read split in two
   tasks by id, the count, the position, the write of N map updates, the stored position).
   Baselines, each a Spark job writing Parquet into a fresh directory:

   - ``jdbc+map -> parquet (1 task)``: ``TableSource.read_all`` (Spark's JDBC source, one task,
     as the API gives it), the same ``TableMapping.apply``, ``key``/``value`` written as
     Parquet;
   - ``jdbc+map -> parquet (2 tasks)``: the same, with the JDBC read split in two tasks by id
     exactly as the ingest splits it (the fair comparison on two cores);
   - ``jdbc -> parquet (1 task)``: ``read_all`` written as Parquet, no mapping.

2. ``read``: after one ingest (untimed), the map's N keys sit in its ops topic.

   - ``kafkakv, unflushed``: ``spark.read.format("kafkakv")`` of the map, ``key``/``value``
     selected, forced with ``.write.format("noop")``, on a fresh copy of the ingested
     directory every run (a read task opens a replica, whose flusher may write the data topic;
     the copy keeps every run unflushed). Copying is not timed.
   - The map is then opened once with ``kafkakv.connect(dir).map("terminals")`` and
     ``flush()``ed, so the data topic holds every key.
   - ``kafkakv, flushed``: the same read, noop write; ``kafkakv, flushed, count()``: the same
     read, ``.count()`` (a Python data source produces every column anyway).
   - Baselines: the flushed read written once to Parquet (``key``, ``value``), then
     ``spark.read.parquet`` forced with the noop write, and with ``.count()`` (Parquet's count
     reads no column: it is shown, not compared).
   - The floor of a Python data source: the same rows as one Arrow IPC file per partition,
     which a data source of this script (``bench_ready_arrow``) yields batch by batch from a
     memory map into the noop write: what Spark's Python data source costs with no work per
     row. What kafkakv takes beyond it is its own.

3. ``stream`` (run before ``read``, which flushes the map): the map's N changes from its
   first op (``startingOffsets`` the cursor ``0:0,1:0``), ``readStream.format("kafkakv")``
   into Parquet files with ``trigger(availableNow=True)``, on a fresh copy of the ingested
   directory every run. Baseline: the same rows (the Parquet the first stream wrote) through
   Spark's own Parquet file stream into Parquet, with the same trigger. The time is the whole
   query's, from ``start()`` to its end; beside it, the time its micro-batches took by Spark's
   progress reports (``triggerExecution``): what a query that runs on pays per change, without
   the start of the query (for a Python source, Spark starts a Python process that imports
   PySpark and the source's modules).

Every figure is the median of ``--repeat`` runs (default 3) after one discarded warm-up run;
kafkakv's runs and the baselines' alternate. Rows/s is N over the median. The ratio is
kafkakv's median over the baseline's (1.0: as fast as plain Spark). Next to each median, the
CPU seconds of every process of the run (the JVM, the Python workers, PostgreSQL, this driver),
as medians over the runs, from ``/proc``: they say which process the time went to.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from _common import machine
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

import kafkakv
from kafkakv.dev.postgres import EmbeddedPostgres
from kafkakv.pipeline import (
    IngestJob,
    PostgresConnection,
    SourceOptions,
    TableMapping,
    TableSource,
    spark_session,
)
from kafkakv.pipeline.jdbc_driver import postgres_jdbc_jar

TABLE = "terminal_acquirer"
MAP = "terminals"
PARTITIONS = 2
MAPPING = TableMapping(key="terminal_id", camel_case=True, active_column="is_active")


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# -- CPU of every process of the run ----------------------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK")


def _proc_table() -> dict[int, tuple[int, str, float]]:
    """pid -> (ppid, comm, CPU seconds including reaped children)."""
    out: dict[int, tuple[int, str, float]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                text = f.read()
        except OSError:
            continue
        comm = text[text.index("(") + 1 : text.rindex(")")]
        fields = text[text.rindex(")") + 2 :].split()
        ticks = sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
        out[int(name)] = (int(fields[1]), comm, ticks / _TICK)
    return out


def process_cpu() -> dict[str, float]:
    """CPU seconds so far of this process and its descendants, by kind: ``driver`` (this
    process), ``jvm``, ``python workers``, ``postgres`` and ``other``."""
    table = _proc_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _c, _t) in table.items():
        children.setdefault(ppid, []).append(pid)
    me = os.getpid()
    totals = {"driver": 0.0, "jvm": 0.0, "python workers": 0.0, "postgres": 0.0, "other": 0.0}
    stack = [me]
    while stack:
        pid = stack.pop()
        stack.extend(children.get(pid, ()))
        _ppid, comm, cpu = table[pid]
        if pid == me:
            kind = "driver"
        elif comm == "java":
            kind = "jvm"
        elif comm.startswith("python") or comm.startswith("pyspark"):
            kind = "python workers"
        elif comm.startswith("postgres"):
            kind = "postgres"
        else:
            kind = "other"
        totals[kind] += cpu
    return totals


class Series:
    """The runs of one measurement: wall seconds and CPU seconds by process kind."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.walls: list[float] = []
        self.cpus: list[dict[str, float]] = []

    def run(self, fn: Callable[[], Any], keep: bool = True) -> Any:
        gc.collect()
        before = process_cpu()
        t = time.perf_counter()
        result = fn()
        wall = time.perf_counter() - t
        after = process_cpu()
        if keep:
            self.walls.append(wall)
            self.cpus.append({k: after[k] - before[k] for k in after})
        return result

    def median(self) -> float:
        return statistics.median(self.walls)

    def cpu(self) -> dict[str, float]:
        return {k: round(statistics.median(c[k] for c in self.cpus), 2) for k in self.cpus[0]}

    def summary(self, rows: int) -> dict[str, Any]:
        m = self.median()
        return {
            "median_s": round(m, 3),
            "min_s": round(min(self.walls), 3),
            "max_s": round(max(self.walls), 3),
            "rows_per_s": round(rows / m),
            "cpu_s": self.cpu(),
            "runs": len(self.walls),
        }


def report(series: Series, rows: int, baseline: Series | None = None) -> None:
    m = series.median()
    cpu = ", ".join(f"{k} {v:.1f}" for k, v in series.cpu().items() if v >= 0.05)
    line = (
        f"{series.name:38} {m:7.2f} s (min {min(series.walls):.2f}, max {max(series.walls):.2f})"
        f" {rows / m:>10,.0f} rows/s | CPU s: {cpu}"
    )
    if baseline is not None:
        line += f" | {m / baseline.median():.2f}x {baseline.name}"
    print(line, flush=True)


# -- the table ---------------------------------------------------------------------------------


def create_table(connection: PostgresConnection, rows: int) -> None:
    with connection.connect(autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {TABLE}")
        conn.execute(
            f"""CREATE TABLE {TABLE} (
                id bigserial PRIMARY KEY,
                terminal_id text NOT NULL UNIQUE,
                acquirer_id text NOT NULL,
                merchant_name text,
                mcc int,
                country text,
                is_active boolean NOT NULL DEFAULT true,
                updated_at timestamptz NOT NULL)"""
        )
        conn.execute(
            f"""INSERT INTO {TABLE}
                  (terminal_id, acquirer_id, merchant_name, mcc, country, is_active, updated_at)
                SELECT 'T' || lpad(g::text, 8, '0'),
                       'A' || lpad((g %% 97)::text, 3, '0'),
                       'Merchant ' || g || ' ' || md5(g::text),
                       5000 + g %% 1000,
                       (ARRAY['FR', 'DE', 'ES', 'IT', 'NL'])[1 + g %% 5],
                       true,
                       timestamptz '2024-01-01 00:00:00+00' + g * interval '1 millisecond'
                FROM generate_series(1, %s) AS g""",
            (rows,),
        )
        conn.execute(f"CREATE INDEX ON {TABLE} (updated_at, id)")
        conn.execute(f"ANALYZE {TABLE}")


# -- ingest ------------------------------------------------------------------------------------


def ingest(spark: Any, source: TableSource, target: str, rows: int) -> None:
    result = IngestJob(
        spark,
        source,
        SourceOptions(target, map=MAP),
        MAPPING,
        timestamp_column="updated_at",
        id_column="id",
        partitions=PARTITIONS,
    ).run()
    if result.rows != rows:
        raise RuntimeError(f"the ingest read {result.rows} rows, not {rows}")


def split_read(spark: Any, source: TableSource, rows: int) -> Any:
    """The table through Spark's JDBC source in as many tasks as the ingest uses."""
    conn = source.connection
    reader = spark.read.format("jdbc").option("url", conn.jdbc_url)
    for key, value in conn.jdbc_properties.items():
        reader = reader.option(key, value)
    return (
        reader.option("dbtable", TABLE)
        .option("fetchsize", str(source.fetch_size))
        .option("partitionColumn", "id")
        .option("lowerBound", "1")
        .option("upperBound", str(rows + 1))
        .option("numPartitions", str(spark.sparkContext.defaultParallelism))
        .load()
    )


def bench_ingest(
    spark: Any, source: TableSource, root: str, rows: int, repeat: int
) -> tuple[dict[str, Any], str]:
    """Returns the results and the log directory of the last ingest."""
    counter = iter(range(1_000_000))

    def fresh(kind: str) -> str:
        return os.path.join(root, f"{kind}-{next(counter)}")

    last_log: list[str] = []

    def run_ingest() -> None:
        for old in last_log:
            shutil.rmtree(old, ignore_errors=True)
        last_log.clear()
        path = fresh("log")
        last_log.append(path)
        ingest(spark, source, path, rows)

    def parquet(make_df: Callable[[], Any]) -> Callable[[], None]:
        def write() -> None:
            path = fresh("parquet")
            try:
                make_df().write.parquet(path)
            finally:
                shutil.rmtree(path, ignore_errors=True)

        return write

    def mapped(df: Any) -> Any:
        return MAPPING.apply(df).select("key", "value")

    ours = Series("kafkakv IngestJob.run")
    bases = [
        (
            Series("jdbc+map -> parquet (2 tasks)"),
            parquet(lambda: mapped(split_read(spark, source, rows))),
        ),
        (Series("jdbc+map -> parquet (1 task)"), parquet(lambda: mapped(source.read_all(spark)))),
        (Series("jdbc -> parquet (1 task)"), parquet(lambda: source.read_all(spark))),
    ]
    for i in range(repeat + 1):
        keep = i > 0  # the first round is the warm-up
        ours.run(run_ingest, keep)
        for series, fn in bases:
            series.run(fn, keep)
        print(
            f"  ingest round {i} {'(warm-up) ' if not keep else ''}done, load {load()}", flush=True
        )
    report(ours, rows, bases[0][0])
    for series, _fn in bases:
        report(series, rows)
    results = {"kafkakv": ours.summary(rows)}
    for series, _fn in bases:
        results[series.name] = series.summary(rows)
        results[series.name]["ratio"] = round(ours.median() / series.median(), 2)
    return results, last_log[0]


# -- snapshot read -----------------------------------------------------------------------------


def read_map(spark: Any, target: str) -> Any:
    return (spark.read.format("kafkakv").option("target", target).option("map", MAP).load()).select(
        "key", "value"
    )


def noop(df: Any) -> None:
    df.write.format("noop").mode("overwrite").save()


class ReadyArrow(DataSource):
    """The floor of any Python data source: one task per Arrow IPC file of ``path`` (option),
    each yielding the file's record batches from a memory map, no work per row. (Pickled by
    value with the rest of ``__main__``: the workers need not import this script.)"""

    @classmethod
    def name(cls) -> str:
        return "bench_ready_arrow"

    def schema(self) -> str:
        return "key string, value string"

    def reader(self, schema: Any) -> DataSourceReader:
        return _ReadyArrowReader(self.options["path"])


class _ReadyArrowReader(DataSourceReader):
    def __init__(self, path: str) -> None:
        self.path = path

    def partitions(self) -> list[InputPartition]:
        files = sorted(f for f in os.listdir(self.path) if f.endswith(".arrow"))
        return [InputPartition(os.path.join(self.path, f)) for f in files]

    def read(self, partition: InputPartition) -> Any:
        import pyarrow as pa

        with pa.memory_map(partition.value) as source:
            reader = pa.ipc.open_file(source)
            for i in range(reader.num_record_batches):
                yield reader.get_batch(i)


def ready_arrow_files(parquet_path: str, path: str, parts: int) -> None:
    """The rows of ``parquet_path`` as ``parts`` Arrow IPC files of equal rows in ``path``,
    in batches of the data source's size (kafkakv.pipeline.source.BATCH_ROWS)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from kafkakv.pipeline.source import BATCH_ROWS

    table = pq.read_table(parquet_path, columns=["key", "value"])
    os.makedirs(path, exist_ok=True)
    share = -(-table.num_rows // parts)
    for i in range(parts):
        piece = table.slice(i * share, share).combine_chunks()
        with pa.ipc.new_file(os.path.join(path, f"part-{i}.arrow"), piece.schema) as out:
            for batch in piece.to_batches(max_chunksize=BATCH_ROWS):
                out.write_batch(batch)


def read_unflushed(spark: Any, target: str) -> None:
    noop(read_map(spark, target))


def end_offsets(target: str) -> dict[str, list[int]]:
    with kafkakv.connect(target) as db:
        log = db.log
        return {
            t: [log.end_offset(t, p) for p in range(log.partitions(t))]
            for t in sorted(log.topics())
            if t.startswith(MAP)
        }


def bench_read(spark: Any, root: str, pristine: str, rows: int, repeat: int) -> dict[str, Any]:
    print(f"  topics after the ingest: {end_offsets(pristine)}", flush=True)
    counter = iter(range(1_000_000))
    copies: list[str] = []

    def unflushed_copy() -> str:
        for old in copies:
            shutil.rmtree(old, ignore_errors=True)
        copies.clear()
        path = os.path.join(root, f"copy-{next(counter)}")
        shutil.copytree(pristine, path)
        copies.append(path)
        return path

    # unflushed: a fresh copy for every run (copying is outside the timed part)
    unflushed = Series("kafkakv read, unflushed -> noop")
    for i in range(repeat + 1):
        path = unflushed_copy()
        unflushed.run(functools.partial(read_unflushed, spark, path), keep=i > 0)
    print(f"  topics after an unflushed read: {end_offsets(copies[0])}", flush=True)
    for old in copies:
        shutil.rmtree(old, ignore_errors=True)

    # flush the map once
    flushed_dir = pristine
    t = time.perf_counter()
    with kafkakv.connect(flushed_dir) as db:
        m = db.map(MAP)
        opened = time.perf_counter() - t
        if len(m) != rows:
            raise RuntimeError(f"the map holds {len(m)} keys, not {rows}")
        m.flush()
    flush_s = time.perf_counter() - t
    print(
        f"  opening the map (bootstrap of {rows} ops): {opened:.2f} s; with flush(): "
        f"{flush_s:.2f} s; topics now: {end_offsets(flushed_dir)}",
        flush=True,
    )

    parquet_path = os.path.join(root, "snapshot.parquet")
    read_map(spark, flushed_dir).write.parquet(parquet_path)
    count = spark.read.parquet(parquet_path).count()
    if count != rows:
        raise RuntimeError(f"the Parquet copy holds {count} rows, not {rows}")

    ready_path = os.path.join(root, "ready-arrow")
    ready_arrow_files(parquet_path, ready_path, PARTITIONS)
    spark.dataSource.register(ReadyArrow)

    flushed = Series("kafkakv read, flushed -> noop")
    ready = Series("ready Arrow (floor) -> noop")
    flushed_count = Series("kafkakv read, flushed -> count()")
    base = Series("parquet read -> noop")
    base_count = Series("parquet read -> count()")
    counts: list[int] = []
    for i in range(repeat + 1):
        keep = i > 0
        flushed.run(lambda: noop(read_map(spark, flushed_dir)), keep)
        base.run(lambda: noop(spark.read.parquet(parquet_path)), keep)
        ready.run(lambda: noop(spark.read.format("bench_ready_arrow").load(path=ready_path)), keep)
        counts.append(flushed_count.run(lambda: read_map(spark, flushed_dir).count(), keep))
        base_count.run(lambda: spark.read.parquet(parquet_path).count(), keep)
    if set(counts) != {rows}:
        raise RuntimeError(f"count() of the map gave {counts}, not {rows}")
    report(flushed, rows, base)
    report(unflushed, rows, base)
    report(flushed_count, rows, base)
    report(ready, rows, base)
    report(base, rows)
    report(base_count, rows)
    results: dict[str, Any] = {"flush_s": round(flush_s, 2), "open_s": round(opened, 2)}
    for series in (flushed, unflushed, flushed_count, ready, base, base_count):
        results[series.name] = series.summary(rows)
    for series in (flushed, unflushed, flushed_count, ready):
        results[series.name]["ratio"] = round(series.median() / base.median(), 2)
    return results


# -- streaming ---------------------------------------------------------------------------------


def stream_into_parquet(df: Any, sink: str, checkpoint: str) -> float:
    """Run a query from ``df`` into Parquet files in ``sink`` until its source is drained
    (``availableNow``: micro-batches of what the source holds when it starts); return the
    seconds its micro-batches took, by Spark's progress reports (``triggerExecution``)."""
    query = (
        df.writeStream.format("parquet")
        .option("path", sink)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(f"the query failed: {query.exception()}")
    return float(sum(p["durationMs"]["triggerExecution"] for p in query.recentProgress)) / 1000


def bench_stream(spark: Any, root: str, pristine: str, rows: int, repeat: int) -> dict[str, Any]:
    """The map's changes from its first op into Parquet, next to Spark's own Parquet file
    stream of the same rows into Parquet. Each kafkakv run reads a fresh copy of the ingested
    (unflushed) log: its read tasks open replicas, whose flusher may write the data topic."""
    counter = iter(range(1_000_000))
    start = ",".join(f"{p}:0" for p in range(PARTITIONS))  # a cursor: every change from op 0
    leftovers: list[str] = []

    def fresh(kind: str) -> str:
        path = os.path.join(root, f"{kind}-{next(counter)}")
        leftovers.append(path)
        return path

    def clean() -> None:
        for old in leftovers:
            shutil.rmtree(old, ignore_errors=True)
        leftovers.clear()

    def changes(target: str) -> Any:
        return (
            spark.readStream.format("kafkakv")
            .options(target=target, map=MAP, startingOffsets=start)
            .load()
        )

    first = fresh("stream-copy")
    shutil.copytree(pristine, first)
    streamed = os.path.join(root, "streamed.parquet")
    stream_into_parquet(changes(first), streamed, fresh("checkpoint"))
    schema = spark.read.parquet(streamed).schema
    count = spark.read.parquet(streamed).count()
    if count != rows:
        raise RuntimeError(f"the stream gave {count} changes, not {rows}")
    clean()

    ours = Series("kafkakv readStream -> parquet")
    base = Series("parquet readStream -> parquet")
    batches: dict[str, list[float]] = {ours.name: [], base.name: []}
    for i in range(repeat + 1):
        keep = i > 0
        copy = fresh("stream-copy")
        shutil.copytree(pristine, copy)  # not timed
        sinks = [(fresh("sink"), fresh("cp")) for _ in range(2)]
        took = ours.run(functools.partial(stream_into_parquet, changes(copy), *sinks[0]), keep)
        files = spark.readStream.schema(schema).parquet(streamed)
        took_base = base.run(functools.partial(stream_into_parquet, files, *sinks[1]), keep)
        if keep:
            batches[ours.name].append(took)
            batches[base.name].append(took_base)
        clean()
        print(f"  stream round {i} {'(warm-up) ' if not keep else ''}done, load {load()}")
    report(ours, rows, base)
    report(base, rows)
    results = {ours.name: ours.summary(rows), base.name: base.summary(rows)}
    results[ours.name]["ratio"] = round(ours.median() / base.median(), 2)
    for name, took_s in batches.items():  # the query's start excluded: Spark's own count
        median = statistics.median(took_s)
        results[name]["batches_s"] = round(median, 3)
        results[name]["batch_rows_per_s"] = round(rows / median)
        print(f"  {name}: micro-batches {median:.2f} s, {rows / median:,.0f} rows/s")
    return results


# -- main --------------------------------------------------------------------------------------


def markdown(results: dict[str, Any]) -> None:
    """The results as the markdown table of docs/benchmarks.md."""
    print("\n| measurement | median (min-max) | rows/s | CPU s (JVM / Python workers) | ratio |")
    print("| --- | --- | --- | --- | --- |")
    parts = (
        ("ingest", None),
        ("read", "parquet read -> noop"),
        ("stream", "parquet readStream -> parquet"),
    )
    for part, baseline in parts:
        for name, r in results.get(part, {}).items():
            if not isinstance(r, dict):
                continue
            label = "kafkakv IngestJob.run" if name == "kafkakv" else name
            if part == "ingest" and name == "kafkakv":
                fair = results["ingest"]["jdbc+map -> parquet (2 tasks)"]
                ratio = f"{fair['ratio']:.2f}x jdbc+map -> parquet (2 tasks)"
            elif part == "ingest":
                ratio = f"(baseline; kafkakv is {r['ratio']:.2f}x this)"
            elif "ratio" in r:
                ratio = f"{r['ratio']:.2f}x {baseline}"
            else:
                ratio = "(baseline)"
            cpu = r["cpu_s"]
            print(
                f"| {label} | {r['median_s']:.2f} s ({r['min_s']:.2f}-{r['max_s']:.2f}) "
                f"| {r['rows_per_s']:,} | {cpu['jvm']:.1f} / {cpu['python workers']:.1f} "
                f"| {ratio} |"
            )
    print()


def versions(spark: Any) -> str:
    import pyarrow

    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr
    java_line = java.splitlines()[0] if java else "unknown"
    return (
        f"Python {platform.python_version()}, Spark {spark.version}, pyarrow "
        f"{pyarrow.__version__}, {java_line}"
    )


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", default="ingest,read,stream")
    parser.add_argument("--dir", default=None, help="where the logs, Parquet and PostgreSQL go")
    args = parser.parse_args()
    names = {n.strip() for n in args.only.split(",") if n.strip()}
    if not names or names - {"ingest", "read", "stream"}:
        parser.error("--only takes names from ingest,read,stream")
    signal.signal(signal.SIGTERM, _exit_on_signal)
    print(machine())
    before = load()
    print(f"load average before: {before}", flush=True)
    root = tempfile.mkdtemp(prefix="kafkakv-bench-pipeline-", dir=args.dir)
    results: dict[str, Any] = {}
    began = time.monotonic()
    pg = EmbeddedPostgres(os.path.join(root, "postgres"))
    try:
        connection = pg.start()
        t = time.perf_counter()
        create_table(connection, args.rows)
        print(f"table {TABLE}: {args.rows:,} rows in {time.perf_counter() - t:.1f} s", flush=True)
        t = time.perf_counter()
        spark = spark_session(
            app_name="kafkakv-bench",
            jars=[postgres_jdbc_jar()],
            config={"spark.ui.showConsoleProgress": "false"},
        )
        print(f"Spark session in {time.perf_counter() - t:.1f} s; {versions(spark)}", flush=True)
        source = TableSource(connection, TABLE)
        if "ingest" in names:
            results["ingest"], log_dir = bench_ingest(spark, source, root, args.rows, args.repeat)
        else:
            log_dir = os.path.join(root, "log")
            ingest(spark, source, log_dir, args.rows)
        if "stream" in names:  # before the read, which flushes the map
            results["stream"] = bench_stream(spark, root, log_dir, args.rows, args.repeat)
        if "read" in names:
            results["read"] = bench_read(spark, root, log_dir, args.rows, args.repeat)
        spark.stop()
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        pg.close()
        shutil.rmtree(root, ignore_errors=True)
    markdown(results)
    after = load()
    print(f"load average after: {after}; {time.monotonic() - began:.1f} s in all")
    print(
        json.dumps(
            {
                "machine": machine(),
                "rows": args.rows,
                "repeat": args.repeat,
                "load_before": before,
                "load_after": after,
                **results,
            }
        )
    )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
