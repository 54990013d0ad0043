"""The pipeline on a Spark standalone cluster: a master and two workers, each with its own
executor JVM and Python workers, sharing nothing with the driver but the log and PostgreSQL.

A process runs one Spark context, and this one's is the ``spark`` fixture's (local): the
driver of the cluster's application is a child process (``_DRIVER``), which runs the steps of
a plan one after another (on the plan's target, or a step's own), each as a Spark job group of
its name (a streaming query's
micro-batches run in a group Spark names by the query's run id, which its step returns), and
prints what they found and Spark's own REST status of its executors and jobs as one
``RESULT`` JSON line. The fault tests kill executors' processes from here while the driver
runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

import kafkakv
from kafkakv.db import Database
from kafkakv.dev.process import live_args
from kafkakv.pipeline import PostgresConnection, SourceOptions
from kafkakv.pipeline.jdbc_driver import postgres_jdbc_jar
from tests.pipeline_fixtures import terminal_table
from tests.waiting import wait_for

_DRIVER = textwrap.dedent(
    """
    import dataclasses, json, sys, time, urllib.request
    from pyspark.sql import functions as F
    import kafkakv
    from kafkakv.pipeline import (
        IngestJob, PostgresConnection, SourceOptions, TableMapping, TableSource, reconcile,
        snapshot, spark_session)

    plan = json.loads(sys.argv[1])
    target = plan["target"]
    config = {**plan["config"], "spark.ui.enabled": "true", "spark.ui.port": "0",
              "spark.ui.showConsoleProgress": "false"}
    spark = spark_session(master=plan["master"], app_name="kafkakv-cluster-test",
                          jars=plan.get("jars", []), config=config)
    sc = spark.sparkContext
    print(f"APP {sc.applicationId}", flush=True)
    pg = PostgresConnection(**plan["postgres"]) if "postgres" in plan else None
    mapping = TableMapping(key="terminal_id", camel_case=True, active_column="is_active")

    def write_range(step):
        df = spark.range(0, step["rows"], numPartitions=4).select(
            F.concat(F.lit("k"), F.col("id").cast("string")).alias("key"),
            F.to_json(F.struct(F.col("id").alias("n"))).alias("value"))
        df.write.format("kafkakv").options(
            target=step.get("target", target), map=step["map"]).mode("append").save()

    def read(step):
        return spark.read.format("kafkakv").options(
            target=step.get("target", target), map=step["map"]).load().count()

    def imports(step):
        return sc.parallelize(range(4), 4).map(
            lambda _: __import__("kafkakv").__file__).distinct().collect()

    def sql(step):
        with pg.connect() as conn:
            for statement in step["statements"]:
                conn.execute(statement)

    def ingest(step):
        result = IngestJob(spark, TableSource(pg, plan["table"]),
                           SourceOptions(target, map=step["map"]), mapping,
                           timestamp_column="updated_at", id_column="id",
                           partitions=step.get("partitions")).run()
        return {"rows": result.rows, "deletes": result.deletes}

    def copy(step):
        with kafkakv.connect(target) as db:
            db.map(step["to"], partitions=step["partitions"])
        rows = spark.read.format("kafkakv").options(target=target, map=step["map"]).load()
        rows.select("key", "value").write.format("kafkakv").options(
            target=target, map=step["to"]).mode("append").save()

    def export(step):
        return snapshot(spark, SourceOptions(target, map=step["map"]), step["path"]).rows

    def compare(step):
        report = reconcile(spark, TableSource(pg, plan["table"]), mapping,
                           SourceOptions(target, map=step["map"]))
        return dataclasses.asdict(report)

    def put(step):
        with kafkakv.connect(target) as db:
            m = db.map(step["map"], partitions=step.get("partitions"))
            m.update(step.get("update", {}))
            for key, value in step.get("changes", []):  # in order: null removes the key
                if value is None:
                    del m[key]
                else:
                    m[key] = value

    def stream(step):
        with kafkakv.connect(target) as db:  # a sink map must exist
            db.map(step["to"], partitions=step["partitions"]).close()
        changes = spark.readStream.format("kafkakv").options(
            target=target, map=step["map"], startingOffsets="earliest").load()
        out = changes.where(F.col("key") != step["skip"]).select(
            "key", (F.col("new").cast("int") * 2).cast("string").alias("value"))
        query = out.writeStream.format("kafkakv").options(target=target, map=step["to"]).option(
            "checkpointLocation", step["checkpoint"]).trigger(availableNow=True).start()
        query.awaitTermination()  # raises what failed the query
        return {"run": str(query.runId),
                "batches": [[p.batchId, p.numInputRows] for p in query.recentProgress]}

    steps = {"write_range": write_range, "read": read, "imports": imports, "sql": sql,
             "ingest": ingest, "copy": copy, "snapshot": export, "reconcile": compare,
             "put": put, "stream": stream}
    found, seconds = {}, {}
    for step in plan["steps"]:
        sc.setJobGroup(step["name"], step["do"])
        started = time.monotonic()
        found[step["name"]] = steps[step["do"]](step)
        seconds[step["name"]] = round(time.monotonic() - started, 1)
        print(f"DONE {step['name']} {seconds[step['name']]} s", flush=True)

    def status(what):
        url = f"{sc.uiWebUrl}/api/v1/applications/{sc.applicationId}/{what}"
        with urllib.request.urlopen(url, timeout=30) as response:
            return json.load(response)

    executors = {e["id"]: {"tasks": e["totalTasks"], "failed": e["failedTasks"],
                           "active": e["isActive"], "host": e["hostPort"]}
                 for e in status("allexecutors")}
    jobs = {}
    for job in status("jobs"):
        group = jobs.setdefault(job.get("jobGroup"), {"tasks": 0, "failed": 0, "jobs": 0})
        group["tasks"] += job["numCompletedTasks"]
        group["failed"] += job["numFailedTasks"]
        group["jobs"] += 1
    print("RESULT " + json.dumps(
        {"steps": found, "seconds": seconds, "executors": executors, "jobs": jobs}), flush=True)
    spark.stop()
    """
)

_EXECUTOR_MAIN = b"org.apache.spark.executor.CoarseGrainedExecutorBackend"


@dataclass(frozen=True)
class _App:
    """The application a child driver runs: its id and the driver."""

    id: str
    driver: subprocess.Popen[str]
    log: Path  # Spark's log: the driver's stderr

    def executor_jvms(self) -> dict[str, int]:
        """Executor id -> pid of the application's live executor JVMs on this machine."""
        found = {}
        for pid in _pids():
            args = live_args(pid)
            if args and _EXECUTOR_MAIN in args and self.id.encode() in args:
                found[args[args.index(b"--executor-id") + 1].decode()] = pid
        return found


