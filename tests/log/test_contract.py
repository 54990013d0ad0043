"""The Log contract: what every backend must do, written against the interface only."""

from __future__ import annotations

import gc
import threading
import time
import weakref

import pytest

from kafkakv.errors import (
    ClosedError,
    ConfigError,
    FencedError,
    InvalidRecordError,
    RecordTooLargeError,
    TopicExistsError,
    UnknownPartitionError,
    UnknownTopicError,
)
from kafkakv.log import Log, Record
from tests.records import offset_of


def values(records: list[Record]) -> list[bytes | None]:
    return [r.value for r in records]


# -- topics -------------------------------------------------------------------------------
def test_create_topic_lists_and_describes_it(log: Log, topic: str) -> None:
    log.create_topic(topic, 3, {"cleanup.policy": "compact", "segment.bytes": "2097152"})
    assert topic in log.topics()
    assert log.partitions(topic) == 3
    config = log.topic_config(topic)
    assert config["cleanup.policy"] == "compact"
    assert config["segment.bytes"] == "2097152"
    assert config["max.message.bytes"] == "1048588"  # Kafka's default filled in


def test_a_listing_includes_every_topic_the_log_just_created(log: Log, topic: str) -> None:
    """On Kafka, the broker a listing asks may not have heard of a new topic yet; the log that
    created it lists it all the same (read your own creations). Many creations in a row, as a
    test suite makes them, give a lagging broker many chances to be asked."""
    for i in range(30):
        name = f"{topic}-{i}"
        log.create_topic(name, 1 + i % 3)
        listed = log.topics()
        assert name in listed, f"creation {i}: {name} missing from {len(listed)} topics"


def test_topic_partitions_gives_each_topic_its_partition_count(log: Log, topic: str) -> None:
    names = {f"{topic}-{n}": n for n in (1, 2, 3)}
    for name, count in names.items():
        log.create_topic(name, count)
    counts = log.topic_partitions()
    assert {name: counts.get(name) for name in names} == names
    assert set(counts) <= set(log.topics())


