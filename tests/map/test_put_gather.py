"""``put_async`` calls queued together go to the log as ``WRITE_MANY`` records: the sender
gathers each run of consecutive puts of one map into records as ``put_all`` cuts them. Each
future must still resolve to what its own put would have returned, in the order the calls
were made, other async updates between the puts must keep their place, and every replica
must end in the state the puts one by one would leave."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any

import pytest

import kafkakv
from kafkakv.errors import LogUnavailableError
from kafkakv.log import Log
from kafkakv.log.base import FailureCallback, Record
from kafkakv.map import sender as sender_module
from kafkakv.map.ops import PAIR_SLACK, OpCode, decode_op, pair_fits
from kafkakv.map.replica import ReplicaMap
from tests.doubles import ForwardingLog
from tests.map.conftest import OpenMap, local_logs, log_options
from tests.waiting import wait_for


@contextmanager
def _held(m: ReplicaMap[Any, Any]) -> Iterator[None]:
    """Keep ``m``'s sender from taking a batch while the block queues updates (its condition's
    lock is re-entrant, so the calls' wake-ups pass), then let it take them all at once."""
    with m._engine._sender.ready:
        yield


def _ops_since(m: ReplicaMap[Any, Any], start: int, p: int = 0) -> list[tuple[Any, ...]]:
    """``(code, args)`` of the ops records of partition ``p`` from offset ``start`` on."""
    engine = m._engine
    records = engine.log.read(engine.topics.ops, p, start, max_records=10_000, max_bytes=64 << 20)
    return [(op.code, op.args) for op in (decode_op(r.value or b"") for r in records)]


def _end(m: ReplicaMap[Any, Any], p: int = 0) -> int:
    return m._engine.log.end_offset(m._engine.topics.ops, p)


def test_queued_puts_go_as_one_record_and_each_gets_what_its_put_found(
    open_map: OpenMap,
) -> None:
    m = open_map(value_codec="bytes")
    reader = open_map(value_codec="bytes")
    m.put("a", b"0")
    start = _end(m)
    calls = [("a", b"1"), ("b", b"2"), ("a", b"3"), ("c", b"4"), ("b", b"5"), ("a", b"1")]
    with _held(m):
        futures = [m.put_async(k, v) for k, v in calls]
        assert len(m._engine.pending_updates()) == len(calls)  # queued, not sent yet
    model: dict[str, bytes] = {"a": b"0"}
    expected = []
    for k, v in calls:
        expected.append(model.get(k))
        model[k] = v
    assert [f.result(10) for f in futures] == expected
    ops = _ops_since(m, start)
    assert [code for code, _ in ops] == [OpCode.WRITE_MANY]  # one record for the six puts
    keys, values = ops[0][1]
    assert list(keys) == [k.encode() for k, _ in calls] and list(values) == [v for _, v in calls]
    assert dict(m) == model
    reader.sync()
    assert dict(reader) == model


def test_other_async_updates_between_the_puts_keep_their_place(open_map: OpenMap) -> None:
    m = open_map()
    start = _end(m)
    with _held(m):
        futures: list[Future[Any]] = [
            m.put_async("a", 1),
            m.put_async("b", 1),
            m.compare_and_set_async("a", 1, 2),
            m.put_async("a", 3),
            m.put_if_absent_async("c", 4),
            m.put_async("c", 5),
            m.remove_async("b"),
            m.put_async("b", 6),
        ]
    assert [f.result(10) for f in futures] == [None, None, True, 2, None, 4, 1, None]
    assert dict(m) == {"a": 3, "b": 6, "c": 5}
    codes = [code for code, _ in _ops_since(m, start)]
    assert codes == [
        OpCode.WRITE_MANY,
        OpCode.COMPARE_AND_SET,
        OpCode.WRITE_MANY,
        OpCode.PUT_IF_ABSENT,
        OpCode.WRITE_MANY,
        OpCode.REMOVE,
        OpCode.WRITE_MANY,
    ]


def test_puts_of_maps_sharing_topics_go_in_records_of_their_own(target: str, map_name: str) -> None:
    with kafkakv.connect(target, **log_options(target)) as db:
        maps = db.maps(map_name, ["one", "two"])
        first, second = maps["one"], maps["two"]
        start = _end(first)
        with _held(first):  # one engine, one sender
            futures = [
                first.put_async("k", 1),
                first.put_async("j", 2),
                second.put_async("k", 3),
                first.put_async("k", 4),
            ]
        assert [f.result(10) for f in futures] == [None, None, None, 1]
        assert dict(first) == {"k": 4, "j": 2} and dict(second) == {"k": 3}
        assert [len(args[0]) for _, args in _ops_since(first, start)] == [2, 1, 1]


def test_puts_over_partitions_are_gathered_per_partition(open_map: OpenMap) -> None:
    m = open_map(partitions=3)
    reader = open_map(partitions=3)
    starts = [_end(m, p) for p in range(3)]
    keys = [f"key-{i}" for i in range(300)]
    with _held(m):
        futures = [m.put_async(k, i) for i, k in enumerate(keys)]
    assert [f.result(10) for f in futures] == [None] * 300
    records = [_ops_since(m, starts[p], p) for p in range(3)]
    assert [len(r) for r in records] == [1, 1, 1]
    for p in range(3):
        gathered = [k.decode() for k in records[p][0][1][0]]
        assert gathered == [k for k in keys if m.partition_of(k) == p]  # in call order
    reader.sync()
    assert dict(reader) == {k: i for i, k in enumerate(keys)}


