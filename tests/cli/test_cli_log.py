"""``kafkakv log ...`` against a real EmbeddedLog in a temporary directory (no mocks)."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from kafkakv import __version__
from kafkakv.cli.main import main
from kafkakv.log import EmbeddedLog, Record
from tests.waiting import interrupt


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    return tmp_path / "log"


@pytest.fixture
def engine(log_dir: Path) -> Iterator[EmbeddedLog]:
    """The same log the CLI opens, through the Python API."""
    lg = EmbeddedLog(log_dir, background_cleaner=False)
    try:
        yield lg
    finally:
        lg.close()


def cli(log_dir: Path, *args: str) -> Result:
    """Run ``kafkakv log -p log_dir ARGS``, with KAFKAKV_LOG unset."""
    return CliRunner().invoke(main, ["log", "-p", str(log_dir), *args], env={"KAFKAKV_LOG": None})


def json_lines(text: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def assert_clean_error(result: Result, *fragments: str) -> None:
    """Exit code 2, ``error: ...`` on stderr naming every fragment, and no traceback."""
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr
    assert "Traceback" not in result.output


# -- main -----------------------------------------------------------------------------------


def test_version() -> None:
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0
    assert __version__ in result.stdout


def test_python_dash_m_runs_the_same_cli() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kafkakv", "--version"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert f"kafkakv, version {__version__}" in done.stdout


def test_missing_path_is_a_clear_usage_error(log_dir: Path) -> None:
    result = CliRunner().invoke(main, ["log", "topics"], env={"KAFKAKV_LOG": None})
    assert result.exit_code == 2
    assert "--path" in result.stderr and "KAFKAKV_LOG" in result.stderr
    assert "Traceback" not in result.output


def test_path_from_environment(engine: EmbeddedLog, log_dir: Path, topic: str) -> None:
    engine.create_topic(topic)
    result = CliRunner().invoke(main, ["log", "topics"], env={"KAFKAKV_LOG": str(log_dir)})
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [topic]


def test_a_missing_directory_is_not_created_by_a_read_command(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    assert_clean_error(cli(missing, "topics"), "no log at", str(missing))
    assert not missing.exists()


# -- topics / create --------------------------------------------------------------------------


def test_topics_lists_every_topic_sorted(engine: EmbeddedLog, log_dir: Path) -> None:
    for name in ("zeta", "alpha", "mid"):
        engine.create_topic(name)
    text = cli(log_dir, "topics")
    assert text.exit_code == 0, text.output
    assert text.stdout.splitlines() == ["alpha", "mid", "zeta"]
    as_json = cli(log_dir, "topics", "--json")
    assert as_json.exit_code == 0, as_json.output
    assert json.loads(as_json.stdout) == ["alpha", "mid", "zeta"]


def test_topics_on_an_empty_log_prints_nothing(engine: EmbeddedLog, log_dir: Path) -> None:
    result = cli(log_dir, "topics", "--json")
    assert result.exit_code == 0
    assert json.loads(result.stdout) == []


def test_create_with_partitions_and_config(log_dir: Path, topic: str) -> None:
    result = cli(
        log_dir,
        "create",
        topic,
        "--partitions",
        "3",
        "--config",
        "cleanup.policy=compact",
        "--config",
        "retention.ms=-1",
    )
    assert result.exit_code == 0, result.output
    with EmbeddedLog(log_dir, background_cleaner=False) as lg:
        assert lg.topics() == [topic]
        assert lg.partitions(topic) == 3
        config = lg.topic_config(topic)
    assert config["cleanup.policy"] == "compact"
    assert config["retention.ms"] == "-1"


def test_create_with_an_unknown_config_name_fails_clearly(log_dir: Path, topic: str) -> None:
    result = cli(log_dir, "create", topic, "--config", "retention.minutes=5")
    assert_clean_error(result, "unknown topic config 'retention.minutes'")
    with EmbeddedLog(log_dir, background_cleaner=False) as lg:
        assert lg.topics() == []


def test_create_with_a_bad_config_value_fails_clearly(log_dir: Path, topic: str) -> None:
    result = cli(log_dir, "create", topic, "--config", "segment.bytes=lots")
    assert_clean_error(result, "segment.bytes", "'lots'")


@pytest.mark.parametrize("pair", ["cleanup.policy", "=compact"])
def test_create_rejects_a_config_that_is_not_name_value(
    log_dir: Path, topic: str, pair: str
) -> None:
    result = cli(log_dir, "create", topic, "--config", pair)
    assert result.exit_code == 2
    assert "is not name=value" in result.stderr
    assert not (log_dir / "topics" / topic).exists()


def test_create_an_existing_topic_is_an_error(
    engine: EmbeddedLog, log_dir: Path, topic: str
) -> None:
    engine.create_topic(topic)
    assert_clean_error(cli(log_dir, "create", topic), "already exists")


# -- describe -------------------------------------------------------------------------------


def test_describe_json_reports_offsets_sizes_and_config(
    engine: EmbeddedLog, log_dir: Path, topic: str
) -> None:
    engine.create_topic(topic, partitions=2, config={"retention.bytes": 10_000_000})
    engine.append(topic, 0, [Record(b"k", b"v" * 100) for _ in range(5)])
    engine.append(topic, 0, [Record(b"k", b"w")])
    result = cli(log_dir, "describe", topic, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["topic"] == topic
    p0, p1 = doc["partitions"]
    assert (p0["partition"], p0["start_offset"], p0["end_offset"], p0["records"]) == (0, 0, 6, 6)
    assert (p1["partition"], p1["start_offset"], p1["end_offset"], p1["records"]) == (1, 0, 0, 0)
    assert p0["size_bytes"] > 500  # five 100-byte values plus two 56-byte batch headers
    assert p1["size_bytes"] == 0
    assert doc["config"] == engine.topic_config(topic)
    assert doc["config"]["retention.bytes"] == "10000000"


def test_describe_counts_the_data_not_the_space_reserved_past_it(
    tmp_path: Path, topic: str
) -> None:
    """Under fsync=always a segment is preallocated ahead of its data: describe's bytes are
    the batches' (it used to add the file's size, reserved zeros included)."""
    sizes = {}
    for policy in ("interval", "always"):
        log_dir = tmp_path / policy
        with EmbeddedLog(log_dir, fsync=policy, background_cleaner=False) as lg:
            lg.create_topic(topic, config={"segment.bytes": 4096})
            for i in range(40):  # rolls a few segments: sealed sizes and the active one
                lg.append(topic, 0, [Record(b"k%d" % i, b"v" * 200)])
        result = cli(log_dir, "describe", topic, "--json")
        assert result.exit_code == 0, result.output
        sizes[policy] = json.loads(result.stdout)["partitions"][0]["size_bytes"]
    segments = sorted((tmp_path / "interval" / "topics" / topic / "0").glob("*.log"))
    assert len(segments) > 2
    assert sizes["always"] == sizes["interval"] == sum(p.stat().st_size for p in segments)


def test_describe_table_shows_the_figures(engine: EmbeddedLog, log_dir: Path, topic: str) -> None:
    engine.create_topic(topic, config={"cleanup.policy": "compact"})
    engine.append(topic, 0, [Record(b"a", b"1"), Record(b"b", b"2"), Record(b"c", b"3")])
    result = cli(log_dir, "describe", topic)
    assert result.exit_code == 0, result.output
    assert topic in result.stdout
    assert "cleanup.policy" in result.stdout and "compact" in result.stdout
    row = next(line for line in result.stdout.splitlines() if line.strip("│ ").startswith("0 "))
    assert [cell.strip() for cell in row.strip("│").split("│")][:4] == ["0", "0", "3", "3"]


def test_describe_an_unknown_topic(engine: EmbeddedLog, log_dir: Path) -> None:
    assert_clean_error(cli(log_dir, "describe", "nope"), "no topic 'nope'")


# -- dump -----------------------------------------------------------------------------------


def test_dump_json_gives_offsets_keys_and_values(
    engine: EmbeddedLog, log_dir: Path, topic: str
) -> None:
    engine.create_topic(topic, partitions=2)
    engine.append(topic, 0, [Record(b"a", b"one", timestamp=1_000), Record(b"b", b"two")])
    engine.append(topic, 0, [Record(None, b"\xff\x00bin", headers=[("h", b"x")])])
    engine.append(topic, 1, [Record(b"c", None)])
    result = cli(log_dir, "dump", topic, "--format", "json")
    assert result.exit_code == 0, result.output
    rows = json_lines(result.stdout)
    assert [(r["partition"], r["offset"]) for r in rows] == [(0, 0), (0, 1), (0, 2), (1, 0)]
    assert [r["key"] for r in rows] == ["a", "b", None, "c"]
    assert rows[0]["value"] == "one" and rows[0]["timestamp"] == 1_000
    assert rows[2]["value"] == {"base64": "/wBiaW4="}
    assert rows[2]["headers"] == [["h", "x"]]
    assert rows[3]["value"] is None


def test_dump_from_limit_and_partition(engine: EmbeddedLog, log_dir: Path, topic: str) -> None:
    engine.create_topic(topic, partitions=2)
    engine.append(topic, 1, [Record(b"k", str(i).encode()) for i in range(10)])
    engine.append(topic, 0, [Record(b"other", b"x")])
    result = cli(
        log_dir,
        "dump",
        topic,
        "--partition",
        "1",
        "--from",
        "4",
        "--limit",
        "3",
        "--format",
        "json",
    )
    assert result.exit_code == 0, result.output
    rows = json_lines(result.stdout)
    assert [(r["partition"], r["offset"], r["value"]) for r in rows] == [
        (1, 4, "4"),
        (1, 5, "5"),
        (1, 6, "6"),
    ]


def test_dump_limit_counts_records_over_all_partitions(
    engine: EmbeddedLog, log_dir: Path, topic: str
) -> None:
    engine.create_topic(topic, partitions=3)
    for p in range(3):
        engine.append(topic, p, [Record(b"k", f"{p}-{i}".encode()) for i in range(2)])
    result = cli(log_dir, "dump", topic, "--limit", "3", "--format", "json")
    assert result.exit_code == 0, result.output
    rows = json_lines(result.stdout)
    assert [(r["partition"], r["offset"]) for r in rows] == [(0, 0), (0, 1), (1, 0)]


def test_dump_text_escapes_what_is_not_printable(
    engine: EmbeddedLog, log_dir: Path, topic: str
) -> None:
    engine.create_topic(topic)
    engine.append(topic, 0, [Record(b"k", b"line1\nline2"), Record(b"k2", b"\xfe\xff")])
    result = cli(log_dir, "dump", topic)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == 2
    assert "partition=0 offset=0" in lines[0]
    assert "key='k'" in lines[0] and r"value='line1\nline2'" in lines[0]
    assert "offset=1" in lines[1] and r"value=b'\xfe\xff'" in lines[1]


def test_dump_an_unknown_partition(engine: EmbeddedLog, log_dir: Path, topic: str) -> None:
    engine.create_topic(topic, partitions=2)
    assert_clean_error(cli(log_dir, "dump", topic, "--partition", "7"), "no partition 7")


# -- tail -----------------------------------------------------------------------------------


def append_later(
    log_dir: Path, topic: str, values: Sequence[bytes], delay: float
) -> threading.Thread:
    """Append ``values`` one batch each, from another EmbeddedLog, after ``delay`` seconds."""

    def run() -> None:
        time.sleep(delay)
        with EmbeddedLog(log_dir, background_cleaner=False) as lg:
            for value in values:
                lg.append(topic, 0, [Record(b"k", value)])
                time.sleep(0.05)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_tail_prints_records_appended_while_it_waits(
    engine: EmbeddedLog, log_dir: Path, topic: str
) -> None:
    engine.create_topic(topic)
    engine.append(topic, 0, [Record(b"k", b"old")])  # before the tail: --from-end skips it
    writer = append_later(log_dir, topic, [b"new-1", b"new-2", b"new-3"], delay=0.3)
    started = time.monotonic()
    result = cli(log_dir, "tail", topic, "--max", "3", "--timeout", "20", "--format", "json")
    elapsed = time.monotonic() - started
    writer.join(timeout=10)
    assert result.exit_code == 0, result.output
    rows = json_lines(result.stdout)
    assert [(r["offset"], r["value"]) for r in rows] == [(1, "new-1"), (2, "new-2"), (3, "new-3")]
    assert elapsed < 10  # woke on the appends, not on the timeout


def test_tail_from_beginning_over_all_partitions(
    engine: EmbeddedLog, log_dir: Path, topic: str
) -> None:
    engine.create_topic(topic, partitions=3)
    for p in range(3):
        engine.append(topic, p, [Record(b"k", f"p{p}".encode())])
    result = cli(log_dir, "tail", topic, "--from-beginning", "--timeout", "0.3", "--format", "json")
    assert result.exit_code == 0, result.output
    rows = json_lines(result.stdout)
    assert sorted((r["partition"], r["value"]) for r in rows) == [(0, "p0"), (1, "p1"), (2, "p2")]


def test_tail_with_nothing_new_stops_at_the_timeout(
    engine: EmbeddedLog, log_dir: Path, topic: str
) -> None:
    engine.create_topic(topic)
    engine.append(topic, 0, [Record(b"k", b"old")])
    started = time.monotonic()
    result = cli(log_dir, "tail", topic, "--timeout", "0.5")
    elapsed = time.monotonic() - started
    assert result.exit_code == 0, result.output
    assert result.stdout == ""
    assert 0.4 <= elapsed < 5


def test_tail_ctrl_c_exits_130(engine: EmbeddedLog, log_dir: Path, topic: str) -> None:
    engine.create_topic(topic)
    env = {k: v for k, v in os.environ.items() if k != "KAFKAKV_LOG"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-X",
            "faulthandler",
            "-m",
            "kafkakv",
            "log",
            "-p",
            str(log_dir),
            "tail",
            topic,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    watchdog = threading.Timer(60, proc.kill)  # a hung tail fails the test instead of hanging it
    watchdog.start()
    try:
        assert proc.stdout is not None
        # Keep appending until the tail has printed one record: then it is in its loop.
        stop = threading.Event()

        def feed() -> None:
            while not stop.wait(0.1):
                engine.append(topic, 0, [Record(b"k", b"ping")])

        feeder = threading.Thread(target=feed, daemon=True)
        feeder.start()
        try:
            first = proc.stdout.readline()
        finally:
            stop.set()
            feeder.join()
        assert "value='ping'" in first
        err = interrupt(proc)
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "Traceback" not in err


# -- compact --------------------------------------------------------------------------------


def test_compact_keeps_the_latest_record_per_key(
    engine: EmbeddedLog, log_dir: Path, topic: str
) -> None:
    engine.create_topic(topic, config={"cleanup.policy": "compact", "segment.bytes": 1024})
    for round_ in range(20):  # 20 rounds x 4 keys, ~1 KiB of values each round: many segments
        engine.append(
            topic, 0, [Record(f"key-{k}".encode(), f"{round_}".encode() * 60) for k in range(4)]
        )
    before = json_lines(cli(log_dir, "dump", topic, "--format", "json").stdout)
    assert len(before) == 80

    result = cli(log_dir, "compact", topic, "--json")
    assert result.exit_code == 0, result.output
    [figures] = json.loads(result.stdout)
    assert figures["partition"] == 0
    assert figures["records_out"] < figures["records_in"]
    assert figures["bytes_out"] < figures["bytes_in"]
    assert figures["segments_in"] >= 1

    after = json_lines(cli(log_dir, "dump", topic, "--format", "json").stdout)
    assert len(after) < len(before)
    assert len(before) - len(after) == figures["records_in"] - figures["records_out"]
    latest = {r["key"]: r["value"] for r in after}
    assert latest == {f"key-{k}": "19" * 60 for k in range(4)}

    text = cli(log_dir, "compact", topic)
    assert text.exit_code == 0, text.output
    assert text.stdout.startswith("partition 0: segments ")


def test_compact_a_topic_that_is_not_compacted(
    engine: EmbeddedLog, log_dir: Path, topic: str
) -> None:
    engine.create_topic(topic)
    assert_clean_error(cli(log_dir, "compact", topic), "not compacted")


# -- check ----------------------------------------------------------------------------------


def test_check_a_sound_log(engine: EmbeddedLog, log_dir: Path, topic: str) -> None:
    engine.create_topic(topic, partitions=2)
    engine.create_topic(topic + "-b")
    for i in range(5):
        engine.append(topic, i % 2, [Record(b"k", b"v" * 200)])
    result = cli(log_dir, "check")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "ok: 2 topics, no problems"


def test_check_finds_a_flipped_byte(engine: EmbeddedLog, log_dir: Path, topic: str) -> None:
    engine.create_topic(topic)
    for i in range(5):
        engine.append(topic, 0, [Record(f"k{j}".encode(), bytes([i]) * 300) for j in range(3)])
    engine.close()
    part_dir = log_dir / "topics" / topic / "0"
    [segment] = [p for p in part_dir.glob("*.log") if p.stat().st_size > 0]
    data = bytearray(segment.read_bytes())
    (first_size,) = struct.unpack_from("<I", data, 8)  # u32 batch size after the u64 base offset
    assert first_size > 56 + 600 and len(data) > first_size
    middle = 56 + (first_size - 56) // 2
    data[middle] ^= 0xFF
    segment.write_bytes(bytes(data))

    result = cli(log_dir, "check")
    assert result.exit_code == 1, result.output
    problems = result.stdout.splitlines()
    assert problems, "check printed no problem"
    assert any(segment.name in line for line in problems), problems
    assert all(line.startswith(f"{topic}-0 ") for line in problems), problems
    assert "ok:" not in result.stdout

    dump = cli(log_dir, "dump", topic)  # reading the damaged batch is a clean error too
    assert_clean_error(dump, "checksum")


def test_check_reports_a_manifest_that_is_not_utf8(
    engine: EmbeddedLog, log_dir: Path, topic: str
) -> None:
    engine.create_topic(topic)
    engine.append(topic, 0, [Record(b"k", b"v")])
    engine.close()
    manifest = log_dir / "topics" / topic / "0" / "manifest.json"
    manifest.write_bytes(manifest.read_bytes() + b"\xfe")
    result = cli(log_dir, "check")
    assert result.exit_code == 1, result.output
    assert any(
        f"{topic}-0 manifest.json: unreadable" in line for line in result.stdout.splitlines()
    )
    assert_clean_error(cli(log_dir, "dump", topic), "manifest")