def _run_driver(
    cluster: Any,
    plan: dict[str, Any],
    log: Path,
    meanwhile: Callable[[_App], None] = lambda _app: None,
) -> dict[str, Any]:
    """Run ``plan`` on ``cluster`` in a child driver (its stderr, Spark's log, into ``log``);
    call ``meanwhile`` with the application once it runs; return the driver's RESULT."""
    config = {**cluster.app_config(), **plan.get("config", {})}
    plan = {**plan, "master": cluster.master_url, "config": config}
    with (
        log.open("w") as err,
        subprocess.Popen(
            [sys.executable, "-c", _DRIVER, json.dumps(plan)],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        ) as driver,
    ):
        assert driver.stdout is not None
        try:
            lines = []
            for line in driver.stdout:  # the driver prints little: its APP, DONE and RESULT
                lines.append(line)
                if line.startswith("APP "):
                    meanwhile(_App(line.split()[1], driver, log))
            driver.wait(timeout=60)
        finally:
            if driver.poll() is None:
                driver.kill()
    results = [line for line in lines if line.startswith("RESULT ")]
    assert results, f"the driver printed {lines}; its log ends:\n{log.read_text()[-4000:]}"
    result: dict[str, Any] = json.loads(results[-1].removeprefix("RESULT "))
    return result


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _children(pid: int) -> list[int]:
    """The live child processes of ``pid`` (from /proc/<child>/stat's ppid)."""
    found = []
    for child in _pids():
        try:
            stat = Path(f"/proc/{child}/stat").read_bytes()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if int(fields[1]) == pid and fields[0] != b"Z":
            found.append(child)
    return found


