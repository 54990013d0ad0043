"""``kafkakv pipeline ingest|snapshot|reconcile`` against real parts (no mocks): the session's
Spark and PostgreSQL (tests/pipeline_fixtures.py), an embedded log in a temporary directory.

The commands run in-process through CliRunner, so they use the running ``spark`` session
(and must leave it running)."""

from __future__ import annotations

import json
import signal
import socket
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from click.testing import CliRunner, Result

import kafkakv
from kafkakv.cli import pipeline_commands
from kafkakv.cli.main import main
from kafkakv.log import EmbeddedLog
from kafkakv.pipeline import PostgresConnection
from tests.pipeline_fixtures import unique_table

#: How the tests map a table: the key column, three value columns renamed to camelCase.
MAPPING = (
    "--key",
    "terminal_id",
    "--active-column",
    "is_active",
    "--columns",
    "terminal_id,acquirer,amount",
    "--camel-case",
)
INGEST = (*MAPPING, "--timestamp-column", "updated_at", "--id-column", "id")


def url_of(connection: PostgresConnection) -> str:
    secret = f":{quote(connection.password, safe='')}" if connection.password else ""
    return (
        f"postgresql://{quote(connection.user, safe='')}{secret}@{connection.address}/"
        f"{quote(connection.database, safe='')}"
    )


def cli(log_dir: Path, *args: str, env: dict[str, str | None] | None = None) -> Result:
    """``kafkakv pipeline -p log_dir ARGS`` with KAFKAKV_LOG and KAFKAKV_POSTGRES_URL unset
    unless ``env`` sets them."""
    full_env: dict[str, str | None] = {"KAFKAKV_LOG": None, "KAFKAKV_POSTGRES_URL": None}
    full_env.update(env or {})
    return CliRunner().invoke(main, ["pipeline", "-p", str(log_dir), *args], env=full_env)


def ok(result: Result) -> str:
    assert result.exit_code == 0, (result.stdout, result.stderr)
    assert "Traceback" not in result.output
    return result.stdout


def assert_clean_error(result: Result, *fragments: str) -> None:
    """Exit code 2, and ``error: ...`` (after any progress lines) naming every fragment."""
    assert result.exit_code == 2, (result.stdout, result.stderr)
    start = ("\n" + result.stderr).find("\nerror: ")
    assert start >= 0, result.stderr
    message = result.stderr[start:]
    for fragment in fragments:
        assert fragment in message, result.stderr
    assert "Traceback" not in result.output


def assert_usage_error(result: Result, *fragments: str) -> None:
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert "Usage:" in result.stderr, result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr
    assert "Traceback" not in result.output


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    return tmp_path / "log"


@pytest.fixture
def table(postgres: PostgresConnection) -> str:
    """A table of three active terminals, t1..t3, each updated when inserted."""
    name = unique_table("terminals")
    with postgres.connect() as conn:
        conn.execute(
            f"CREATE TABLE {name} (terminal_id text PRIMARY KEY, acquirer text, amount bigint,"
            " is_active boolean NOT NULL DEFAULT true,"
            " updated_at timestamptz NOT NULL DEFAULT clock_timestamp(), id bigserial)"
        )
        for i in (1, 2, 3):
            conn.execute(
                f"INSERT INTO {name} (terminal_id, acquirer, amount) VALUES (%s, %s, %s)",
                (f"t{i}", f"a{i}", 10 * i),
            )
    return name


def ingest(
    log_dir: Path, postgres: PostgresConnection, table: str, *target: str, **kw: Any
) -> Result:
    return cli(log_dir, "ingest", "--table", table, *INGEST, *target, **kw)


def run_reconcile(log_dir: Path, postgres: PostgresConnection, table: str, *args: str) -> Result:
    return cli(
        log_dir, "reconcile", "--table", table, *MAPPING, "--postgres-url", url_of(postgres), *args
    )


def map_items(log_dir: Path, name: str) -> dict[Any, Any]:
    with kafkakv.connect(log_dir, background_cleaner=False) as db:
        return dict(db.map(name).items())


def end_offsets(log_dir: Path) -> dict[tuple[str, int], int]:
    with EmbeddedLog(log_dir, background_cleaner=False) as lg:
        return {(t, p): lg.end_offset(t, p) for t in lg.topics() for p in range(lg.partitions(t))}


