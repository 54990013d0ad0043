"""Backups and restores (:mod:`kafkakv.map.backup`) on every log.

The oracle for what a backup holds is the source replica's stored bytes
(``encoded_snapshot``), and for where it was taken the change feed: the backup's pairs plus
the changes told after its cursor must give the map's final state. Damaged files are made by
cutting and flipping real backups, and must be refused before anything is written.
"""

from __future__ import annotations

import base64
import doctest
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import kafkakv
import kafkakv.map.backup
from kafkakv.dev import Cluster
from kafkakv.errors import (
    BackupError,
    BackupIOError,
    ClosedError,
    CorruptBackupError,
    MapNotEmptyError,
    NotABackupError,
    TopicMismatchError,
    UnknownMapError,
)
from kafkakv.map.backup import (
    FORMAT,
    BackupHeader,
    backup,
    checksum,
    read_header,
    read_pairs,
    restore,
    verify,
)
from tests.conftest import KAFKA_TIMEOUT
from tests.kafka_cluster import unique_topic
from tests.map.conftest import OpenMap, log_options

one_store = pytest.mark.parametrize("store_kind", ["dict"])
"""A backup reads the store through encoded_snapshot, the same call on every store: the
round trip runs on every store, the rest on one."""


@pytest.fixture
def db(target: str) -> Iterator[kafkakv.Database]:
    """A database of its own on the test's log, for restores."""
    with kafkakv.connect(target, **log_options(target)) as opened:
        yield opened


@pytest.fixture
def unique(map_name: str) -> Callable[[str], str]:
    """``unique(tag)``: a name of the test's own (the Kafka cluster is shared by the session)."""
    return lambda tag: f"{map_name}-{tag}"


def stored(db: kafkakv.Database, name: str) -> dict[bytes, bytes]:
    """The bytes map ``name`` holds, as a fresh replica loads them from the log."""
    with db.map(name, key_codec="bytes", value_codec="bytes", create=False) as m:
        return dict(m.encoded_snapshot().items)


def test_doctests_of_the_module_pass() -> None:
    failed, tried = doctest.testmod(kafkakv.map.backup)
    assert tried >= 5 and failed == 0


# -- round trips --------------------------------------------------------------------------------


def test_a_backup_restores_every_pair_byte_for_byte(
    open_map: OpenMap, db: kafkakv.Database, tmp_path: Path, unique: Callable[[str], str]
) -> None:
    """Keys and values as encoded, those the backing-up replica cannot decode included; the
    header names the map, its partitions, the cursor, the codecs and the count."""
    raw = open_map(partitions=3, key_codec="bytes", value_codec="bytes")
    raw.put_all({b"bad-json": b"\xff\x00not json", "é".encode(): b'"accent"'})
    m = open_map(partitions=3)  # str / json: cannot read b"bad-json"'s value
    m.put_all({f"k{i}": {"i": i, "s": "x" * (i % 7)} for i in range(500)})
    m.sync()
    before = dict(m.encoded_snapshot().items)
    assert len(before) == 502 and len(m) == 501
    header = backup(m, tmp_path / "m.backup")
    assert (header.map, header.partitions, header.pairs) == (m.name, 3, 502)
    assert (header.key_codec, header.value_codec) == ("str", "json")
    assert header.cursor == m.cursor()
    assert read_header(tmp_path / "m.backup") == header == verify(tmp_path / "m.backup")
    assert dict(read_pairs(tmp_path / "m.backup")) == before

    report = restore(db, unique("copy"), tmp_path / "m.backup")
    assert (report.put, report.overwritten, report.removed) == (502, 0, 0)
    assert report.header == header
    assert stored(db, unique("copy")) == before
    with db.map(unique("copy"), create=False) as copy:
        assert copy.partition_count == 3
        assert dict(copy.items()) == dict(m.items())


