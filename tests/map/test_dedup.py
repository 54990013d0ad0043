"""The table of applied update ids (kafkakv.map.dedup): exact within its bounds, the same
after a snapshot, bounded by the marks' clock, and rebuilt alike from the ops after a flush."""

from __future__ import annotations

import random
from typing import cast

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafkakv.map.dedup import HORIZON_MS, MAX_HOLES, MAX_ORIGINS, AppliedIds, Replay, numbering


def apply(ids: AppliedIds, origin: bytes, seq: int, offset: int = 0) -> bool:
    """What the machine does with an update: True when it is applied."""
    if ids.is_repeat(origin, seq):
        return False
    ids.admit(origin, seq, offset)
    return True


@settings(max_examples=200, derandomize=True, deadline=None)
@given(
    partitions=st.integers(1, 4),
    seqs=st.lists(st.tuples(st.sampled_from([b"a", b"b"]), st.integers(0, 60)), max_size=80),
)
def test_a_number_is_applied_once_whatever_the_order(
    partitions: int, seqs: list[tuple[bytes, int]]
) -> None:
    """Within MAX_HOLES the table is an exact set, of any numbers in any order."""
    ids, seen = AppliedIds(0, partitions), set()
    for offset, (origin, seq) in enumerate(seqs):
        assert apply(ids, origin, seq, offset) == ((origin, seq) not in seen)
        seen.add((origin, seq))
        packed = msgpack.unpackb(msgpack.packb(ids.snapshot()))
        restored = AppliedIds.restore(0, partitions, packed)
        assert restored == ids


def test_a_writers_numbering_keeps_one_entry_without_holes() -> None:
    """Numbers of partition 2 of 5 in both lanes, shuffled a little as threads shuffle them,
    and lane 1's all later than lane 0's (a pipelined producer): after they all arrive, one
    range per lane, no hole."""
    ids = AppliedIds(2, 5)
    numbers = list(numbering(2, 5)[:200]) + list(numbering(2, 5, lane=1)[:100])
    for i in range(0, 300, 4):  # each group of four in another order
        numbers[i : i + 4] = random.Random(i).sample(numbers[i : i + 4], 4)
    assert all(apply(ids, b"w", n) for n in numbers)
    assert not any(apply(ids, b"w", n) for n in numbers)
    rows = [(rest, top, holes) for _, rest, top, _, holes in ids.snapshot()[1]]
    assert rows == [(2, 199, []), (7, 99, [])]


def test_numbers_of_any_numbering_are_kept_apart() -> None:
    """A writer numbering across partitions (0, 1, 2, ... anywhere): no number is taken for
    another, whatever the stride."""
    ids = AppliedIds(0, 3)
    assert [apply(ids, b"w", n) for n in (7, 8, 9, 7, 10, 8, 6)] == [
        True,
        True,
        True,
        False,
        True,
        False,
        True,
    ]


def test_past_max_holes_the_oldest_hole_counts_as_applied() -> None:
    """A number whose hole was dropped is refused: at most once, never twice."""
    ids = AppliedIds(0, 1)
    lane = numbering(0, 1)
    for n in range(0, 2 * (MAX_HOLES + 2), 2):  # 0, 2, 4...: a hole before each
        assert apply(ids, b"w", lane[n])
    assert not apply(ids, b"w", lane[1])  # the oldest hole: dropped
    assert apply(ids, b"w", lane[2 * (MAX_HOLES + 2) - 3])  # the newest: kept


def test_an_origin_silent_for_the_horizon_is_forgotten_at_a_mark() -> None:
    ids = AppliedIds(0, 1)
    apply(ids, b"old", 0, offset=1)
    ids.at_mark(2, 1_000)
    apply(ids, b"new", 0, offset=3)
    ids.at_mark(4, 1_000 + HORIZON_MS - 1)  # not yet an hour after the first mark
    assert len(ids) == 2
    ids.at_mark(5, 1_000 + HORIZON_MS)  # the first mark is an hour old: what was before goes
    assert len(ids) == 1 and ids.is_repeat(b"new", 0) and not ids.is_repeat(b"old", 0)
    ids.at_mark(6, 5_000 + 2 * HORIZON_MS)
    assert len(ids) == 0 and [m[0] for m in ids.marks] == [6]
    ids.at_mark(7, None)  # a mark without a timestamp bounds nothing
    assert [m[0] for m in ids.marks] == [6]


def test_past_max_origins_the_least_recently_seen_go() -> None:
    ids = AppliedIds(0, 1)
    for offset in range(MAX_ORIGINS + 3):
        apply(ids, offset.to_bytes(4, "big"), 0, offset)
    ids.at_mark(MAX_ORIGINS + 3, 0)
    assert len(ids) == MAX_ORIGINS
    assert not ids.is_repeat((2).to_bytes(4, "big"), 0)
    assert ids.is_repeat((3).to_bytes(4, "big"), 0)


def test_restore_refuses_what_is_not_a_table() -> None:
    assert len(AppliedIds.restore(0, 1, None)) == 0
    with pytest.raises(ValueError, match="not a table"):
        AppliedIds.restore(0, 1, [[], [["not bytes", 0, 0, 0, []]]])


@settings(max_examples=150, derandomize=True, deadline=None)
@given(
    events=st.lists(
        st.one_of(
            st.tuples(st.sampled_from([b"a", b"b", b"c"]), st.integers(0, 12)),
            st.tuples(st.just(b"mark"), st.integers(0, 5)),
        ),
        max_size=60,
    ),
    cut=st.integers(0, 60),
)
def test_a_replay_from_a_flush_mark_rebuilds_the_live_table(
    events: list[tuple[bytes, int]], cut: int
) -> None:
    """A live table over a stream of updates and ``FLUSHED`` marks, each mark covering the
    offsets up to ``lag`` records before it and carrying the table as of there (as a flush
    writes it); then a Replay of the stream after a flush point, as a resumed store does:
    both tables end equal, also when updates between the flush point and its mark repeat
    earlier ones."""
    live = AppliedIds(0, 1)
    tables: list[list[object]] = []  # the table after each offset
    stream: list[tuple[int, tuple[object, ...]]] = []
    covered = -1
    hour = HORIZON_MS // 3
    for offset, (what, n) in enumerate(events):
        if what == b"mark":
            covered = max(covered, offset - 1 - n)
            table = tables[covered] if covered >= 0 else AppliedIds(0, 1).snapshot()
            stream.append((offset, ("mark", covered, table, offset * hour)))
            live.at_mark(offset, offset * hour)
        else:
            stream.append((offset, ("update", what, n)))
            apply(live, what, n, offset)
        tables.append(live.snapshot())
    points = [-1, *sorted({cast(int, e[1]) for _, e in stream if e[0] == "mark"})]
    flushed = points[min(cut, len(points) - 1)]
    replay = Replay(0, 1, flushed)
    for offset, event in stream:
        if offset <= flushed:
            continue
        if event[0] == "mark":
            replay.mark(event[1], event[2], offset, event[3])  # type: ignore[arg-type]
        else:
            replay.update(event[1], event[2], offset)  # type: ignore[arg-type]
    assert replay.table() == live
