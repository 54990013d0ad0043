"""``kafkakv map ...`` against real maps on an EmbeddedLog in a temporary directory (no mocks)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

import kafkakv
from kafkakv.cli.main import main
from kafkakv.log import Record
from tests.waiting import interrupt


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    return tmp_path / "log"


@pytest.fixture
def name() -> str:
    """A map name unique to the test."""
    return f"m-{uuid.uuid4().hex[:10]}"


def cli(log_dir: Path, *args: str) -> Result:
    """Run ``kafkakv map -p log_dir ARGS``, with KAFKAKV_LOG unset."""
    return CliRunner().invoke(main, ["map", "-p", str(log_dir), *args], env={"KAFKAKV_LOG": None})


def ok(result: Result) -> str:
    """The stdout of a command that must have succeeded."""
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return result.stdout


def json_lines(text: str) -> list[Any]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def assert_clean_error(result: Result, *fragments: str) -> None:
    """Exit code 2, ``error: ...`` on stderr naming every fragment, and no traceback."""
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert result.stderr.startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr
    assert "Traceback" not in result.output


def api_put(log_dir: Path, name: str, pairs: dict[Any, Any], **options: Any) -> None:
    """Put ``pairs`` through the Python API, from a database of its own."""
    with kafkakv.connect(log_dir) as db:
        db.map(name, **options).update(pairs)


def api_items(log_dir: Path, name: str, **options: Any) -> dict[Any, Any]:
    with kafkakv.connect(log_dir) as db:
        return dict(db.map(name, **options).items())


# -- put / get / del ------------------------------------------------------------------------


def test_put_then_get_round_trips_json_values(log_dir: Path, name: str) -> None:
    assert ok(cli(log_dir, "put", name, "doc", '{"b": [1, 2], "a": "x"}')) == ""
    assert ok(cli(log_dir, "put", name, "n", "42")) == ""
    assert ok(cli(log_dir, "put", name, "s", '"text"')) == ""
    assert json.loads(ok(cli(log_dir, "get", name, "doc"))) == {"a": "x", "b": [1, 2]}
    assert ok(cli(log_dir, "get", name, "n")) == "42\n"
    assert ok(cli(log_dir, "get", name, "s")) == '"text"\n'
    assert api_items(log_dir, name) == {"doc": {"a": "x", "b": [1, 2]}, "n": 42, "s": "text"}


def test_put_prints_the_previous_value(log_dir: Path, name: str) -> None:
    ok(cli(log_dir, "put", name, "k", '{"v": 1}'))
    assert json.loads(ok(cli(log_dir, "put", name, "k", '{"v": 2}'))) == {"v": 1}
    assert json.loads(ok(cli(log_dir, "get", name, "k"))) == {"v": 2}


def test_put_if_absent_keeps_the_existing_value(log_dir: Path, name: str) -> None:
    assert ok(cli(log_dir, "put", name, "k", "1", "--if-absent")) == ""
    assert ok(cli(log_dir, "put", name, "k", "2", "--if-absent")) == "1\n"
    assert ok(cli(log_dir, "get", name, "k")) == "1\n"


def test_get_sees_values_written_through_the_api(log_dir: Path, name: str) -> None:
    api_put(log_dir, name, {"a": [1, "two"]})
    assert json.loads(ok(cli(log_dir, "get", name, "a"))) == [1, "two"]
    assert json.loads(ok(cli(log_dir, "get", name, "a", "--linearizable"))) == [1, "two"]


def test_get_an_absent_key_exits_1(log_dir: Path, name: str) -> None:
    ok(cli(log_dir, "put", name, "present", "1"))
    result = cli(log_dir, "get", name, "missing")
    assert result.exit_code == 1
    assert result.stdout == ""
    assert "'missing'" in result.stderr and name in result.stderr
    assert "Traceback" not in result.output


def test_del_removes_and_prints_the_old_value(log_dir: Path, name: str) -> None:
    ok(cli(log_dir, "put", name, "k", '"v"'))
    assert ok(cli(log_dir, "del", name, "k")) == '"v"\n'
    assert cli(log_dir, "get", name, "k").exit_code == 1
    again = cli(log_dir, "del", name, "k")
    assert again.exit_code == 1
    assert "'k'" in again.stderr
    assert api_items(log_dir, name) == {}


def test_str_value_codec_takes_the_text_as_is(log_dir: Path, name: str) -> None:
    ok(cli(log_dir, "put", name, "k", "not json", "--value-codec", "str"))
    assert ok(cli(log_dir, "get", name, "k", "--value-codec", "str")) == '"not json"\n'
    assert api_items(log_dir, name, value_codec="str") == {"k": "not json"}


def test_values_json_cannot_hold_print_as_repr(log_dir: Path, name: str) -> None:
    api_put(log_dir, name, {"k": b"\x00\xff"}, value_codec="msgpack")
    assert ok(cli(log_dir, "get", name, "k", "--value-codec", "msgpack")) == "b'\\x00\\xff'\n"
    [row] = json_lines(ok(cli(log_dir, "dump", name, "--value-codec", "msgpack")))
    assert row == {"key": "k", "value": "b'\\x00\\xff'"}


def test_msgpack_values_are_given_as_json(log_dir: Path, name: str) -> None:
    ok(cli(log_dir, "put", name, "k", '{"a": [1, 2.5]}', "--value-codec", "msgpack"))
    assert api_items(log_dir, name, value_codec="msgpack") == {"k": {"a": [1, 2.5]}}


def test_int_key_codec(log_dir: Path, name: str) -> None:
    for key in ("10", "2", "-1"):  # after "--", "-1" is an argument, not an option
        ok(cli(log_dir, "put", "--key-codec", "int", "--", name, key, f'"v{key}"'))
    assert ok(cli(log_dir, "get", name, "10", "--key-codec", "int")) == '"v10"\n'
    rows = json_lines(ok(cli(log_dir, "dump", name, "--key-codec", "int")))
    assert [(r["key"], r["value"]) for r in rows] == [(-1, "v-1"), (2, "v2"), (10, "v10")]
    assert api_items(log_dir, name, key_codec="int") == {10: "v10", 2: "v2", -1: "v-1"}
    assert_clean_error(cli(log_dir, "get", name, "ten", "--key-codec", "int"), "'ten'", "integer")


def test_int_value_codec_reads_an_integer(log_dir: Path, name: str) -> None:
    ok(cli(log_dir, "put", name, "k", "7", "--value-codec", "int"))
    assert api_items(log_dir, name, value_codec="int") == {"k": 7}
    bad = cli(log_dir, "put", name, "k", "7.5", "--value-codec", "int")
    assert_clean_error(bad, "VALUE '7.5'", "integer")


# -- errors ---------------------------------------------------------------------------------


def test_a_write_with_another_codec_than_the_map_is_refused(log_dir: Path, name: str) -> None:
    ok(cli(log_dir, "put", name, "k", '{"x": 1}'))
    for command in (("put", name, "k", "3"), ("del", name, "k")):
        refused = cli(log_dir, *command, "--value-codec", "int")
        assert_clean_error(refused, "'k'", "int codec", "Nothing was written", "--force")
    assert api_items(log_dir, name) == {"k": {"x": 1}}


def test_force_writes_and_shows_the_undecodable_previous_bytes(log_dir: Path, name: str) -> None:
    ok(cli(log_dir, "put", name, "k", '{"x": 1}'))
    forced = cli(log_dir, "put", name, "k", "3", "--value-codec", "int", "--force")
    assert ok(forced) == ""
    assert forced.stderr.startswith("warning: the update was applied"), forced.stderr
    assert "b'{\"x\":1}'" in forced.stderr, forced.stderr
    assert api_items(log_dir, name, value_codec="int") == {"k": 3}
    # the json reader can set the key right again, and is told what it replaced
    fixed = cli(log_dir, "put", name, "k", '{"x": 1}', "--force")
    assert ok(fixed) == "" and "\\x80" in fixed.stderr, fixed.stderr
    forced_del = cli(log_dir, "del", name, "k", "--value-codec", "int", "--force")
    assert ok(forced_del) == "" and "warning:" in forced_del.stderr
    assert api_items(log_dir, name) == {}


def test_a_value_that_is_not_json_is_a_clean_error(log_dir: Path, name: str) -> None:
    ok(cli(log_dir, "put", name, "other", "1"))
    assert_clean_error(cli(log_dir, "put", name, "k", "{oops"), "VALUE '{oops'", "not JSON")
    assert api_items(log_dir, name) == {"other": 1}


def test_an_unknown_codec_is_a_usage_error(log_dir: Path, name: str) -> None:
    result = cli(log_dir, "get", name, "k", "--key-codec", "pickle")
    assert result.exit_code == 2
    assert "pickle" in result.stderr
    assert "Traceback" not in result.output


def test_request_timeout_bounds_the_wait_for_an_unreachable_broker(name: str) -> None:
    with socket.socket() as sock:  # a port nobody listens on once closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    target = f"kafka://127.0.0.1:{port}"
    started = time.monotonic()
    result = CliRunner().invoke(
        main,
        ["map", "-p", target, "--request-timeout", "1.5", "put", name, "k", "1"],
        env={"KAFKAKV_LOG": None},
    )
    took = time.monotonic() - started
    assert_clean_error(result, f"127.0.0.1:{port}", "within 1.5 s")
    assert took < 10, took  # the default would wait 30 s
    zero = cli(Path("unused"), "--request-timeout", "0", "get", name, "k")
    assert zero.exit_code == 2 and "--request-timeout" in zero.stderr


def test_read_commands_do_not_create_a_missing_log(tmp_path: Path, name: str) -> None:
    missing = tmp_path / "nowhere"
    for args in (["get", name, "k"], ["del", name, "k"], ["dump", name], ["watch", name]):
        assert_clean_error(cli(missing, *args), "no log at", str(missing))
    assert not missing.exists()


def test_read_commands_do_not_create_a_missing_map(log_dir: Path, name: str) -> None:
    ok(cli(log_dir, "put", "other", "k", "1"))
    before = sorted(os.listdir(log_dir / "topics"))
    reads = (["get", name, "k"], ["del", name, "k"], ["dump", name], ["dump", name, "--count"])
    for args in (*reads, ["watch", name, "--timeout", "0.1"]):
        assert_clean_error(cli(log_dir, *args), f"there is no map {name!r}")
    assert sorted(os.listdir(log_dir / "topics")) == before


def test_put_refuses_a_name_on_another_maps_topic_and_creates_nothing(
    log_dir: Path, name: str
) -> None:
    ok(cli(log_dir, "put", name, "k", "1"))
    assert_clean_error(cli(log_dir, "put", f"{name}_ops", "x", "1"), f"ops topic of map {name!r}")
    topics = set(os.listdir(log_dir / "topics"))
    assert topics == {name, f"{name}_ops", f"{name}_flush"}


def test_put_refuses_a_topic_another_program_wrote(log_dir: Path, name: str) -> None:
    with kafkakv.connect(log_dir) as db:
        db.log.create_topic(name, 1, {"cleanup.policy": "compact"})
        db.log.append(name, 0, [Record(b"c5", b'"old"')])
    assert_clean_error(cli(log_dir, "put", name, "c5", '"new"'), "kafkakv init-existing")
    assert_clean_error(cli(log_dir, "get", name, "c5"), "kafkakv init-existing")
    assert set(os.listdir(log_dir / "topics")) == {name}


@pytest.mark.parametrize("address", ["127.0.0.1:12600", "localhost:9092,localhost:9093"])
def test_a_broker_address_without_kafka_scheme_is_refused(
    address: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    monkeypatch.chdir(tmp_path)
    for args in (["put", name, "k", "1"], ["get", name, "k"]):
        assert_clean_error(cli(Path(address), *args), f"did you mean kafka://{address}?")
    for command in (["log", "-p", address, "create"], ["topics", "create", "-t", address]):
        result = CliRunner().invoke(main, [*command, name], env={"KAFKAKV_LOG": None})
        assert_clean_error(result, f"did you mean kafka://{address}?")
    assert os.listdir(tmp_path) == []


def test_missing_path_is_a_clear_usage_error(name: str) -> None:
    result = CliRunner().invoke(main, ["map", "get", name, "k"], env={"KAFKAKV_LOG": None})
    assert result.exit_code == 2
    assert "--path" in result.stderr and "KAFKAKV_LOG" in result.stderr
    assert "Traceback" not in result.output


def test_path_from_environment(log_dir: Path, name: str) -> None:
    runner = CliRunner()
    env = {"KAFKAKV_LOG": str(log_dir)}
    assert ok(runner.invoke(main, ["map", "put", name, "k", "1"], env=env)) == ""
    assert ok(runner.invoke(main, ["map", "get", name, "k"], env=env)) == "1\n"


def test_a_kafkakv_error_is_shown_without_traceback(log_dir: Path) -> None:
    assert_clean_error(cli(log_dir, "put", "", "k", "1"), "map name")  # a ConfigError


# -- dump -----------------------------------------------------------------------------------


def test_dump_prints_every_pair_sorted_by_key(log_dir: Path, name: str) -> None:
    api_put(log_dir, name, {"b": 2, "a": {"x": None}, "c": [3]})
    rows = json_lines(ok(cli(log_dir, "dump", name)))
    assert rows == [
        {"key": "a", "value": {"x": None}},
        {"key": "b", "value": 2},
        {"key": "c", "value": [3]},
    ]
    assert ok(cli(log_dir, "dump", name, "--count")) == "3\n"


def test_dump_of_an_empty_map(log_dir: Path, name: str) -> None:
    api_put(log_dir, name, {"k": 1})
    ok(cli(log_dir, "del", name, "k"))
    assert ok(cli(log_dir, "dump", name)) == ""
    assert ok(cli(log_dir, "dump", name, "--count")) == "0\n"


def test_dump_with_keys_that_do_not_compare(log_dir: Path, name: str) -> None:
    api_put(log_dir, name, {1: "int", "one": "str"}, key_codec="json")
    rows = json_lines(ok(cli(log_dir, "dump", name, "--key-codec", "json")))
    assert sorted(json.dumps(r) for r in rows) == sorted(
        json.dumps(r) for r in [{"key": 1, "value": "int"}, {"key": "one", "value": "str"}]
    )


# -- watch ----------------------------------------------------------------------------------


def put_later(
    log_dir: Path, name: str, pairs: list[tuple[str, Any]], delay: float
) -> threading.Thread:
    """Put ``pairs`` one by one, from a database of its own, after ``delay`` seconds."""

    def run() -> None:
        time.sleep(delay)
        with kafkakv.connect(log_dir) as db:
            m = db.map(name)
            for key, value in pairs:
                if value is None:
                    m.remove(key)
                else:
                    m.put(key, value)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_watch_prints_changes_made_elsewhere(log_dir: Path, name: str) -> None:
    api_put(log_dir, name, {"old": 0})  # before the watch: not printed
    writer = put_later(log_dir, name, [("a", 1), ("b", {"x": 2}), ("c", "three")], delay=0.5)
    started = time.monotonic()
    result = cli(log_dir, "watch", name, "--limit", "3", "--timeout", "30")
    elapsed = time.monotonic() - started
    writer.join(timeout=10)
    rows = json_lines(ok(result))
    assert [{k: v for k, v in row.items() if k != "cursor"} for row in rows] == [
        {"key": "a", "old": None, "new": 1},
        {"key": "b", "old": None, "new": {"x": 2}},
        {"key": "c", "old": None, "new": "three"},
    ]
    assert [row["cursor"] for row in rows] == ["0:2", "0:3", "0:4"]  # one past each record
    assert result.stderr.strip() == "cursor: 0:4"
    assert elapsed < 20  # stopped at the limit, not at the timeout


def test_watch_since_a_cursor_goes_on_exactly_after_it(log_dir: Path, name: str) -> None:
    """The cursor of a printed line, given back with --since (another run, another
    process's replica), prints exactly the changes after it; --text prints them as text; a
    cursor that is not one, or that a flush covered, is a clean error."""
    api_put(log_dir, name, {"a": 1})
    api_put(log_dir, name, {"a": 2, "b": 3})  # one batch record: two changes at one offset
    api_put(log_dir, name, {"c": 4})
    rows = json_lines(ok(cli(log_dir, "watch", name, "--since", "0:0", "--timeout", "1")))
    assert [(r["key"], r["new"]) for r in rows] == [("a", 1), ("a", 2), ("b", 3), ("c", 4)]
    inside = rows[1]["cursor"]
    assert inside == "0:1+1"  # one change of the batch record taken
    rest = json_lines(ok(cli(log_dir, "watch", name, "--since", inside, "--timeout", "1")))
    assert rest == rows[2:]
    text = ok(cli(log_dir, "watch", name, "--since", inside, "--text", "--timeout", "1"))
    assert text.splitlines() == ['0:2 "b": null -> 3', '0:3 "c": null -> 4']
    assert_clean_error(cli(log_dir, "watch", name, "--since", "zero"), "not a cursor")
    with kafkakv.connect(log_dir) as db:
        db.map(name).flush()
    assert_clean_error(cli(log_dir, "watch", name, "--since", inside), "m.snapshot()")


def test_watch_shows_old_and_new_of_updates_and_removals(log_dir: Path, name: str) -> None:
    api_put(log_dir, name, {"k": 1})
    writer = put_later(log_dir, name, [("k", 2), ("k", None)], delay=0.5)
    result = cli(log_dir, "watch", name, "--limit", "2", "--timeout", "30")
    writer.join(timeout=10)
    rows = json_lines(ok(result))
    assert [(r["key"], r["old"], r["new"]) for r in rows] == [("k", 1, 2), ("k", 2, None)]


def test_watch_stops_at_the_timeout(log_dir: Path, name: str) -> None:
    api_put(log_dir, name, {})
    started = time.monotonic()
    result = cli(log_dir, "watch", name, "--timeout", "0.5")
    elapsed = time.monotonic() - started
    assert ok(result) == ""
    assert 0.4 <= elapsed < 10


def test_watch_ctrl_c_exits_0(log_dir: Path, name: str) -> None:
    api_put(log_dir, name, {"start": 0})
    env = {k: v for k, v in os.environ.items() if k != "KAFKAKV_LOG"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-X",
            "faulthandler",
            "-m",
            "kafkakv",
            "map",
            "-p",
            str(log_dir),
            "watch",
            name,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    watchdog = threading.Timer(60, proc.kill)  # a hung watch fails the test instead of hanging it
    watchdog.start()
    try:
        assert proc.stdout is not None
        stop = threading.Event()

        def feed() -> None:  # keep changing the map until the watch has printed one line
            with kafkakv.connect(log_dir) as db:
                m = db.map(name)
                n = 0
                while not stop.wait(0.1):
                    n += 1
                    m.put("ping", n)

        feeder = threading.Thread(target=feed, daemon=True)
        feeder.start()
        try:
            first = proc.stdout.readline()
        finally:
            stop.set()
            feeder.join(timeout=30)
        assert json.loads(first)["key"] == "ping"
        err = interrupt(proc)
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "Traceback" not in err


def test_put_with_a_ttl_creates_a_map_with_expiry_and_get_meta_shows_it(
    log_dir: Path, name: str
) -> None:
    """put --ttl creates the map with expiry; get --meta prints the seconds left; the key
    reads as absent once they run out; a map created without expiry refuses --ttl."""
    assert ok(cli(log_dir, "put", name, "k", "1", "--ttl", "60")) == ""
    shown = json.loads(ok(cli(log_dir, "get", name, "k", "--meta")))
    assert shown["value"] == 1 and 55 < shown["ttl"] <= 60
    ok(cli(log_dir, "put", name, "gone", "2", "--ttl", "0.2"))
    time.sleep(0.3)
    assert cli(log_dir, "get", name, "gone").exit_code == 1
    ok(cli(log_dir, "put", name, "k", "3"))  # without --ttl: no longer expires
    assert json.loads(ok(cli(log_dir, "get", name, "k", "--meta"))) == {"value": 3, "ttl": None}
    api_put(log_dir, name + "-plain", {"a": 1})
    assert_clean_error(cli(log_dir, "put", name + "-plain", "a", "2", "--ttl", "5"), "expiry")
    result = cli(log_dir, "put", name, "a", "2", "--ttl", "5", "--if-absent")
    assert_clean_error(result, "--ttl and --if-absent")