def test_a_backup_moves_from_the_embedded_log_to_kafka_and_back(
    kafka_cluster: Cluster, tmp_path: Path
) -> None:
    """Embedded (3 partitions) -> Kafka (3) -> embedded (2): the same bytes all the way."""
    name, kafka = unique_topic("backup"), "kafka://" + kafka_cluster.bootstrap
    with kafkakv.connect(tmp_path / "first") as db:
        m = db.map(name, partitions=3)
        m.put_all({f"k{i}": {"n": i, "t": "é" * (i % 5)} for i in range(3000)})
        db.map(name, key_codec="bytes", value_codec="bytes")[b"\xfe\xff"] = b"\x00raw"
        m.sync()
        expected = dict(m.encoded_snapshot().items)
        backup(m, tmp_path / "from-embedded")
    with kafkakv.connect(kafka, timeout=KAFKA_TIMEOUT) as db:
        report = restore(db, name, tmp_path / "from-embedded", timeout=KAFKA_TIMEOUT)
        assert report.put == 3001
        with db.map(name, create=False, timeout=KAFKA_TIMEOUT) as m:
            assert m.partition_count == 3
            assert dict(m.encoded_snapshot().items) == expected
            header = backup(m, tmp_path / "from-kafka")
    assert header.pairs == 3001 and header.map == name
    assert dict(read_pairs(tmp_path / "from-kafka")) == expected
    with kafkakv.connect(tmp_path / "second") as db:
        restore(db, name, tmp_path / "from-kafka", partitions=2)
        assert stored(db, name) == expected
        with db.map(name, create=False) as m:
            assert m.partition_count == 2 and m.check(deep=True) == []


@one_store
def test_an_empty_map_backs_up_and_restores(
    open_map: OpenMap, db: kafkakv.Database, tmp_path: Path, unique: Callable[[str], str]
) -> None:
    m = open_map(partitions=2)
    header = backup(m, tmp_path / "empty")
    assert header.pairs == 0 and header.checksum == checksum([])
    assert restore(db, unique("copy"), tmp_path / "empty").put == 0
    assert stored(db, unique("copy")) == {}


@one_store
def test_two_backups_of_one_state_are_the_same_file(open_map: OpenMap, tmp_path: Path) -> None:
    """Pairs in key order, so equal maps give equal files (but for the time of creation)."""
    m = open_map(partitions=3)
    m.put_all({f"k{i}": i for i in range(300)})
    backup(m, tmp_path / "a")
    backup(open_map(partitions=3), tmp_path / "b")  # another replica, another dict order
    lines_a = (tmp_path / "a").read_bytes().splitlines()
    lines_b = (tmp_path / "b").read_bytes().splitlines()
    assert lines_a[1:] == lines_b[1:]
    keys = [base64.b64decode(json.loads(line)[0]) for line in lines_a[1:]]
    assert keys == sorted(keys) and len(keys) == 300
    header_a, header_b = json.loads(lines_a[0]), json.loads(lines_b[0])
    header_a.pop("created"), header_b.pop("created")
    assert header_a == header_b


# -- consistency --------------------------------------------------------------------------------


@one_store
def test_a_backup_taken_under_writes_is_the_state_at_its_cursor(
    open_map: OpenMap, tmp_path: Path
) -> None:
    """While another replica writes, the backup's pairs plus the changes after its cursor
    give exactly the final state: the pairs and the cursor are one position."""
    m = open_map(partitions=3, flush_period=1_000_000)
    writer = open_map(partitions=3, flush_period=1_000_000)
    m.put_all({f"k{i}": 0 for i in range(50_000)})
    stop, written = threading.Event(), []

    def write() -> None:
        n = 0
        while not stop.is_set() or n < 50:
            n += 1
            writer.put_all({f"k{(n * 7 + j) % 50_000}": n for j in range(40)})
            if n % 3 == 0:
                writer.remove(f"k{n % 50_000}")
            written.append(n)

    thread = threading.Thread(target=write)
    thread.start()
    try:
        headers = []
        for i in range(4):
            m.sync()
            headers.append(backup(m, tmp_path / f"b{i}"))
    finally:
        stop.set()
        thread.join()
    writer.sync()
    m.sync()
    final = dict(m.items())
    assert written and len({str(h.cursor) for h in headers}) > 1  # taken between writes
    for i, header in enumerate(headers):
        state = {k.decode(): json.loads(v) for k, v in read_pairs(tmp_path / f"b{i}")}
        with m.changes(since=header.cursor, timeout=0.5) as feed:
            for change in feed:
                if change.new is None:
                    del state[change.key]
                else:
                    state[change.key] = change.new
        assert state == final, f"backup {i} at {header.cursor}"


