"""The change feed: ``m.cursor()``, ``m.changes(since)``, ``m.snapshot()``.

The oracle is a listener, which the replica calls in log order as it applies each change: a
feed must tell the same changes (per partition, in the same order) with cursors that resume
exactly after each one, whether it follows the replica live, replays the log from behind it,
or catches up after falling behind. A consumer killed with SIGKILL and restarted from its
stored cursor must see every change once.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kafkakv.errors import (
    ClosedError,
    ConfigError,
    CursorError,
    CursorExpiredError,
    DecodeError,
)
from kafkakv.map import Change, ChangeFeed
from kafkakv.map.feed import Cursor
from tests.map.conftest import OpenMap, embedded_only, shared_logs
from tests.map.test_map_protocol import _seed
from tests.waiting import wait_for

Seen = tuple[int, Any, Any, Any]  # partition, key, old, new


def _listen(m: Any) -> list[Seen]:
    heard: list[Seen] = []
    m.add_listener(lambda k, old, new, mine: heard.append((m.partition_of(k), k, old, new)))
    return heard


def _random_updates(m: Any, rng: random.Random, n: int) -> None:
    """``n`` rounds of puts, removes, compare-and-sets and batches over a few keys (many of
    them no change at all: a put of the same value, a failed compare)."""
    for _ in range(n):
        key, value = f"k{rng.randrange(12)}", rng.randrange(4)
        roll = rng.random()
        if roll < 0.45:
            m.put(key, value)
        elif roll < 0.6:
            m.remove(key)
        elif roll < 0.8:
            m.compare_and_set(key, rng.randrange(4), value)
        else:
            m.put_all([(f"k{rng.randrange(12)}", rng.randrange(4)) for _ in range(3)])


def _take(feed: ChangeFeed[Any, Any], count: int) -> list[Change[Any, Any]]:
    got = []
    for change in feed:
        got.append(change)
        if len(got) == count:
            break
    return got


def _seen(changes: list[Change[Any, Any]]) -> list[Seen]:
    return [(c.partition, c.key, c.old, c.new) for c in changes]


def _own(changes: list[Change[Any, Any]]) -> dict[int, list[tuple[Any, ...]]]:
    """Each partition's changes with their own part of the cursor (the other partitions'
    parts depend on how the partitions interleaved)."""
    out: dict[int, list[tuple[Any, ...]]] = {}
    for c in changes:
        p = c.partition
        out.setdefault(p, []).append((c.key, c.old, c.new, c.offset, c.cursor[p], c.cursor.skip(p)))
    return out


def _by_partition(items: list[Seen]) -> dict[int, list[Seen]]:
    out: dict[int, list[Seen]] = {}
    for item in items:
        out.setdefault(item[0], []).append(item)
    return out


one_store = pytest.mark.parametrize("store_kind", ["dict"])
"""The feed reads no store (the tap sees the bytes applied; a replay keeps its own dict):
every backend, one store."""


def _drain(feed: ChangeFeed[Any, Any]) -> list[Change[Any, Any]]:
    """Every change the feed has until it has none for its timeout."""
    return list(feed)


# -- following ---------------------------------------------------------------------------
@one_store
def test_a_live_feed_tells_what_the_listener_hears_with_cursors_that_resume(
    open_map: OpenMap,
) -> None:
    """Another replica's updates over 3 partitions (batches among them, whose one record
    changes several keys): the feed's changes are the listener's, in log order per
    partition; each cursor is one past its record, or inside it with the changes taken
    counted; once everything is taken the feed's cursor is the replica's."""
    rng = random.Random(_seed())
    reader = open_map(partitions=3, flush_period=100_000)
    writer = open_map(partitions=3, flush_period=100_000)
    heard = _listen(reader)
    start = reader.cursor()
    with reader.changes(timeout=0.5) as feed:
        _random_updates(writer, rng, 80)
        reader.sync()
        got = _drain(feed)
        assert _by_partition(_seen(got)) == _by_partition(heard)
        for before, change in zip([None, *got], got, strict=False):
            p, cursor = change.partition, change.cursor
            assert all(cursor[q] >= start[q] for q in start)
            same_record = before is not None and before[4:] == change[4:]
            if cursor[p] == change.offset:  # inside a record: the changes taken of it
                taken_before = before.cursor.skip(p) if same_record and before else 0
                assert cursor.skip(p) == taken_before + 1
            else:
                assert (cursor[p], cursor.skip(p)) == (change.offset + 1, 0)
        assert feed.cursor == reader.cursor()  # moved on past records that changed nothing
    assert any(c.cursor.skip(c.partition) for c in got), "no record changed two keys"


@one_store
def test_a_feed_from_any_stored_cursor_tells_exactly_the_changes_after_it(
    open_map: OpenMap,
) -> None:
    """Every cursor a feed handed out (inside batch records too), given to a fresh replica,
    which replays the log from its flush point to serve it, yields exactly the changes after
    it; the replica's own cursor yields none."""
    rng = random.Random(_seed())
    writer = open_map(partitions=2, flush_period=100_000)
    first = writer.cursor()
    with writer.changes(timeout=0.5) as feed:
        _random_updates(writer, rng, 60)
        everything = _drain(feed)
    assert len(everything) > 20
    later = open_map(partitions=2, flush_period=100_000)
    inside = [c.cursor for c in everything if c.cursor.skip(c.partition)]
    picks = [first, *inside[:3], *rng.sample([c.cursor for c in everything], 4)]
    for cursor in picks:
        at = 0 if cursor == first else [c.cursor for c in everything].index(cursor) + 1
        with later.changes(since=str(cursor), timeout=0.3) as resumed:
            got = list(resumed)
        assert _own(got) == _own(everything[at:]), cursor
    with later.changes(since=later.cursor(), timeout=0.3) as none:
        assert list(none) == []