def test_create_existing_topic_is_refused(log: Log, topic: str) -> None:
    log.create_topic(topic, 1)
    with pytest.raises(TopicExistsError, match=topic):
        log.create_topic(topic, 2)
    assert log.partitions(topic) == 1


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"no.such.setting": 1}, "unknown topic config 'no.such.setting'"),
        ({"cleanup.policy": "shred"}, "cleanup.policy"),
        ({"retention.ms": "soon"}, "retention.ms must be an integer"),
        ({"min.cleanable.dirty.ratio": 1.5}, "between 0 and 1"),
        ({"segment.bytes": 10}, "segment.bytes must be between"),
    ],
)
def test_bad_topic_config_is_refused(
    log: Log, topic: str, config: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        log.create_topic(topic, 1, config)
    assert topic not in log.topics()


@pytest.mark.parametrize("name", ["", "a/b", "..", "with space", "x" * 250])
def test_illegal_topic_names_are_refused(log: Log, name: str) -> None:
    with pytest.raises(ConfigError):
        log.create_topic(name, 1)


def test_unknown_topic_and_partition(log: Log, topic: str) -> None:
    with pytest.raises(UnknownTopicError, match="no-such"):
        log.end_offset("no-such", 0)
    log.create_topic(topic, 2)
    with pytest.raises(UnknownPartitionError, match="partition 2"):
        log.append(topic, 2, [Record(b"k", b"v")])
    with pytest.raises(UnknownPartitionError):
        log.read(topic, -1, 0)


# -- append and read ------------------------------------------------------------------------
def test_append_returns_consecutive_offsets_and_read_returns_records(log: Log, topic: str) -> None:
    log.create_topic(topic, 2)
    assert log.append(topic, 0, [Record(b"a", b"1"), Record(b"b", b"2")]) == 0
    # Later appends get higher offsets; a backend may leave some unused between appends
    # (Kafka's transaction markers), never within one.
    third = log.append(topic, 0, [Record(b"c", b"3")])
    assert third >= 2
    assert log.append(topic, 1, [Record(b"z", b"9")]) == 0
    got = log.read(topic, 0, 0)
    assert [(r.key, r.value, r.offset, r.partition) for r in got] == [
        (b"a", b"1", 0, 0),
        (b"b", b"2", 1, 0),
        (b"c", b"3", third, 0),
    ]
    assert log.start_offset(topic, 0) == 0
    assert log.end_offset(topic, 0) >= third + 1  # a late commit marker may follow
    assert log.end_offset(topic, 1) == 1


def read_all(log: Log, topic: str, partition: int, count: int, timeout: float) -> list[Record]:
    """The first ``count`` records of a partition, waiting up to ``timeout`` for them."""
    got: list[Record] = []
    position, deadline = 0, time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        batch = log.read_batch(topic, partition, position, max_records=1000)
        got += batch.records
        position = batch.next_offset
        if not batch.records:
            log.wait(topic, partition, position, 0.2)
    return got


@pytest.mark.parametrize("pipelined", [False, True], ids=["blocking", "pipelined"])
def test_send_appends_every_record_in_order(log: Log, topic: str, pipelined: bool) -> None:
    log.create_topic(topic, 2)
    failures: list[tuple[Record, BaseException]] = []
    on_failure = (lambda r, e: failures.append((r, e))) if pipelined else None
    sent = [Record(b"k%d" % i, b"v%d" % i) for i in range(3000)]
    for i in range(0, len(sent), 500):
        log.send(topic, 1, sent[i : i + 500], on_failure)
    got = read_all(log, topic, 1, len(sent), timeout=30)
    assert [(r.key, r.value) for r in got] == [(r.key, r.value) for r in sent]
    offsets = [offset_of(r) for r in got]
    assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
    assert failures == []
    assert log.end_offset(topic, 0) == 0  # nothing went to the other partition


@pytest.mark.parametrize("pipelined", [False, True], ids=["blocking", "pipelined"])
def test_send_refuses_invalid_records_before_storing_any(
    log: Log, topic: str, pipelined: bool
) -> None:
    log.create_topic(topic, 1, {"cleanup.policy": "compact"})
    on_failure = (lambda r, e: None) if pipelined else None
    with pytest.raises(InvalidRecordError, match="key"):
        log.send(topic, 0, [Record(b"a", b"1"), Record(None, b"2")], on_failure)
    with pytest.raises(InvalidRecordError):
        log.send(topic, 0, [Record(b"a", "text")], on_failure)  # type: ignore[arg-type]
    # A timestamp of the wrong type, even an unhashable one, is named (not a bare TypeError).
    unhashable = Record(b"b", b"2", (), [1])  # type: ignore[arg-type]
    with pytest.raises(InvalidRecordError, match="timestamp"):
        log.send(topic, 0, [Record(b"a", b"1"), unhashable], on_failure)
    assert log.end_offset(topic, 0) == 0


def test_a_reader_at_the_end_reads_the_records_its_process_just_appended(
    log: Log, topic: str
) -> None:
    log.create_topic(topic, 1)
    position = 0
    for n in range(30):
        offset = log.append(topic, 0, [Record(b"k", b"%d" % n)])
        got = log.read(topic, 0, position)
        assert [r.value for r in got] == [b"%d" % n], f"append {n} at {offset}"
        position = (got[-1].offset or 0) + 1
        assert log.read(topic, 0, position) == []  # and now this reader is at the end


def test_read_from_the_middle_of_a_batch_and_at_the_end(log: Log, topic: str) -> None:
    log.create_topic(topic, 1)
    log.append(topic, 0, [Record(None, b"%d" % i) for i in range(10)])
    assert values(log.read(topic, 0, 7)) == [b"7", b"8", b"9"]
    assert log.read(topic, 0, 10) == []
    assert log.read(topic, 0, 1000) == []


def test_read_entries_are_the_records_keys_values_and_offsets(log: Log, topic: str) -> None:
    log.create_topic(topic, 1)
    log.append(topic, 0, [Record(b"k%d" % i, b"v%d" % i) for i in range(30)])
    log.append(topic, 0, [Record(b"gone", None, headers=[("h", b"1")])])
    for start, limit in ((0, 1000), (7, 5), (29, 10), (31, 10)):
        entries, after = log.read_entries(topic, 0, start, max_records=limit)
        records, records_after = log.read_batch(topic, 0, start, max_records=limit)
        assert entries == [(r.key, r.value, r.offset) for r in records]
        assert after == records_after
    entries, after = log.read_entries(topic, 0, 25)
    (last,) = log.read(topic, 0, entries[-1][2])  # Kafka may leave an offset unused between
    assert entries[-1] == (b"gone", None, last.offset) and after >= last.offset + 1  # type: ignore[operator]


def test_read_latest_is_the_last_value_of_each_key_among_the_records_read(
    log: Log, topic: str
) -> None:
    log.create_topic(topic, 1)
    log.append(topic, 0, [Record(b"k%d" % (i % 7), b"v%d" % i) for i in range(30)])
    log.append(topic, 0, [Record(b"k3", None), Record(None, b"no key", headers=[("h", b"1")])])
    log.append(topic, 0, [Record(b"k%d" % (i % 5), b"w%d" % i) for i in range(12)])
    records = log.read(topic, 0, 0, max_records=1000)
    assert len(records) == 44
    for start, limit in ((0, 1000), (7, 5), (29, 3), (30, 2), (31, 10), (40, 10)):
        offset = offset_of(records[start])
        latest, after = log.read_latest(topic, 0, offset, max_records=limit)
        read, read_after = log.read_batch(topic, 0, offset, max_records=limit)
        assert latest == {r.key: r.value for r in read} and after == read_after
    latest, after = log.read_latest(topic, 0, offset_of(records[28]), max_records=4)
    assert latest == {b"k0": b"v28", b"k1": b"v29", b"k3": None, None: b"no key"}
    assert offset_of(records[31]) < after <= offset_of(records[32])  # Kafka: maybe past a gap
    # Stretch by stretch, as a replica loads its data topic, reads stop inside batches:
    everything: dict[bytes | None, bytes | None] = {}
    position, stretches = 0, 0
    while True:
        stretch, position = log.read_latest(topic, 0, position, max_records=4)
        if not stretch:
            break
        everything.update(stretch)
        stretches += 1
    assert stretches >= 11
    assert everything == log.read_latest(topic, 0, 0, max_records=1000).values
    expected: dict[bytes | None, bytes | None] = {
        b"k%d" % k: b"w%d" % (k + 10 if k < 2 else k + 5) for k in range(5)
    }
    assert everything == {**expected, b"k5": b"v26", b"k6": b"v27", None: b"no key"}
    # Reads of another kind in between take the batch a stretch stopped inside of as their own.
    first, position = log.read_latest(topic, 0, 0, max_records=3)
    middle = log.read_entries(topic, 0, position, max_records=3)
    rest, _ = log.read_latest(topic, 0, middle.next_offset, max_records=1000)
    assert middle.entries == [(r.key, r.value, r.offset) for r in records[3:6]]
    assert {**first, **{k: v for k, v, _ in middle.entries}, **rest} == everything
    small = log.read_batch(topic, 0, 0, max_bytes=1)  # at least one record
    assert log.read_latest(topic, 0, 0, max_bytes=1) == (
        {r.key: r.value for r in small[0]},
        small[1],
    )
    assert log.read_latest(topic, 0, log.end_offset(topic, 0)).values == {}


def test_read_limits(log: Log, topic: str) -> None:
    log.create_topic(topic, 1)
    for i in range(20):
        log.append(topic, 0, [Record(b"k", b"x" * 1000 + b"%d" % i)])
    assert len(log.read(topic, 0, 0, max_records=5)) == 5
    small = log.read(topic, 0, 0, max_bytes=1)
    assert len(small) == 1 and small[0].offset == 0  # at least one record always comes back
    some = log.read(topic, 0, 0, max_bytes=5000)
    assert 1 <= len(some) < 20


def test_headers_timestamps_and_tombstones_round_trip(log: Log, topic: str) -> None:
    log.create_topic(topic, 1)
    before = int(time.time() * 1000)
    log.append(
        topic,
        0,
        [
            Record(b"k", b"v", [("trace", b"abc"), ("n", b"")], timestamp=1_600_000_000_123),
            Record(b"k", None),
        ],
    )
    first, second = log.read(topic, 0, 0)
    assert list(first.headers) == [("trace", b"abc"), ("n", b"")]
    assert first.timestamp == 1_600_000_000_123
    assert second.value is None
    assert second.timestamp is not None and second.timestamp >= before


@pytest.mark.parametrize(
    "record",
    [
        Record("text-key", b"v"),  # type: ignore[arg-type]
        Record(b"k", 42),  # type: ignore[arg-type]
        Record(b"k", b"v", [("h", "not-bytes")]),  # type: ignore[list-item]
        Record(b"k", b"v", [(1, b"x")]),  # type: ignore[list-item]
        Record(b"k", b"v", timestamp=-5),
    ],
)
def test_bad_records_raise_type_errors_and_append_nothing(
    log: Log, topic: str, record: Record
) -> None:
    log.create_topic(topic, 1)
    with pytest.raises(InvalidRecordError) as info:
        log.append(topic, 0, [Record(b"ok", b"ok"), record])
    assert isinstance(info.value, TypeError)
    assert log.end_offset(topic, 0) == 0


def test_a_large_batch_with_headers_and_timestamps_round_trips(log: Log, topic: str) -> None:
    """Many records at once, some with headers or timestamps among plain ones (a backend may
    send plain batches another way)."""
    log.create_topic(topic, 1)
    records = [
        Record(f"k{i}".encode(), b"v", [("n", str(i).encode())] if i % 3 == 0 else (), None)
        for i in range(50)
    ]
    records[7] = Record(b"k7", b"v", (), 1_600_000_000_000)
    log.append(topic, 0, records)
    got = log.read(topic, 0, 0, max_records=100)
    assert [list(r.headers) for r in got] == [list(r.headers) for r in records]
    assert got[7].timestamp == 1_600_000_000_000


def test_append_needs_a_sequence_of_records(log: Log, topic: str) -> None:
    log.create_topic(topic, 1)
    with pytest.raises(TypeError):
        log.append(topic, 0, Record(b"k", b"v"))  # type: ignore[arg-type]
    with pytest.raises(InvalidRecordError):
        log.append(topic, 0, [])


def test_oversized_record_is_refused(log: Log, topic: str) -> None:
    log.create_topic(topic, 1, {"max.message.bytes": 1000})
    log.append(topic, 0, [Record(b"k", b"x" * 900)])
    with pytest.raises(RecordTooLargeError, match=r"max\.message\.bytes"):
        log.append(topic, 0, [Record(b"k", b"x" * 1001)])
    assert log.end_offset(topic, 0) == 1


def test_a_record_as_large_as_the_room_the_log_gives_is_stored_a_byte_more_refused(
    log: Log, topic: str
) -> None:
    """``record_room`` is what one record may really hold. Kafka's brokers bound a whole
    record batch by ``max.message.bytes``, so there the room is smaller by a batch's framing;
    a record the log's own check passes must not be one the brokers refuse."""
    log.create_topic(topic, 1, {"max.message.bytes": 2000})
    room = log.record_room(topic)
    assert 1800 < room < 2000
    log.append(topic, 0, [Record(b"k", b"x" * (room - 1))])
    with pytest.raises(RecordTooLargeError, match=r"max\.message\.bytes"):
        log.append(topic, 0, [Record(b"k", b"x" * room)])
    assert log.end_offset(topic, 0) == 1
    assert log.read(topic, 0, 0)[0].value == b"x" * (room - 1)


def test_compacted_topic_needs_keys(log: Log, topic: str) -> None:
    log.create_topic(topic, 1, {"cleanup.policy": "compact"})
    with pytest.raises(InvalidRecordError, match="key"):
        log.append(topic, 0, [Record(None, b"v")])


# -- wait -----------------------------------------------------------------------------------
def test_wait_returns_at_once_when_data_exists_and_times_out_otherwise(
    log: Log, topic: str
) -> None:
    log.create_topic(topic, 1)
    log.append(topic, 0, [Record(b"k", b"v")])
    assert log.wait(topic, 0, 0, timeout=0) is True
    start = time.monotonic()
    assert log.wait(topic, 0, 1, timeout=0.2) is False
    assert 0.15 <= time.monotonic() - start < 2


def test_wait_wakes_when_another_thread_appends(log: Log, topic: str) -> None:
    log.create_topic(topic, 1)
    timer = threading.Timer(0.1, lambda: log.append(topic, 0, [Record(b"k", b"v")]))
    timer.start()
    start = time.monotonic()
    try:
        assert log.wait(topic, 0, 0, timeout=10) is True
    finally:
        timer.join()
    assert time.monotonic() - start < 5


def test_wait_any_wakes_on_any_partition_and_times_out_when_none_moves(
    log: Log, topic: str
) -> None:
    log.create_topic(topic, 3)
    log.append(topic, 1, [Record(b"k", b"v")])
    watched = {(topic, 0): 0, (topic, 1): 1, (topic, 2): 0}
    start = time.monotonic()
    assert log.wait_any(watched, timeout=0.2) == set()
    assert 0.15 <= time.monotonic() - start < 2
    assert log.wait_any({(topic, 1): 0}, timeout=0) == {(topic, 1)}
    timer = threading.Timer(0.1, lambda: log.append(topic, 2, [Record(b"k", b"v")]))
    timer.start()
    try:
        assert log.wait_any(watched, timeout=10) == {(topic, 2)}
    finally:
        timer.join()
    assert log.end_offset(topic, 2) == 1


def test_own_appends_append_send_and_wait_as_the_log_does(log: Log, topic: str) -> None:
    """An applier's calls (Log.own_appends) store what the log's would; its wait_any may sleep
    through the applier's own appends but still finds them by its timeout, and wakes at once
    for anyone else's."""
    log.create_topic(topic, 2)
    own = log.own_appends(object())
    assert own.append(topic, 0, [Record(b"a", b"1")]) == 0
    own.send(topic, 0, [Record(b"b", b"2"), Record(b"c", b"3")])
    assert values(read_all(log, topic, 0, 3, timeout=10)) == [b"1", b"2", b"3"]
    start = time.monotonic()
    assert own.wait_any({(topic, 0): 2, (topic, 1): 0}, 0.3) == {(topic, 0)}
    assert time.monotonic() - start < 2
    assert own.wait_any({(topic, 1): 0}, 0.2) == set()
    timer = threading.Timer(0.1, lambda: log.append(topic, 1, [Record(b"k", b"v")]))
    timer.start()
    start = time.monotonic()
    try:
        assert own.wait_any({(topic, 1): 0}, 10) == {(topic, 1)}
    finally:
        timer.join()
    assert time.monotonic() - start < 5


# -- transactional writers ------------------------------------------------------------------
def test_writer_appends_atomically_across_topics_and_partitions(log: Log, topic: str) -> None:
    other = topic + "-b"
    log.create_topic(topic, 2)
    log.create_topic(other, 1)
    log.append(topic, 1, [Record(b"pre", b"x")])
    with log.writer("flusher-1") as w:
        firsts = w.append(
            {
                (topic, 0): [Record(b"a", b"1"), Record(b"b", b"2")],
                (topic, 1): [Record(b"c", b"3")],
                (other, 0): [Record(b"d", b"4")],
            }
        )
    assert firsts == {(topic, 0): 0, (topic, 1): 1, (other, 0): 0}
    assert values(log.read(topic, 0, 0)) == [b"1", b"2"]
    assert values(log.read(topic, 1, 0)) == [b"x", b"3"]
    assert values(log.read(other, 0, 0)) == [b"4"]


def test_a_new_writer_with_the_same_id_fences_the_old_one(log: Log, topic: str) -> None:
    log.create_topic(topic, 1)
    old = log.writer("flusher-p0")
    old.append({(topic, 0): [Record(b"a", b"old")]})
    new = log.writer("flusher-p0")
    with pytest.raises(FencedError, match="fenced"):
        old.append({(topic, 0): [Record(b"a", b"zombie")]})
    new.append({(topic, 0): [Record(b"a", b"new")]})
    other = log.writer("another-id")  # a different id fences nothing
    new.append({(topic, 0): [Record(b"a", b"newer")]})
    other.close()
    assert values(log.read(topic, 0, 0)) == [b"old", b"new", b"newer"]


def test_a_fenced_writer_fails_every_later_append_as_fenced_until_closed(
    log: Log, topic: str
) -> None:
    """Every log says the same thing of a fenced writer: each append after the fencing raises
    FencedError (the embedded and memory logs used to close the writer and say ClosedError from
    the second on, as if its owner had closed it); once its owner closes it, ClosedError."""
    log.create_topic(topic, 1)
    old = log.writer("fenced-again")
    old.append({(topic, 0): [Record(b"a", b"old")]})
    new = log.writer("fenced-again")
    for _ in range(3):
        with pytest.raises(FencedError, match="fenced"):
            old.append({(topic, 0): [Record(b"a", b"zombie")]})
    old.close()
    with pytest.raises(ClosedError):
        old.append({(topic, 0): [Record(b"a", b"closed")]})
    new.append({(topic, 0): [Record(b"a", b"new")]})
    new.close()
    assert values(log.read(topic, 0, 0)) == [b"old", b"new"]


def test_a_fenced_writer_dropped_by_its_caller_is_freed_at_once(log: Log, topic: str) -> None:
    """A fenced writer keeps failing its appends, but it must not keep itself alive: the error
    it remembers must not hold the frames (and so the writer, and on Kafka its producer's
    threads and sockets) that raised it. Freed by reference counting, with no collection."""
    log.create_topic(topic, 1)
    old = log.writer("fenced-p0")
    old.append({(topic, 0): [Record(b"a", b"old")]})
    new = log.writer("fenced-p0")
    collecting = gc.isenabled()
    gc.disable()
    try:
        with pytest.raises(FencedError):
            old.append({(topic, 0): [Record(b"a", b"zombie")]})
        gone = weakref.ref(old)
        old.close()
        del old
        assert gone() is None, gc.get_referrers(gone())
    finally:
        if collecting:
            gc.enable()
    new.close()


def test_a_writer_append_of_no_partition_is_refused_on_every_log(log: Log, topic: str) -> None:
    """As ``Log.append`` of no record: an empty transaction is a caller's mistake, refused
    alike by every log (the embedded and memory logs used to return ``{}`` where Kafka's
    raised). A closed writer says it is closed first, whatever it is given."""
    log.create_topic(topic, 1)
    writer = log.writer("empty")
    with pytest.raises(InvalidRecordError, match="at least one partition"):
        writer.append({})
    writer.close()
    bad = {(topic, 0): [Record(b"a", 7)]}  # type: ignore[arg-type]
    for batches in ({}, bad):
        with pytest.raises(ClosedError):
            writer.append(batches)
    assert log.end_offset(topic, 0) == 0


def test_writer_batch_with_a_bad_record_appends_nothing(log: Log, topic: str) -> None:
    log.create_topic(topic, 2)
    with log.writer("w") as w, pytest.raises(InvalidRecordError):
        w.append({(topic, 0): [Record(b"a", b"1")], (topic, 1): [Record(b"b", 7)]})  # type: ignore[arg-type]
    assert log.end_offset(topic, 0) == 0 and log.end_offset(topic, 1) == 0


# -- lifecycle ------------------------------------------------------------------------------
def test_closed_log_refuses_work(log: Log, topic: str) -> None:
    log.create_topic(topic, 1)
    log.close()
    log.close()  # idempotent
    with pytest.raises(ClosedError):
        log.append(topic, 0, [Record(b"k", b"v")])
    with pytest.raises(ClosedError):
        log.topics()