@one_store
def test_a_sharded_replica_or_a_closed_map_is_not_backed_up(
    open_map: OpenMap, tmp_path: Path
) -> None:
    m = open_map(partitions=2)
    m["a"] = 1
    with pytest.raises(BackupError, match=r"holds partitions \[1\] of 2"):
        backup(open_map(partitions=2, shard=[1]), tmp_path / "shard")
    m.close()
    with pytest.raises(ClosedError):
        backup(m, tmp_path / "closed")
    assert not (tmp_path / "shard").exists() and not (tmp_path / "closed").exists()


# -- restore: empty, replace, partitions --------------------------------------------------------


@pytest.fixture
def saved(open_map: OpenMap, tmp_path: Path) -> Path:
    """A backup of a 2-partition map holding a=1, b=2, c=3."""
    m = open_map(partitions=2)
    m.put_all({"a": 1, "b": 2, "c": 3})
    backup(m, tmp_path / "abc")
    return tmp_path / "abc"


@one_store
def test_a_map_with_keys_is_refused_unless_replace(
    db: kafkakv.Database, saved: Path, unique: Callable[[str], str]
) -> None:
    target = db.map(unique("target"), partitions=2)
    target.put_all({"b": 20, "x": 9})
    with pytest.raises(MapNotEmptyError, match="holds 2 keys") as caught:
        restore(db, unique("target"), saved)
    assert caught.value.count == 2
    target.sync()
    assert dict(target.items()) == {"b": 20, "x": 9}  # nothing written

    report = restore(db, unique("target"), saved, replace=True)
    assert (report.put, report.overwritten, report.removed) == (3, 1, 1)
    target.sync()
    assert dict(target.items()) == {"a": 1, "b": 2, "c": 3}


@one_store
def test_restore_creates_the_map_with_the_backups_partitions_or_fills_another_count(
    db: kafkakv.Database, saved: Path, unique: Callable[[str], str]
) -> None:
    """A missing map is created with the backup's partition count (or ``partitions``); an
    existing one with another count takes the pairs, each in the partition of its key."""
    restore(db, unique("created"), saved)
    restore(db, unique("five"), saved, partitions=5)
    db.map(unique("one"), partitions=1).close()
    restore(db, unique("one"), saved)
    for name, count in ((unique("created"), 2), (unique("five"), 5), (unique("one"), 1)):
        with db.map(name, create=False) as m:
            assert m.partition_count == count
            assert dict(m.items()) == {"a": 1, "b": 2, "c": 3}
            assert m.check(deep=True) == []  # each key where the log puts it
            for key in "abc":
                with db.map(name, create=False, shard=[m.partition_of(key)]) as shard:
                    assert shard[key] == ord(key) - ord("a") + 1


@one_store
def test_the_creation_options_go_with_the_backup(
    open_map: OpenMap, db: kafkakv.Database, tmp_path: Path, unique: Callable[[str], str]
) -> None:
    """hash_tags and versions are in the header; a restore creates the map with them (or
    with the ones given), and an existing map must have been created with the ones given."""
    m = open_map(partitions=4, hash_tags=True, versions=True, store="dict")
    m.put_all({"{u1}a": 1, "{u1}b": 2, "plain": 3})
    header = backup(m, tmp_path / "tagged")
    assert (header.hash_tags, header.versions) == (True, True)
    restore(db, unique("copy"), tmp_path / "tagged")
    with pytest.raises(TopicMismatchError, match="hash_tags"):
        db.map(unique("copy"), create=False, hash_tags=False)
    with db.map(unique("copy"), create=False) as copy:  # as it was created
        assert copy.creation_options == {"hash_tags": True, "versions": True, "expiry": False}
        assert copy.transaction(expect={"{u1}a": 1}, put={"{u1}b": 20})  # one partition
        assert copy.get_versioned("plain") is not None
        assert dict(copy.items()) == {"{u1}a": 1, "{u1}b": 20, "plain": 3}

    with db.map(unique("plain"), partitions=4) as written:  # settled: no longer untouched
        written["x"] = 0
    with pytest.raises(TopicMismatchError, match="hash_tags"):
        restore(db, unique("plain"), tmp_path / "tagged", replace=True)
    restore(db, unique("plain"), tmp_path / "tagged", replace=True, hash_tags=False, versions=False)
    with db.map(unique("plain"), create=False) as plain:
        assert dict(plain.items()) == {"{u1}a": 1, "{u1}b": 2, "plain": 3}
    plain_header = backup(open_map(unique("untagged")), tmp_path / "untagged")
    assert (plain_header.hash_tags, plain_header.versions) == (False, False)