@one_store
def test_a_cursor_a_flush_covered_raises_expired_and_a_snapshot_goes_on(
    open_map: OpenMap,
) -> None:
    """After a flush covers a cursor, changes(since=it) raises CursorExpiredError naming the
    partition and flush point; snapshot() gives the contents with a cursor from which the
    feed tells exactly the later changes."""
    m = open_map(flush_period=100_000)
    m.put_all({"a": 1, "b": 2})
    old = m.cursor()
    m["a"] = 3
    m.flush()
    with pytest.raises(CursorExpiredError) as caught:
        m.changes(since=old)
    assert caught.value.partition == 0 and caught.value.flushed >= old[0]
    assert "m.snapshot()" in str(caught.value)
    snap = m.snapshot()
    assert snap.items == {"a": 3, "b": 2} == dict(m)
    m["c"] = 4
    del m["b"]
    other = open_map(flush_period=100_000)
    with other.changes(since=snap.cursor, timeout=0.3) as feed:
        assert [(c.key, c.old, c.new) for c in feed] == [("c", None, 4), ("b", 2, None)]


@one_store
def test_bad_cursors_are_refused_with_cursor_errors(open_map: OpenMap) -> None:
    m = open_map(partitions=2)
    m["a"] = 1
    for text in ("", "x", "0:1", "0:1,1", "0:1,0:2", "0:-1,1:0", "0:1+,1:0", "0:1,1:0,2:0"):
        with pytest.raises(CursorError):
            m.changes(since=text)
    with pytest.raises(CursorError, match="past the end"):
        m.changes(since="0:1000,1:0")
    with pytest.raises(CursorError):
        m.changes(since=12)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        m.changes(timeout=-1)
    assert not m._state.taps  # nothing left attached by the refusals