def value(i: int, acquirer: str | None = None) -> dict[str, Any]:
    return {"terminalId": f"t{i}", "acquirer": acquirer or f"a{i}", "amount": 10 * i}


# -- ingest -----------------------------------------------------------------------------------


def test_ingest_into_a_map_runs_incrementally(
    spark: Any, postgres: PostgresConnection, table: str, log_dir: Path
) -> None:
    name = f"m-{uuid.uuid4().hex[:8]}"
    env = {"KAFKAKV_POSTGRES_URL": url_of(postgres)}  # the URL from the environment
    first = ingest(log_dir, postgres, table, "--map", name, env=env)
    out = ok(first)
    assert out.startswith(f"ingested 3 rows (0 deletes) from {table} into map '{name}': ")
    assert "position the start -> " in out
    assert "wrote 3 rows (0 deletes)" in first.stderr  # progress
    assert map_items(log_dir, name) == {f"t{i}": value(i) for i in (1, 2, 3)}
    dumped = CliRunner().invoke(main, ["map", "-p", str(log_dir), "dump", name])
    assert [json.loads(line)["key"] for line in ok(dumped).splitlines()] == ["t1", "t2", "t3"]

    offsets = end_offsets(log_dir)
    again = ingest(log_dir, postgres, table, "--map", name, env=env)
    assert ok(again).startswith(f"no new rows in {table}: nothing written to map '{name}'")
    assert "nothing written" in again.stderr
    assert end_offsets(log_dir) == offsets

    with postgres.connect() as conn:
        conn.execute(
            f"UPDATE {table} SET acquirer = 'b2', updated_at = clock_timestamp() "
            "WHERE terminal_id = 't2'"
        )
        conn.execute(
            f"UPDATE {table} SET is_active = false, updated_at = clock_timestamp() "
            "WHERE terminal_id = 't3'"
        )
    third = ok(ingest(log_dir, postgres, table, "--map", name, env=env))
    assert third.startswith("ingested 2 rows (1 deletes)")
    assert map_items(log_dir, name) == {"t1": value(1), "t2": value(2, "b2")}
    spark.range(1).count()  # the commands left the shared session running


def test_ingest_into_a_topic_then_reconcile_matches(
    spark: Any, postgres: PostgresConnection, table: str, log_dir: Path
) -> None:
    topic = f"d-{uuid.uuid4().hex[:8]}"
    url = ("--postgres-url", url_of(postgres))
    result = ingest(log_dir, postgres, table, "--topic", topic, *url)
    assert ok(result).startswith(f"ingested 3 rows (0 deletes) from {table} into topic '{topic}'")
    assert f"created compacted topic '{topic}'" in result.stderr
    checked = run_reconcile(log_dir, postgres, table, "--topic", topic, "--fail-on-diff", "--json")
    report = json.loads(ok(checked))
    assert report["matches"] is True
    assert {k: v for k, v in report.items() if k != "seconds"} == {
        "table": table,
        "target": f"topic '{topic}'",
        "matches": True,
        "table_rows": 3,
        "target_rows": 3,
        "missing": 0,
        "extra": 0,
        "different": 0,
        "samples": {},
    }
    assert "they match" in checked.stderr  # progress


def test_reconcile_names_a_value_changed_in_the_map(
    spark: Any, postgres: PostgresConnection, table: str, log_dir: Path
) -> None:
    name = f"m-{uuid.uuid4().hex[:8]}"
    ok(ingest(log_dir, postgres, table, "--map", name, "--postgres-url", url_of(postgres)))
    changed = json.dumps(value(2, "changed"))
    ok(CliRunner().invoke(main, ["map", "-p", str(log_dir), "put", name, "t2", changed]))
    with postgres.connect() as conn:  # a row the map lacks
        conn.execute(f"INSERT INTO {table} (terminal_id, acquirer, amount) VALUES ('t4', 'a4', 40)")

    failed = run_reconcile(log_dir, postgres, table, "--map", name, "--fail-on-diff")
    assert failed.exit_code == 1, (failed.stdout, failed.stderr)
    lines = failed.stdout.splitlines()
    assert lines[0].startswith(
        f"{table} vs map '{name}': 4 active rows, 3 keys: they differ "
        "(1 missing, 0 extra, 1 different) in "
    )
    assert lines[1:] == [
        "missing: 1 key in the table, not in the target",
        "  t4",
        "different: 1 key on both sides with different values",
        "  t2",
    ]