def _python_workers(executor: int) -> list[int]:
    """The Python workers of the executor JVM ``executor``: the children of its
    ``pyspark.daemon`` (each forked for a task, and kept for the next)."""
    daemons = [c for c in _children(executor) if b"pyspark.daemon" in (live_args(c) or [])]
    return [worker for daemon in daemons for worker in _children(daemon)]


def _cpu_ticks(pid: int) -> int | None:
    """The CPU time ``pid`` has used (utime + stime, in clock ticks); None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()
    return int(fields[11]) + int(fields[12])


def _working(pids: list[int], window: float = 0.2) -> list[int]:
    """Those of ``pids`` that used CPU during the next ``window`` seconds: a Python worker
    running a task, not one idle between tasks (Spark keeps a worker for the next task)."""
    before = {pid: _cpu_ticks(pid) for pid in pids}
    time.sleep(window)  # the span the CPU time is compared over
    found = []
    for pid, then in before.items():
        now = _cpu_ticks(pid)
        if then is not None and now is not None and now > then:
            found.append(pid)
    return found


def _ops_records(db: Database, ops: str) -> int:
    """How many records the ops topic ``ops`` holds (0 before it exists)."""
    if ops not in db.log.topics():
        return 0
    return sum(db.log.end_offset(ops, p) for p in range(db.log.partitions(ops)))


def _lost_tasks(log: Path) -> int:
    """How many task failures the driver's log (Spark's, on its stderr) reports so far."""
    return log.read_text(errors="replace").count("Lost task")


def _kill_while_appending(
    app: _App, db: Database, ops: str, rows: int, what: str
) -> tuple[str, int]:
    """Kill -9 a part of the executors while a task of an ingest of ``rows`` runs, until
    Spark's log reports a lost task; return the executor's id and the records the ops topic
    ``ops`` held at the kill.

    A Python worker that used CPU just now runs a task (or has just ended one): ``jvm`` kills
    the executor of such a worker, ``python`` every executor's Python workers, the busy ones
    among them. The busy workers are stopped (SIGSTOP) first, while the count of records is
    asked (a round trip to the brokers, slow under load) and the kill is made, then continued:
    without, the task ended meanwhile under ``stress-ng`` and its idle worker died for
    nothing. (Nor is a count that is no multiple of a task's share a sign of a task under
    way: a task reads and maps for most of its time, then appends in a few batches.) A kill
    that still comes too late fails no task: another follows a second later, not after a wait
    for the log (under load the ingest had ended by then), up to :data:`_KILLS`, until the
    log says a task was lost. Only once this ingest has appended: the steps run one after
    another, so its first records say the job before it, whose tasks a kill would fail
    instead and whose lost tasks would count, is over.
    (Spark's REST status, which says which executor runs a task, answers too late
    under load: by then the job has ended.)
    """
    log = app.log

    def targets() -> tuple[dict[str, list[int]], list[int]]:
        """Per executor, what a kill takes; and the Python workers running a task."""
        found, busy = {}, []
        for executor, jvm in app.executor_jvms().items():
            workers = _python_workers(jvm)
            working = _working(workers)
            busy += working
            if what == "python" and workers:
                found[executor] = workers
            elif what == "jvm" and working:
                found[executor] = [jvm]
        return found, busy

    def signal_all(pids: list[int], signum: signal.Signals) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    def kill_busy() -> tuple[str, int] | None:
        """One kill where a worker is busy: the executor's id and the records then."""
        found, busy = targets()
        if not found or not busy:
            return None
        # Held where they are: a busy worker stopped now cannot end its task while the count
        # is asked (a round trip to the brokers, slow under load) and the kill is made.
        signal_all(busy, signal.SIGSTOP)
        try:
            appended = _ops_records(db, ops)
            assert appended < rows, "the ingest appended every row before a kill failed a task"
            chosen = sorted(found) if what == "python" else [min(found)]
            signal_all([pid for executor in chosen for pid in found[executor]], signal.SIGKILL)
        finally:
            signal_all(busy, signal.SIGCONT)  # the killed ones' too: none is left stopped
        return chosen[0], appended

    def this_ingest_appends() -> bool:
        assert app.driver.poll() is None, "the driver exited"
        return _ops_records(db, ops) > 0

    wait_for(this_ingest_appends, 180, f"the ingest appending to {ops}")
    lost = _lost_tasks(log)  # the job before is over: its lost tasks are all in the log
    first: tuple[str, int] | None = None
    kills, next_kill, deadline = 0, 0.0, time.monotonic() + 180
    while _lost_tasks(log) <= lost:  # a kill that came too late is followed by another
        assert app.driver.poll() is None, "the driver exited"
        assert time.monotonic() < deadline, f"no kill failed a task appending to {ops} in 180 s"
        if kills < _KILLS and time.monotonic() >= next_kill and (done := kill_busy()):
            first, kills, next_kill = first or done, kills + 1, time.monotonic() + 1
        time.sleep(0.02)
    assert first is not None, "a task was lost before any kill"
    return first