@one_store
def test_a_feed_ends_after_its_timeout_and_stops_with_close_or_the_map(
    open_map: OpenMap,
) -> None:
    m = open_map()
    feed = m.changes(timeout=0.3)
    started = time.monotonic()
    assert list(feed) == []
    assert 0.25 <= time.monotonic() - started < 5
    feed.close()
    with pytest.raises(ClosedError):
        next(feed)
    assert not m._state.taps
    waiting = m.changes()  # for ever: until the map closes
    errors: list[BaseException] = []

    def consume() -> None:
        try:
            next(waiting)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=consume)
    thread.start()
    time.sleep(0.1)
    m.close()
    thread.join(timeout=10)
    assert not thread.is_alive() and isinstance(errors[0], ClosedError)


@one_store
def test_async_for_takes_changes_without_blocking_the_loop(open_map: OpenMap) -> None:
    """An ``async for`` over a feed sees changes written from another thread while the loop
    keeps running other tasks; a cursor behind the replica is replayed in a thread."""
    m = open_map(flush_period=100_000)
    m["before"] = 0
    behind = m.cursor()
    m["skipped?"] = 1

    async def main() -> tuple[list[Any], int, list[Any]]:
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.create_task(tick())
        writer = threading.Timer(0.3, lambda: [m.put(f"k{i}", i) for i in range(3)])
        writer.start()
        got = []
        with m.changes(timeout=1.0) as feed:
            async for change in feed:
                got.append((change.key, change.new))
        replayed = []
        with m.changes(since=behind, timeout=0.2) as feed:
            async for change in feed:
                replayed.append(change.key)
        ticker.cancel()
        return got, ticks, replayed

    got, ticks, replayed = asyncio.run(main())
    assert got == [("k0", 0), ("k1", 1), ("k2", 2)]
    assert ticks > 20  # the loop ran while the feed waited
    assert replayed == ["skipped?", "k0", "k1", "k2"]


@one_store
def test_a_consumer_far_behind_catches_up_by_replay_and_misses_nothing(
    open_map: OpenMap,
) -> None:
    """A feed that may queue only 5 changes, 200 changes behind: the tap lets go of it, it
    replays from its own position, taps again, and tells all 200 in order."""
    m = open_map(flush_period=100_000)
    feed: ChangeFeed[Any, Any] = ChangeFeed(m._engine, m._state, None, 0.3, buffer=5)
    for i in range(100):
        m[f"k{i % 7}"] = i
        if i == 50:
            first = next(feed)  # taken while the replica runs on
    m.put_all({f"b{i}": i for i in range(100)})
    rest = list(feed)
    got = [first, *rest]
    assert [(c.key, c.new) for c in got[:100]] == [(f"k{i % 7}", i) for i in range(100)]
    assert [(c.key, c.new) for c in got[100:]] == [(f"b{i}", i) for i in range(100)]
    assert feed.cursor == m.cursor()
    feed.close()


@one_store
def test_a_change_that_does_not_decode_raises_and_the_feed_goes_on(open_map: OpenMap) -> None:
    m = open_map(value_codec="bytes")
    reader = open_map(value_codec="int")  # the same map read with another codec
    with reader.changes(timeout=0.3) as feed:
        m["a"] = b"not an int"
        m["b"] = reader._values.encode(7)
        reader.sync()
        with pytest.raises(DecodeError, match="moved past it"):
            next(feed)
        assert [(c.key, c.new) for c in feed] == [("b", 7)]