def test_ctrl_c_cancels_the_job_and_the_next_run_repairs(
    spark: Any,
    postgres: PostgresConnection,
    table: str,
    log_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    name = f"m-{uuid.uuid4().hex[:8]}"
    url = ("--postgres-url", url_of(postgres))
    handler = signal.getsignal(signal.SIGINT)
    show = pipeline_commands._progress

    def progress(line: str) -> None:  # Ctrl-C as the write starts
        show(line)
        if line.startswith("writing"):
            signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(pipeline_commands, "_progress", progress)
    stopped = ingest(log_dir, postgres, table, "--map", name, *url)
    assert stopped.exit_code == 130, (stopped.stdout, stopped.stderr)
    assert "interrupted: cancelling the Spark jobs" in stopped.stderr
    assert stopped.stderr.splitlines()[-1] == "interrupted"
    assert "Traceback" not in stopped.output
    assert signal.getsignal(signal.SIGINT) is handler  # PySpark's handler is back
    spark.range(1).count()  # and the shared session runs

    monkeypatch.setattr(pipeline_commands, "_progress", show)
    ok(ingest(log_dir, postgres, table, "--map", name, *url))
    assert map_items(log_dir, name) == {f"t{i}": value(i) for i in (1, 2, 3)}


# -- snapshot ---------------------------------------------------------------------------------


def test_snapshot_writes_parquet(spark: Any, log_dir: Path, tmp_path: Path) -> None:
    name = f"m-{uuid.uuid4().hex[:8]}"
    with kafkakv.connect(log_dir, background_cleaner=False) as db:
        db.map(name).update({f"k{i}": {"n": i} for i in range(5)})
    out = tmp_path / "snap"
    result = cli(log_dir, "snapshot", str(out), "--map", name)
    assert ok(result).startswith(f"wrote 5 rows of map '{name}' to {out} (parquet) in ")
    rows = spark.read.parquet(str(out)).collect()
    assert sorted((r["key"], json.loads(r["value"])["n"]) for r in rows) == [
        (f"k{i}", i) for i in range(5)
    ]

    assert_clean_error(cli(log_dir, "snapshot", str(out), "--map", name), "already exists")
    missing = cli(log_dir, "snapshot", str(tmp_path / "other"), "--topic", "nope")
    assert_clean_error(missing, "does not exist")


# -- errors -----------------------------------------------------------------------------------


def test_clear_errors(spark: Any, postgres: PostgresConnection, log_dir: Path) -> None:
    url = ("--postgres-url", url_of(postgres))
    missing = ingest(log_dir, postgres, "no_such_table", "--map", "m", *url)
    assert_clean_error(missing, "no_such_table", "does not exist")

    assert_usage_error(ingest(log_dir, postgres, "t", "--map", "m"), "KAFKAKV_POSTGRES_URL")
    assert_clean_error(
        ingest(log_dir, postgres, "t", "--map", "m", "--postgres-url", "mysql://x@h/db"),
        "not a PostgreSQL URL",
    )

    with socket.socket() as sock:  # a port where nothing listens
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    nowhere = ("--postgres-url", f"postgresql://kafkakv@127.0.0.1:{port}/kafkakv")
    assert_clean_error(ingest(log_dir, postgres, "t", "--map", "m", *nowhere), f"127.0.0.1:{port}")

    assert_usage_error(
        ingest(log_dir, postgres, "t", "--map", "m", "--topic", "d", *url), "exactly one"
    )
    assert_usage_error(ingest(log_dir, postgres, "t", *url), "exactly one")
    assert_usage_error(
        ingest(log_dir, postgres, "t", "--topic", "d", "--topics", "b", *url), "--topics"
    )
    no_path = CliRunner().invoke(
        main, ["pipeline", "snapshot", "out", "--map", "m"], env={"KAFKAKV_LOG": None}
    )
    assert_usage_error(no_path, "--path")
    assert_clean_error(
        run_reconcile(log_dir, postgres, "t", "--map", "m"), "no log at", "does not exist"
    )
