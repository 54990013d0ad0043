"""``kafkakv map backup`` and ``kafkakv map restore`` on real logs (no mocks): the embedded log
in a temporary directory, and the test Kafka cluster for the round trip between logs."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

import kafkakv
from kafkakv.cli.main import main
from kafkakv.dev import Cluster
from kafkakv.map.backup import read_header, read_pairs
from tests.cli.test_cli_map import assert_clean_error, ok
from tests.conftest import KAFKA_TIMEOUT


@pytest.fixture
def name() -> str:
    """A map name unique to the test."""
    return f"m-{uuid.uuid4().hex[:10]}"


def cli(log: Path | str, *args: str) -> Result:
    """Run ``kafkakv map -p LOG ARGS``, with KAFKAKV_LOG unset."""
    return CliRunner().invoke(main, ["map", "-p", str(log), *args], env={"KAFKAKV_LOG": None})


def fill(log: Path | str, name: str, pairs: dict[Any, Any], **options: Any) -> None:
    with kafkakv.connect(log, **_waits(log)) as db:
        db.map(name, **options, **_waits(log)).put_all(pairs)


def contents(log: Path | str, name: str, **options: Any) -> dict[Any, Any]:
    with kafkakv.connect(log, **_waits(log)) as db:
        return dict(db.map(name, create=False, **options, **_waits(log)).items())


def _waits(log: Path | str) -> dict[str, Any]:
    return {"timeout": KAFKA_TIMEOUT} if str(log).startswith("kafka://") else {}


@pytest.fixture
def saved(tmp_path: Path, name: str) -> Path:
    """A backup, made with the command, of map ``name`` (3 partitions) holding a, b and c."""
    fill(tmp_path / "source", name, {"a": 1, "b": [2], "c": {"3": None}}, partitions=3)
    out = ok(cli(tmp_path / "source", "backup", name, str(tmp_path / "saved")))
    assert out.startswith(f"backed up 3 pairs of map {name!r} at cursor 0:")
    return tmp_path / "saved"


def test_backup_then_restore_into_a_new_log(tmp_path: Path, name: str, saved: Path) -> None:
    header = read_header(saved)
    assert (header.map, header.partitions, header.pairs) == (name, 3, 3)
    out = ok(cli(tmp_path / "new", "restore", "copy", str(saved)))
    assert out == (
        f"restored 3 pairs into map 'copy' (0 overwritten) from a backup of map {name!r} at "
        f"cursor {header.cursor}; its codecs: --key-codec str --value-codec json\n"
    )
    assert contents(tmp_path / "new", "copy") == {"a": 1, "b": [2], "c": {"3": None}}
    with kafkakv.connect(tmp_path / "new") as db:
        assert db.map("copy", create=False).partition_count == 3


def test_backup_names_the_codecs_given_and_copies_the_bytes(tmp_path: Path, name: str) -> None:
    fill(tmp_path / "log", name, {1: b"\xff\x00"}, key_codec="int", value_codec="bytes")
    args = ("backup", name, str(tmp_path / "f"), "--key-codec", "int", "--value-codec", "bytes")
    ok(cli(tmp_path / "log", *args))
    header = read_header(tmp_path / "f")
    assert (header.key_codec, header.value_codec) == ("int", "bytes")
    ok(cli(tmp_path / "log", "restore", "copy", str(tmp_path / "f")))
    assert contents(tmp_path / "log", "copy", key_codec="int", value_codec="bytes") == {
        1: b"\xff\x00"
    }


def test_restore_refuses_a_map_with_keys_unless_replace(
    tmp_path: Path, name: str, saved: Path
) -> None:
    fill(tmp_path / "log", "target", {"b": "old", "x": "other"}, partitions=2)
    result = cli(tmp_path / "log", "restore", "target", str(saved))
    assert_clean_error(result, "map 'target' holds 2 keys", "--replace")
    assert contents(tmp_path / "log", "target") == {"b": "old", "x": "other"}
    out = ok(cli(tmp_path / "log", "restore", "target", str(saved), "--replace"))
    assert "restored 3 pairs into map 'target' (1 overwritten, 1 removed)" in out
    assert contents(tmp_path / "log", "target") == {"a": 1, "b": [2], "c": {"3": None}}


def test_restore_creates_the_map_with_partitions_given(tmp_path: Path, saved: Path) -> None:
    ok(cli(tmp_path / "log", "restore", "five", str(saved), "--partitions", "5"))
    with kafkakv.connect(tmp_path / "log") as db:
        five = db.map("five", create=False)
        assert five.partition_count == 5 and len(five) == 3


def test_restore_takes_the_backups_creation_options_or_the_ones_given(
    tmp_path: Path, name: str
) -> None:
    fill(tmp_path / "log", name, {"{t}a": 1, "{t}b": 2}, partitions=3, hash_tags=True)
    ok(cli(tmp_path / "log", "backup", name, str(tmp_path / "f")))  # as the map was created
    assert read_header(tmp_path / "f").hash_tags
    ok(cli(tmp_path / "log", "restore", "tagged", str(tmp_path / "f")))
    assert contents(tmp_path / "log", "tagged", hash_tags=True) == {"{t}a": 1, "{t}b": 2}
    fill(tmp_path / "log", "plain", {"x": 0}, partitions=3)
    result = cli(tmp_path / "log", "restore", "plain", str(tmp_path / "f"), "--replace")
    assert_clean_error(result, "created with hash_tags=False")
    ok(
        cli(
            tmp_path / "log", "restore", "plain", str(tmp_path / "f"), "--replace", "--no-hash-tags"
        )
    )
    assert contents(tmp_path / "log", "plain") == {"{t}a": 1, "{t}b": 2}


def test_errors_are_clean_lines_with_exit_code_2(tmp_path: Path, name: str, saved: Path) -> None:
    log = tmp_path / "log"
    assert_clean_error(cli(log, "restore", "t", str(tmp_path / "missing")), "cannot read backup")
    (tmp_path / "text").write_text("hello\n")
    assert_clean_error(cli(log, "restore", "t", str(tmp_path / "text")), "not a kafkakv map")
    data = saved.read_bytes()
    (tmp_path / "cut").write_bytes(data[: data.rindex(b"\n", 0, -1) + 1])
    assert_clean_error(cli(log, "restore", "t", str(tmp_path / "cut")), "truncated: 2 pairs")
    (tmp_path / "flipped").write_bytes(data.replace(b'["Y', b'["Z', 1))
    assert_clean_error(cli(log, "restore", "t", str(tmp_path / "flipped")), "checksum")
    with kafkakv.connect(log) as db, pytest.raises(kafkakv.errors.UnknownMapError):
        db.map("t", create=False)  # nothing created by any of them

    source = tmp_path / "source"
    assert_clean_error(cli(source, "backup", "nosuch", str(tmp_path / "b")), "no map 'nosuch'")
    result = cli(source, "backup", name, str(tmp_path / "no" / "dir" / "f"))
    assert_clean_error(result, "cannot write backup", "No such file or directory")
    assert not (tmp_path / "b").exists()
    for args in (("restore", "t", str(saved), "--partitions", "0"), ("backup", name)):
        usage = cli(source, *args)
        assert usage.exit_code == 2 and "Traceback" not in usage.output


def test_no_progress_bar_off_a_terminal(tmp_path: Path, name: str, saved: Path) -> None:
    """CliRunner's stderr is no terminal: nothing but the summary on stdout."""
    result = cli(tmp_path / "log", "restore", name, str(saved))
    assert result.exit_code == 0 and result.stderr == ""
    result = cli(tmp_path / "log", "backup", name, str(tmp_path / "again"))
    assert result.exit_code == 0 and result.stderr == ""


