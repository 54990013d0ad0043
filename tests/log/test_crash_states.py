"""The crash-state model of tests/log/crash_states.py, checked on small recordings."""

from __future__ import annotations

from pathlib import Path

from tests.log.crash_states import PAGE, SECTOR, FsOp, crash_states, materialize

DATA = bytes(range(256)) * 40  # 10,240 bytes: two full pages and a half


def _synced_file() -> list[FsOp]:
    return [
        FsOp("mkdir", "t"),
        FsOp("dirsync", ""),
        FsOp("create", "t/seg"),
        FsOp("dirsync", "t"),
        FsOp("write", "t/seg", 0, DATA),
        FsOp("fsync", "t/seg"),
        FsOp("write", "t/seg", len(DATA), b"tail" * 300),
    ]


def test_synced_data_is_in_every_state_after_its_fsync() -> None:
    ops = _synced_file()
    states = list(crash_states(ops))
    after_sync = [d for what, d in states if int(what.split()[1].rstrip(",")) >= 6]
    assert after_sync and all(d.files()["t/seg"][: len(DATA)] == DATA for d in after_sync)


def test_an_unsynced_write_may_be_lost_or_torn_at_sector_and_page_boundaries() -> None:
    ops = _synced_file()
    tail = ops[-1]
    seen = {
        len(d.files()["t/seg"]) - len(DATA)
        for what, d in crash_states(ops, max_tears=100)
        if what.startswith("prefix 7")
    }
    end = tail.offset + len(tail.data)
    boundaries = {b - tail.offset for u in (SECTOR, PAGE) for b in range(0, end, u)}
    expected = {0, len(tail.data)} | {c for c in boundaries if 0 < c < len(tail.data)}
    assert seen == expected


def test_a_rename_or_create_without_a_directory_sync_may_be_lost() -> None:
    ops = [
        FsOp("create", "manifest.tmp"),
        FsOp("write", "manifest.tmp", 0, b"new"),
        FsOp("fsync", "manifest.tmp"),
        FsOp("rename", "manifest.tmp", dest="manifest"),
    ]
    names = {frozenset(d.files()) for what, d in crash_states(ops) if what.startswith("prefix 4")}
    assert frozenset({"manifest"}) in names
    assert frozenset({"manifest.tmp"}) in names  # the rename lost
    assert frozenset() in names  # the create lost too: never synced in its directory
    synced = [*ops, FsOp("dirsync", "")]
    last = [d.files() for what, d in crash_states(synced) if what.startswith("prefix 5")]
    assert last == [{"manifest": b"new"}]


def test_a_lost_directory_takes_its_files_with_it(tmp_path: Path) -> None:
    ops = [
        FsOp("mkdir", "topic"),
        FsOp("create", "topic/f"),
        FsOp("dirsync", "topic"),
        FsOp("write", "topic/f", 0, b"x"),
        FsOp("fsync", "topic/f"),
    ]
    lost = [
        d
        for what, d in crash_states(ops)
        if what == "prefix 5, op 0 (mkdir topic) not in its directory"
    ]
    assert len(lost) == 1 and lost[0].files() == {} and "topic" not in lost[0].dirs
    full = next(d for what, d in crash_states(ops) if what == "prefix 5")
    materialize(full, tmp_path / "root")
    assert (tmp_path / "root" / "topic" / "f").read_bytes() == b"x"


def test_a_directory_renamed_without_a_sync_may_keep_its_old_name() -> None:
    ops = [
        FsOp("mkdir", "tmp"),
        FsOp("create", "tmp/f"),
        FsOp("write", "tmp/f", 0, b"x"),
        FsOp("fsync", "tmp/f"),
        FsOp("dirsync", "tmp"),
        FsOp("dirsync", ""),
        FsOp("rename", "tmp", dest="final"),
        FsOp("write", "final/f", 1, b"y"),
        FsOp("fsync", "final/f"),
    ]
    last = {frozenset(d.files().items()) for w, d in crash_states(ops) if w.startswith("prefix 9")}
    assert frozenset({("final/f", b"xy")}) in last
    assert frozenset({("tmp/f", b"xy")}) in last  # the rename lost; the synced write kept
    synced = [*ops, FsOp("dirsync", "")]
    assert [d.files() for w, d in crash_states(synced) if w.startswith("prefix 10")] == [
        {"final/f": b"xy"}
    ]


def test_a_link_is_a_second_name_and_is_lost_like_a_create() -> None:
    ops = [
        FsOp("create", "a.tmp"),
        FsOp("write", "a.tmp", 0, b"m"),
        FsOp("fsync", "a.tmp"),
        FsOp("link", "a.tmp", dest="a"),
        FsOp("unlink", "a.tmp"),
    ]
    names = {frozenset(d.files()) for w, d in crash_states(ops) if w.startswith("prefix 5")}
    assert frozenset({"a"}) in names
    assert frozenset({"a", "a.tmp"}) in names  # the unlink lost, the link kept
    assert frozenset() in names  # the link lost, the unlink kept: the file has no name