@one_store
def test_restore_into_a_map_sharing_topics(
    db: kafkakv.Database, saved: Path, unique: Callable[[str], str]
) -> None:
    db.map(unique("neighbour"), topics=unique("shared"), partitions=2)["a"] = "kept"
    restore(db, unique("mine"), saved, topics=unique("shared"))
    with db.map(unique("mine"), topics=unique("shared"), create=False) as mine:
        assert dict(mine.items()) == {"a": 1, "b": 2, "c": 3}
    with db.map(unique("neighbour"), topics=unique("shared"), create=False) as neighbour:
        assert dict(neighbour.items()) == {"a": "kept"}


@one_store
def test_progress_is_reported_per_stage(
    open_map: OpenMap, db: kafkakv.Database, tmp_path: Path, unique: Callable[[str], str]
) -> None:
    m = open_map()
    m.put_all({f"k{i}": i for i in range(40_000)})
    calls: list[tuple[str, int, int]] = []
    backup(m, tmp_path / "big", progress=lambda *call: calls.append(call))
    assert calls[-1] == ("write", 40_000, 40_000) and len(calls) == 3
    target = db.map(unique("target"))
    target["gone"] = 0
    calls.clear()
    restore(
        db, unique("target"), tmp_path / "big", replace=True, progress=lambda *c: calls.append(c)
    )
    stages = [c[0] for c in calls]
    assert stages == sorted(stages, key=["verify", "restore", "remove"].index)
    assert ("verify", 40_000, 40_000) in calls and ("restore", 40_000, 40_000) in calls
    assert calls[-1] == ("remove", 1, 1)


# -- files: atomic writes, damage, foreign files ------------------------------------------------


@one_store
def test_a_failed_backup_leaves_the_previous_file_and_no_temporary(
    open_map: OpenMap, tmp_path: Path
) -> None:
    m = open_map()
    m["old"] = 1
    backup(m, tmp_path / "file")
    previous = (tmp_path / "file").read_bytes()
    m.put_all({f"k{i}": i for i in range(40_000)})

    def interrupt(stage: str, done: int, total: int) -> None:
        raise KeyboardInterrupt  # in the middle of writing the lines

    with pytest.raises(KeyboardInterrupt):
        backup(m, tmp_path / "file", progress=interrupt)
    assert (tmp_path / "file").read_bytes() == previous
    assert [p.name for p in tmp_path.iterdir() if p.is_file()] == ["file"]
    with pytest.raises(BackupIOError, match="cannot write backup"):
        backup(m, tmp_path / "no" / "such" / "dir")
    with pytest.raises(BackupIOError):
        backup(m, tmp_path)  # a directory
    assert (tmp_path / "file").read_bytes() == previous