def test_a_progress_bar_on_a_terminal(tmp_path: Path, name: str) -> None:
    """With stderr on a pseudo-terminal, each stage draws a bar there; stdout has the
    summary only."""
    fill(tmp_path / "log", name, {f"k{i}": i for i in range(50_000)})
    backup = _on_a_terminal(tmp_path / "log", "backup", name, str(tmp_path / "f"))
    assert "writing the backup" in backup and "50000/50000" in backup
    restore = _on_a_terminal(tmp_path / "log", "restore", name, str(tmp_path / "f"), "--replace")
    assert "checking the backup" in restore and "restoring" in restore


def _on_a_terminal(log: Path, *args: str) -> str:
    """Run ``kafkakv map -p LOG ARGS`` with stderr on a pseudo-terminal; return stderr."""
    primary, secondary = pty.openpty()
    env = {**os.environ, "TERM": "xterm", "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("KAFKAKV_LOG", None)
    with subprocess.Popen(
        [sys.executable, "-m", "kafkakv", "map", "-p", str(log), *args],
        stdout=subprocess.PIPE,
        stderr=secondary,
        env=env,
    ) as process:
        os.close(secondary)
        drawn = b""
        while True:
            try:
                chunk = os.read(primary, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            drawn += chunk
        assert process.stdout is not None
        stdout = process.stdout.read().decode()
        assert process.wait() == 0, (stdout, drawn)
    os.close(primary)
    assert stdout.count("\n") == 1 and "\x1b" not in stdout
    return drawn.decode(errors="replace")


def test_backup_and_restore_between_the_embedded_log_and_kafka(
    kafka_cluster: Cluster, tmp_path: Path, name: str
) -> None:
    kafka = "kafka://" + kafka_cluster.bootstrap
    pairs = {f"k{i}": {"i": i} for i in range(1000)}
    fill(tmp_path / "first", name, pairs, partitions=3)
    ok(cli(tmp_path / "first", "backup", name, str(tmp_path / "one")))
    timeout = ("--request-timeout", str(KAFKA_TIMEOUT))
    ok(
        CliRunner().invoke(
            main, ["map", "-p", kafka, *timeout, "restore", name, str(tmp_path / "one")]
        )
    )
    assert contents(kafka, name) == pairs
    ok(
        CliRunner().invoke(
            main, ["map", "-p", kafka, *timeout, "backup", name, str(tmp_path / "two")]
        )
    )
    assert dict(read_pairs(tmp_path / "two")) == dict(read_pairs(tmp_path / "one"))
    ok(cli(tmp_path / "second", "restore", name, str(tmp_path / "two"), "--partitions", "1"))
    assert contents(tmp_path / "second", name) == pairs