@local_logs  # a Kafka broker counts its batch framing too: no such pair fits a PUT there
def test_a_put_too_large_to_share_a_record_goes_alone_as_a_put(open_map: OpenMap) -> None:
    m = open_map(value_codec="bytes")
    big = b"y" * (m._engine.max_record_bytes - 40)  # room in a PUT record, not in a batch
    start = _end(m)
    with _held(m):
        futures = [m.put_async("a", b"1"), m.put_async("big", big), m.put_async("a", b"2")]
    assert [f.result(30) for f in futures] == [None, None, b"1"]
    assert [code for code, _ in _ops_since(m, start)] == [
        OpCode.WRITE_MANY,
        OpCode.PUT,
        OpCode.WRITE_MANY,
    ]
    assert m["big"] == big and m["a"] == b"2"


def test_the_largest_pair_that_shares_a_record_does_and_one_byte_more_goes_alone(
    open_map: OpenMap,
) -> None:
    """The queue's own size check agrees with the records' cutting (ops.pair_fits) at the
    boundary, so that no pair the sender gathers is too large for its record."""
    m = open_map(value_codec="bytes")
    engine = m._engine
    room = engine.max_record_bytes - len(m._state.prefix)
    fits = b"v" * (room - PAIR_SLACK - 2 * len(b"kk"))
    assert pair_fits(b"kk", fits, room) and not pair_fits(b"kk", fits + b"v", room)
    codes = []
    for value, found in ((fits, None), (fits + b"v", fits)):
        start = _end(m)
        assert m.put_async("kk", value).result(30) == found
        # One record of about 1 MB: a read from Kafka may come back empty until it is fetched.
        wait_for(functools.partial(_ops_since, m, start), what="the record read back")
        codes += [code for code, _ in _ops_since(m, start)]
    assert codes == [OpCode.WRITE_MANY, OpCode.PUT]
    assert m["kk"] == fits + b"v"


class _Sends(ForwardingLog):
    """Sends to the ops topics as the test says: the next ``failures`` are refused, and each
    waits for ``gate`` (open unless the test closes it); ``entered`` says one came."""

    def __init__(self, inner: Log) -> None:
        super().__init__(inner)
        self.failures = 0
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def send(
        self,
        topic: str,
        partition: int,
        records: Sequence[Record],
        on_failure: FailureCallback | None = None,
        *,
        timeout: float | None = None,
    ) -> None:
        if topic.endswith("_ops"):
            self.entered.set()
            assert self.gate.wait(30), "the test never opened the gate"
            if self.failures:
                self.failures -= 1
                raise LogUnavailableError("the log refused this send")
        super().send(topic, partition, records, on_failure, timeout=timeout)


def _with_sends(open_map: OpenMap, **options: Any) -> tuple[ReplicaMap[Any, Any], _Sends]:
    """A replica whose log is a :class:`_Sends` double."""
    doubles: list[_Sends] = []

    def wrap(inner: Log) -> Log:
        doubles.append(_Sends(inner))
        return doubles[0]

    m = open_map(log=wrap, **options)
    return m, doubles[0]


@local_logs
def test_a_failed_send_fails_every_gathered_put_and_frees_their_slots(
    open_map: OpenMap,
) -> None:
    m, sends = _with_sends(open_map, max_in_flight=10, timeout=3)
    sends.failures = 1
    with _held(m):
        futures = [m.put_async(f"k{i}", i) for i in range(10)]
    for f in futures:
        with pytest.raises(LogUnavailableError, match="refused this send"):
            f.result(10)
    assert m._engine.undelivered == 10
    # Their ten slots are free again: ten more puts need no wait (a leak would time out).
    assert [m.put_async(f"k{i}", -i).result(10) for i in range(10)] == [None] * 10
    assert dict(m) == {f"k{i}": -i for i in range(10)}


@local_logs
def test_puts_the_sender_cannot_encode_fail_and_the_sender_goes_on(
    open_map: OpenMap, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sender must never stop: an update it cannot make a record of fails with the error,
    frees its slot, and the updates after it are sent."""
    m = open_map(max_in_flight=5, timeout=3)

    def refuse(*args: Any) -> bytes:
        raise ValueError("cannot encode this")

    with monkeypatch.context() as patch:
        patch.setattr(sender_module, "encode_op", refuse)
        with _held(m):
            futures = [m.put_async(f"k{i}", i) for i in range(5)]
        for f in futures:
            with pytest.raises(ValueError, match="cannot encode this"):
                f.result(10)
    assert [m.put_async(f"k{i}", i).result(10) for i in range(5)] == [None] * 5
    assert dict(m) == {f"k{i}": i for i in range(5)} and m._engine.undelivered == 5


@local_logs
@pytest.mark.parametrize("update", ["put", "put_all", "compare_and_set"])
def test_an_update_that_waits_goes_to_the_log_after_the_async_ones_made_before_it(
    open_map: OpenMap, update: str
) -> None:
    """A thread's put_async, then its sync update of the same key: the log must have them in
    that order, so the key ends with the sync update's value. The async put is held in the
    sender's send while the sync update is made; an update that went straight to the log
    would overtake it."""
    m, double = _with_sends(open_map)
    double.gate.clear()
    queued = m.put_async("k", 1)
    assert double.entered.wait(10)  # the sender is in its send, holding the put
    outcome: list[Any] = []
    calls: dict[str, Callable[[], Any]] = {
        "put": lambda: m.put("k", 2),
        "put_all": lambda: m.put_all({"k": 2}),
        "compare_and_set": lambda: m.compare_and_set("k", 1, 2),
    }
    thread = threading.Thread(target=lambda: outcome.append(calls[update]()))
    thread.start()
    thread.join(0.5)  # an update that overtakes the put is done by now
    double.gate.set()
    thread.join(30)
    assert queued.result(10) is None
    assert outcome == [{"put": 1, "put_all": 1, "compare_and_set": True}[update]]
    assert m["k"] == 2