_KILLS = 3
"""The most kills one fault makes, a second apart, until a task is lost: fewer than Spark's
``spark.task.maxFailures`` (4), so that the job survives kills of one task's every retry."""


def _check_only_executors_ran_tasks(result: dict[str, Any], tasks: int) -> dict[str, Any]:
    """Spark's own status: every task ran on the workers' executors, none on the driver.
    Returns the workers' executors."""
    executors = result["executors"]
    assert executors["driver"]["tasks"] == 0, executors
    workers = {name: e for name, e in executors.items() if name != "driver"}
    assert {e["host"].rsplit(":", 1)[0] for e in workers.values()} == {"127.0.0.1"}
    assert sum(e["tasks"] for e in workers.values()) >= tasks, executors
    return workers


def _changes(table: str) -> list[str]:
    """Statements that change three rows: one updated, one deactivated, one new (T9999)."""
    now = "now() - interval '1 s'"
    return [
        f"UPDATE {table} SET acquirer_id = 'NEW', updated_at = {now} WHERE terminal_id = 'T1'",
        f"UPDATE {table} SET is_active = false, updated_at = {now} WHERE terminal_id = 'T2'",
        f"INSERT INTO {table} (terminal_id, acquirer_id, updated_at) VALUES ('T9999', 'A9', {now})",
    ]


def _stream_steps(
    a: str, b: str, checkpoint: Path
) -> tuple[list[dict[str, Any]], dict[str, int], dict[str, int]]:
    """Steps that put keys in map ``a``, stream ``a`` into ``b`` (:func:`_transformed`), change
    ``a`` (a key changed twice, a removal, a new key, the left-out key) and restart the
    stream from its checkpoint; and ``a``'s contents at the first run and after the last."""
    first = {f"k{i}": i for i in range(200)} | {"skip": 1}
    changes: list[tuple[str, int | None]] = [
        ("k2", 20),
        ("k2", 21),
        ("k3", None),
        ("k200", 200),
        ("skip", 2),
    ]
    stream: dict[str, Any] = {"do": "stream", "map": a, "to": b, "partitions": 3, "skip": "skip"}
    steps: list[dict[str, Any]] = [
        {"name": "put", "do": "put", "map": a, "partitions": 2, "update": first},
        {"name": "stream", **stream, "checkpoint": str(checkpoint)},
        {"name": "change-a", "do": "put", "map": a, "changes": changes},
        {"name": "restart", **stream, "checkpoint": str(checkpoint)},
    ]
    final = dict(first)
    for key, value in changes:
        if value is None:
            del final[key]
        else:
            final[key] = value
    return steps, first, final