# -- a consumer killed with SIGKILL ---------------------------------------------------------
@shared_logs
def test_a_consumer_killed_with_sigkill_resumes_from_its_cursor_exactly_once(
    target: str, map_name: str, tmp_path: Path
) -> None:
    """A consumer process (tests/map/_feed_consumer.py) writes each change with its cursor
    while another replica keeps writing single puts and batches over 2 partitions; it is
    killed with SIGKILL at random moments and restarted from its last line's cursor. In the
    end its lines are exactly the changes, each once, in log order per partition."""
    import kafkakv

    rng = random.Random(_seed())
    options = {"timeout": 60.0} if target.startswith("kafka://") else {}
    db = kafkakv.connect(target, **options)
    try:
        m = db.map(map_name, partitions=2, flush_period=1_000_000)
        heard = _listen(m)
        first = str(m.cursor())
        out = tmp_path / "changes.jsonl"
        stop = threading.Event()

        def write() -> None:
            i = 0
            while not stop.is_set():
                i += 1
                if i % 10 == 0:
                    m.put_all({f"k{rng.randrange(20)}": i * 100 + j for j in range(4)})
                else:
                    m.put(f"k{i % 20}", i)
                time.sleep(0.003)

        def lines() -> int:
            return out.read_bytes().count(b"\n") if out.exists() else 0

        def grown_by(n: int) -> Callable[[], bool]:
            goal = lines() + n
            return lambda: lines() >= goal

        def consumer() -> subprocess.Popen[str]:
            args = [sys.executable, "-m", "tests.map._feed_consumer", target, map_name]
            return subprocess.Popen(
                [*args, str(out), first], stdout=subprocess.PIPE, text=True, cwd=os.getcwd()
            )

        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        kills = 0
        try:
            for _ in range(4):
                proc = consumer()
                try:
                    wait_for(grown_by(20), 120, "the consumer to take changes")
                    time.sleep(rng.uniform(0, 0.2))
                finally:
                    proc.send_signal(signal.SIGKILL)
                    proc.wait(timeout=30)
                kills += 1
        finally:
            stop.set()
            writer.join(timeout=30)
        m.sync()
        proc = consumer()
        try:
            wait_for(lambda: lines() >= len(heard), 120, "the last consumer to catch up")
            time.sleep(0.3)  # a duplicate would come now
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        got = [json.loads(line) for line in out.read_text().splitlines()]
        told = [(g["p"], g["key"], g["old"], g["new"]) for g in got]
        assert kills == 4 and len(heard) > 100
        assert _by_partition(told) == _by_partition(heard)
    finally:
        db.close()


@one_store
@embedded_only
def test_closing_a_feed_while_another_thread_replays_its_backlog(open_map: OpenMap) -> None:
    """An async step replays a feed's backlog in a worker thread; a client that leaves
    cancels the step, not the thread, and the feed is closed while the thread is inside the
    replay. The close must not fail (it raised 'generator already executing'); the replay
    ends when the thread lets go of it, and the feed is closed."""
    m = open_map()
    feed = m.changes(timeout=0)
    inside, release = threading.Event(), threading.Event()
    ended: list[bool] = []

    def backlog() -> Any:
        try:
            inside.set()
            release.wait(10)
            yield []
        finally:
            ended.append(True)

    feed._backlog = backlog()
    errors: list[BaseException] = []

    def step() -> None:
        try:
            feed._poll()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=step)
    thread.start()
    assert inside.wait(10)
    try:
        feed.close()
    finally:
        release.set()
        thread.join(10)
    assert not errors, errors
    assert ended == [True]
    with pytest.raises(ClosedError):
        next(feed)


@pytest.mark.parametrize(
    ("offsets", "skips"),
    [({0: 0}, {0: 0}), ({0: 7, 3: 120}, {0: 0, 3: 2}), ({1: 98, 2: 5}, {1: 4, 2: 0})],
)
def test_a_feeds_own_cursor_equals_one_made_and_checked_from_the_same_position(
    offsets: dict[int, int], skips: dict[int, int]
) -> None:
    """A feed copies its position into each change's cursor without the checks (it keeps
    the position valid); the cursor must be the one the checked constructor makes."""
    made = Cursor._of_feed(offsets, skips)
    assert made == Cursor(offsets, skips) and str(made) == str(Cursor(offsets, skips))
    assert Cursor.parse(str(made)) == made and hash(made) == hash(Cursor(offsets, skips))
    assert dict(made) == offsets and all(made.skip(p) == skips[p] for p in offsets)