def _damaged(saved: Path, tmp_path: Path) -> Iterator[tuple[str, bytes, type[Exception], str]]:
    """(what, file content, error, message fragment) for damage done to a real backup."""
    data = saved.read_bytes()
    header, *lines = data.split(b"\n")
    assert lines[-1] == b"" and len(lines) == 4
    yield "cut in the header", data[: len(header) // 2], CorruptBackupError, "header"
    yield "header only", header + b"\n", CorruptBackupError, "truncated: 0 pairs of the 3"
    yield (
        "cut at a line end",
        data[: data.rindex(b"\n", 0, -1) + 1],
        CorruptBackupError,
        ("truncated: 2 pairs"),
    )
    yield "cut in a line", data[:-5], CorruptBackupError, "line 4"
    yield "last newline lost", data[:-1], CorruptBackupError, "no end of line"
    flipped = bytearray(data)
    flipped[len(header) + 4] ^= 0x01  # a base64 letter of the first key becomes another
    yield "a flipped byte", bytes(flipped), CorruptBackupError, "checksum"
    yield "a line too many", data + lines[0] + b"\n", CorruptBackupError, "more pairs"
    yield "not base64", data.replace(lines[1], b'["!!","AA=="]'), CorruptBackupError, "line 3"
    yield "not a pair", data.replace(lines[1], b'{"k": 1}'), CorruptBackupError, "line 3"
    bad_count = data.replace(b'"pairs":3', b'"pairs":"3"')
    yield "a damaged field", bad_count, CorruptBackupError, "field 'pairs'"
    bad_cursor = header.replace(b'"cursor":"', b'"cursor":"x')
    yield "a damaged cursor", data.replace(header, bad_cursor), CorruptBackupError, "cursor"
    yield "version 2", data.replace(b'"version":1', b'"version":2'), NotABackupError, ("version 2")
    yield "empty", b"", NotABackupError, "empty"
    yield "text", b"hello\nworld\n", NotABackupError, "not a kafkakv map backup"
    yield "json", b'{"format": "other"}\n', NotABackupError, "not a kafkakv map backup"
    yield "binary", bytes(range(256)) * 8000, NotABackupError, "not a kafkakv map backup"


@one_store
def test_damaged_or_foreign_files_are_refused_before_anything_is_written(
    db: kafkakv.Database, saved: Path, tmp_path: Path, unique: Callable[[str], str]
) -> None:
    assert verify(saved).pairs == 3
    for what, content, error, fragment in _damaged(saved, tmp_path):
        path = tmp_path / "damaged"
        path.write_bytes(content)
        with pytest.raises(error, match=fragment):
            restore(db, unique("target"), path)
        with pytest.raises(error):
            verify(path)
        with pytest.raises(UnknownMapError):  # nothing created, let alone written
            db.map(unique("target"), create=False)
        assert what


def test_missing_files_raise_backup_io_errors(
    db: kafkakv.Database, tmp_path: Path, unique: Callable[[str], str]
) -> None:
    for call in (read_header, verify, lambda p: restore(db, unique("target"), p)):
        with pytest.raises(BackupIOError, match=r"cannot read backup .*missing") as caught:
            call(tmp_path / "missing")
        assert isinstance(caught.value, OSError)
        assert isinstance(caught.value.__cause__, FileNotFoundError)
    with pytest.raises(BackupIOError):
        verify(tmp_path)  # a directory
    with pytest.raises(UnknownMapError):
        db.map(unique("target"), create=False)


def test_a_header_written_by_another_tool_is_read() -> None:
    """Spacing, field order and unknown fields do not matter; pairs are checked by bytes."""
    line = (
        b'{"created": "2026-01-01T00:00:00Z", "extra": [1], "version": 1, "pairs": 1, '
        b'"format": "' + FORMAT.encode() + b'", "map": "m", "partitions": 2, '
        b'"cursor": "0:5,1:0", "key_codec": "str", "value_codec": "bytes", '
        b'"checksum": "' + checksum([(b"k", b"v")]).encode() + b'"}'
    )
    header = BackupHeader.parse(line)
    assert header.cursor[0] == 5 and header.partitions == 2 and header.value_codec == "bytes"
    for bad in (b'"partitions": 2', b'"pairs": 1'):
        with pytest.raises(CorruptBackupError):
            BackupHeader.parse(line.replace(bad, bad[:-1] + b"-1"))


def test_other_tools_pairs_with_other_spacing_verify(tmp_path: Path) -> None:
    pairs = [(b"\x00key", b""), (b"z", b"\xff" * 3)]
    header = BackupHeader(
        "m", 1, kafkakv.map.Cursor({0: 0}), "bytes", "bytes", 2, checksum(pairs), "now"
    )
    body = b"".join(
        b'[ "%s" ,  "%s" ]\r\n' % (base64.b64encode(k), base64.b64encode(v)) for k, v in pairs
    )
    (tmp_path / "f").write_bytes(header.to_line() + body)
    assert verify(tmp_path / "f") == header
    assert list(read_pairs(tmp_path / "f")) == pairs