def _transformed(a: dict[str, Any]) -> dict[str, Any]:
    """What the stream step makes of map contents ``a``: each value doubled, key ``skip``
    left out."""
    return {k: v * 2 for k, v in a.items() if k != "skip"}


@pytest.mark.timeout(600)
def test_the_pipeline_runs_on_the_cluster_executors_against_kafka_and_the_embedded_log(
    spark_cluster: Any, kafka_cluster: Any, postgres: PostgresConnection, tmp_path: Path
) -> None:
    """One application (its executors start once): the data source's write and read on an
    embedded log, then ingest, incremental ingest, the data source, snapshot, reconcile and a
    stream on Kafka."""
    embedded = str(tmp_path / "log")
    with kafkakv.connect(embedded) as db:
        db.map("m", partitions=2)
    rows = 2000
    table = terminal_table(postgres, rows)
    target = f"kafka://{kafka_cluster.bootstrap}"
    name = f"cluster-{uuid.uuid4().hex[:10]}"
    copy = f"{name}-copy"
    checkpoint = tmp_path / "checkpoint"
    streamed, first, final = _stream_steps(f"{name}-a", f"{name}-b", checkpoint)
    plan: dict[str, Any] = {
        "target": target,
        "table": table,
        "postgres": dataclasses.asdict(postgres),
        "jars": [str(postgres_jdbc_jar())],
        "steps": [
            {
                "name": "write-embedded",
                "do": "write_range",
                "map": "m",
                "rows": 1000,
                "target": embedded,
            },
            {"name": "read-embedded", "do": "read", "map": "m", "target": embedded},
            {"name": "imports", "do": "imports"},
            {"name": "ingest", "do": "ingest", "map": name, "partitions": 2},
            {"name": "change", "do": "sql", "statements": _changes(table)},
            {"name": "incremental", "do": "ingest", "map": name},
            {"name": "copy", "do": "copy", "map": name, "to": copy, "partitions": 3},
            {"name": "read", "do": "read", "map": copy},
            {"name": "snapshot", "do": "snapshot", "map": name, "path": str(tmp_path / "snap")},
            {"name": "reconcile", "do": "reconcile", "map": name},
            *streamed,
        ],
    }
    result = _run_driver(spark_cluster, plan, tmp_path / "driver.log")
    print("seconds per step:", result["seconds"])
    steps = result["steps"]
    assert steps["read-embedded"] == 1000
    assert steps["imports"] == [kafkakv.__file__]  # the executors import this kafkakv
    with kafkakv.connect(embedded) as db:
        m = db.map("m")
        assert len(m) == 1000 and m["k999"] == {"n": 999}
    assert steps["ingest"] == {"rows": rows, "deletes": 0}
    assert steps["incremental"] == {"rows": 3, "deletes": 1}  # T1, T2 (a delete), T9999
    assert steps["read"] == rows == steps["snapshot"]  # 2000 - T2 + T9999
    report = steps["reconcile"]
    assert (report["table_rows"], report["target_rows"]) == (rows, rows), report
    assert (report["missing"], report["extra"], report["different"]) == (0, 0, 0), report
    exported = pq.read_table(tmp_path / "snap").to_pydict()
    values = dict(zip(exported["key"], map(json.loads, exported["value"]), strict=True))
    assert len(values) == rows and "T2" not in values
    assert values["T1"]["acquirerId"] == "NEW" and values["T9999"]["mcc"] is None
    with kafkakv.connect(target) as db:  # the copy the data source wrote holds the same
        assert dict(db.map(copy).items()) == values
        a, b = dict(db.map(f"{name}-a").items()), dict(db.map(f"{name}-b").items())
    # The stream's first run took A's contents in micro-batch 0; restarted from its
    # checkpoint, it took only the 5 changes since, in micro-batch 1; B is A transformed.
    assert steps["stream"]["batches"] == [[0, len(first)]], steps["stream"]
    assert steps["restart"]["batches"] == [[1, 5]], steps["restart"]
    assert a == final
    assert b == _transformed(final)
    commits = sorted(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    assert commits == [0, 1]
    # Every step that ran Spark jobs ran them on the workers' executors, and none failed. A
    # streaming query runs its micro-batches' jobs in a group of its own, its run's id (not
    # the step's group): one job per micro-batch, the first one task per partition of A.
    runs = {steps[s]["run"]: s for s in ("stream", "restart")}
    assert set(runs) <= set(result["jobs"]), result["jobs"]
    jobs = {runs.get(group, group): counts for group, counts in result["jobs"].items()}
    assert set(jobs) == {step["name"] for step in plan["steps"]} - {"change", "put", "change-a"}
    assert jobs["stream"]["jobs"] == jobs["restart"]["jobs"] == 1, jobs
    assert jobs["stream"]["tasks"] == 2, jobs
    assert all(group["failed"] == 0 for group in jobs.values()), jobs
    workers = _check_only_executors_ran_tasks(
        result, sum(group["tasks"] for group in jobs.values())
    )
    assert len(workers) == 2, workers  # one executor per worker


@pytest.mark.timeout(600)
def test_a_killed_executor_or_python_worker_costs_a_task_retry_not_the_ingest(
    spark_cluster: Any, kafka_cluster: Any, postgres: PostgresConnection, tmp_path: Path
) -> None:
    rows = 100_000
    table = terminal_table(postgres, rows)
    target = f"kafka://{kafka_cluster.bootstrap}"
    name = f"faults-{uuid.uuid4().hex[:10]}"
    faults = ("jvm", "python")
    plan = {
        "target": target,
        "table": table,
        "postgres": dataclasses.asdict(postgres),
        "jars": [str(postgres_jdbc_jar())],
        # The ingest reads in 8 JDBC tasks of 12,500 rows, two at a time: each executor runs
        # them one after another until the job ends, and a kill before that lands in one.
        "config": {"spark.default.parallelism": "8"},
        "steps": [
            *(
                {"name": f"ingest-{f}", "do": "ingest", "map": f"{name}-{f}", "partitions": 2}
                for f in faults
            ),
            *({"name": f"reconcile-{f}", "do": "reconcile", "map": f"{name}-{f}"} for f in faults),
        ],
    }
    ops = {f: SourceOptions(target, map=f"{name}-{f}").map_topics.ops for f in faults}
    killed: dict[str, tuple[str, int]] = {}

    def kill(app: _App) -> None:
        with kafkakv.connect(target) as db:
            for fault in faults:  # an executor JVM in the first ingest, a Python worker next
                killed[fault] = _kill_while_appending(app, db, ops[fault], rows, fault)

    result = _run_driver(spark_cluster, plan, tmp_path / "driver.log", kill)
    print("seconds per step:", result["seconds"])
    assert set(killed) == set(faults), killed
    steps, jobs, executors = result["steps"], result["jobs"], result["executors"]
    with kafkakv.connect(target) as db:
        appended = {f: _ops_records(db, ops[f]) for f in faults}
    print(f"killed (executor, ops records then): {killed}; ops records after: {appended}")
    for fault in faults:
        # Spark retried the failed task and the job finished: every row counted once (the
        # failed attempt's observed metrics are dropped) and the map equals the table.
        assert jobs[f"ingest-{fault}"]["failed"] >= 1, jobs
        assert steps[f"ingest-{fault}"] == {"rows": rows, "deletes": 0}
        report = steps[f"reconcile-{fault}"]
        assert (report["table_rows"], report["target_rows"]) == (rows, rows), report
        assert (report["missing"], report["extra"], report["different"]) == (0, 0, 0), report
        assert appended[fault] >= rows  # and what the failed attempt appended before it died
    # The killed JVM is a removed executor; the master started another on its worker.
    assert not executors[killed["jvm"][0]]["active"], executors
    assert sum(e["active"] for name, e in executors.items() if name != "driver") == 2
    _check_only_executors_ran_tasks(result, sum(group["tasks"] for group in jobs.values()))
