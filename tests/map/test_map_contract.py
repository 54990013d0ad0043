"""The map contract: dict behaviour, atomic operations, replicas, failure, timeouts.

Runs on every log backend and every store (see conftest.py).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest

from kafkakv import functions
from kafkakv.codecs import codec_for
from kafkakv.errors import (
    ClosedError,
    EncodeError,
    FunctionError,
    OperationTimeoutError,
    ResultDecodeError,
    UnknownFunctionError,
)
from kafkakv.log import Record
from tests.doubles import ForwardingLog
from tests.map.conftest import OpenMap
from tests.waiting import wait_for


@pytest.fixture(autouse=True)
def _functions() -> Any:
    def add(key: Any, old: Any, n: int) -> int:
        return (old or 0) + n

    def boom(key: Any, old: Any) -> None:
        raise ValueError("boom")

    def concat(old: Any, new: Any) -> Any:
        return old + new

    def drop(key: Any, old: Any) -> None:
        return None

    for name, fn in (("add", add), ("boom", boom), ("concat", concat), ("drop", drop)):
        functions.register(name)(fn)
    yield
    for name in ("add", "boom", "concat", "drop"):
        functions.unregister(name)


def test_dict_behaviour(open_map: OpenMap) -> None:
    m = open_map()
    model: dict[str, Any] = {}
    assert len(m) == 0 and list(m) == [] and m == {}
    m["a"] = 1
    m["b"] = {"x": [1, 2]}
    model.update(a=1, b={"x": [1, 2]})
    assert m["a"] == 1 and m["b"] == {"x": [1, 2]}
    assert "a" in m and "zz" not in m and 5 not in m  # a key of another type is just absent
    assert m.get("zz") is None and m.get("zz", 7) == 7
    with pytest.raises(KeyError):
        m["zz"]
    m.update({"c": 3}, d=4)
    m.update([("e", 5)])
    model.update(c=3, d=4, e=5)
    assert m == model and dict(m.items()) == model
    assert sorted(m.keys()) == sorted(model) and sorted(map(str, m.values())) == sorted(
        map(str, model.values())
    )
    assert m.pop("c") == 3 and m.pop("c", "gone") == "gone"
    with pytest.raises(KeyError):
        m.pop("c")
    del m["d"]
    with pytest.raises(KeyError):
        del m["d"]
    assert m.setdefault("a", 100) == 1 and m.setdefault("f", 6) == 6 and m["f"] == 6
    key, _value = m.popitem()
    assert key in ("a", "b", "e", "f") and key not in m
    m.clear()
    assert len(m) == 0 and m == {}
    with pytest.raises(KeyError):
        m.popitem()


def test_atomic_operations_return_what_they_decided(open_map: OpenMap) -> None:
    m = open_map()
    assert m.put("k", 1) is None and m.put("k", 2) == 1
    assert m.put_if_absent("k", 9) == 2 and m["k"] == 2
    assert m.put_if_absent("n", 9) is None and m["n"] == 9
    assert m.replace("absent", 1) is None and "absent" not in m
    assert m.replace("k", 3) == 2 and m["k"] == 3
    assert m.compare_and_set("k", 2, 4) is False and m["k"] == 3
    assert m.compare_and_set("k", 3, 4) is True and m["k"] == 4
    assert m.compare_and_set("new", None, 1) is True and m["new"] == 1
    assert m.compare_and_set("new", None, 2) is False
    assert m.remove_if("k", 5) is False and m.remove_if("k", 4) is True and "k" not in m
    assert m.remove("k") is None and m.remove("n") == 9
    assert m.compute("c", "add", 5) == 5 and m.compute("c", "add", 2) == 7
    assert m.compute("c", "drop") is None and "c" not in m
    assert m.merge("s", "ab", "concat") == "ab" and m.merge("s", "cd", "concat") == "abcd"


def test_compare_and_set_compares_values_not_bytes(open_map: OpenMap) -> None:
    m = open_map(value_codec="msgpack")
    m["k"] = {"a": 1, "b": 2}
    assert m.compare_and_set("k", {"b": 2, "a": 1}, {"a": 3}) is True
    assert m["k"] == {"a": 3}


def test_replicas_converge_and_see_each_others_updates(open_map: OpenMap) -> None:
    a, b = open_map(partitions=3), open_map()
    for i in range(50):
        (a if i % 2 else b)[f"k{i}"] = i
    a.sync()
    b.sync()
    assert a == b == {f"k{i}": i for i in range(50)}
    assert b.compute("k1", "add", 10) == 11
    a.sync()
    assert a["k1"] == 11


def test_failing_function_fails_everywhere_and_changes_nothing(open_map: OpenMap) -> None:
    a, b = open_map(), open_map()
    a["k"] = 1
    with pytest.raises(FunctionError, match="boom"):
        a.compute("k", "boom")
    a["after"] = 2  # the replica keeps applying
    b.sync()
    assert a == b == {"k": 1, "after": 2}
    assert any("boom" in e.error for e in b.errors()) and any("boom" in e.error for e in a.errors())


def test_bad_input_raises_before_anything_is_appended(open_map: OpenMap) -> None:
    m = open_map()
    m["k"] = 1
    with pytest.raises(EncodeError):
        m[3] = 1  # str keys
    with pytest.raises(TypeError):
        m["x"] = object()
    with pytest.raises(EncodeError):
        m["x"] = None
    with pytest.raises(UnknownFunctionError):
        m.compute("k", "not-registered")
    with pytest.raises(EncodeError):
        m.compute("k", "add", object())
    assert m == {"k": 1}


@pytest.mark.parametrize("consistency", ["local", "linearizable"])
def test_reads_of_a_key_the_codec_refuses_raise_its_typed_error(
    open_map: OpenMap, consistency: str
) -> None:
    """The fast read paths hand such a key to the checked path, which says what is wrong."""
    m = open_map(consistency=consistency)
    m["k"] = 1
    for refused in (3, b"k", "\ud800"):  # not a str, bytes, a lone surrogate (no UTF-8)
        with pytest.raises(EncodeError):
            m[refused]
        with pytest.raises(EncodeError):
            m.get(refused)
        assert refused not in m
    assert m["k"] == 1 and m.get("k") == 1 and "k" in m


def test_an_applied_update_whose_result_does_not_decode_keeps_its_bytes(
    open_map: OpenMap,
) -> None:
    """Two replicas that disagree on the value codec: the update is applied all the same,
    and the error it raises carries the previous value's bytes, so nothing is lost."""
    as_json, as_int = open_map(value_codec="json"), open_map(value_codec="int")
    as_json["k"] = {"x": 1}
    as_int.sync()
    with pytest.raises(ResultDecodeError, match="applied") as put:
        as_int.put("k", 3)
    assert put.value.raw == codec_for("json").encode({"x": 1})
    assert as_int["k"] == 3
    as_json.sync()
    with pytest.raises(ResultDecodeError) as removed:
        as_json.remove("k")
    assert removed.value.raw == codec_for("int").encode(3)
    as_int.sync()
    assert "k" not in as_json and "k" not in as_int
    assert as_int.put("k", 4) is None and as_int.put("k", 5) == 4  # the replica goes on


def test_async_updates_resolve_and_can_be_awaited(open_map: OpenMap) -> None:
    m = open_map(max_in_flight=8)
    futures = [m.put_async(f"k{i}", i) for i in range(200)]
    assert [f.result(timeout=10) for f in futures] == [None] * 200
    assert len(m) == 200
    assert m.compare_and_set_async("k1", 1, 10).result(timeout=10) is True
    assert m.compute_async("k2", "add", 1).result(timeout=10) == 3

    async def main() -> Any:
        return await m.put_async("k3", 30), await m.remove_async("k4")

    assert asyncio.run(main()) == (3, 4)
    with pytest.raises(FunctionError):
        m.compute_async("k5", "boom").result(timeout=10)


def test_listeners_see_each_real_change_once_in_order(open_map: OpenMap) -> None:
    a, b = open_map(), open_map()
    seen_a: list[tuple[Any, ...]] = []
    seen_b: list[tuple[Any, ...]] = []
    a.add_listener(lambda *e: seen_a.append(e))
    b.add_listener(lambda *e: seen_b.append(e))
    a["k"] = 1
    a["k"] = 1  # no real change
    a.put_if_absent("k", 5)  # neither
    b["k"] = 2
    a.remove("k")
    a.remove("k")  # nothing to remove
    a.sync()
    b.sync()
    expected = [("k", None, 1), ("k", 1, 2), ("k", 2, None)]
    assert [e[:3] for e in seen_a] == expected == [e[:3] for e in seen_b]
    assert [e[3] for e in seen_a] == [True, False, True]
    assert [e[3] for e in seen_b] == [False, True, False]


def test_sync_sees_an_update_made_elsewhere(open_map: OpenMap) -> None:
    a, b = open_map(), open_map()
    for i in range(20):
        a[f"k{i}"] = i
        b.sync(timeout=10)
        assert b[f"k{i}"] == i


@pytest.mark.parametrize("barriers", ["auto", "offset", "shared", "per-read"])
def test_linearizable_reads_see_completed_writes(open_map: OpenMap, barriers: str) -> None:
    writer = open_map(partitions=2)
    reader = open_map(consistency="linearizable", barriers=barriers)
    for i in range(30):
        writer[f"k{i}"] = i
        assert reader[f"k{i}"] == i and len(reader) == i + 1
    for i in range(30):  # each read form on its own
        writer[f"g{i}"] = i
        assert reader.get(f"g{i}") == i
        writer[f"c{i}"] = i
        assert f"c{i}" in reader
        writer.remove(f"c{i}")
        assert f"c{i}" not in reader


class _SlowAppends(ForwardingLog):
    """A log whose appends take a millisecond or more, as over a disk or a network: threads
    that read meanwhile are concurrent readers on every backend, an in-memory one included."""

    def append(
        self,
        topic: str,
        partition: int,
        records: Sequence[Record],
        *,
        timeout: float | None = None,
    ) -> int:
        time.sleep(0.001)
        return super().append(topic, partition, records, timeout=timeout)


@pytest.mark.parametrize("barriers", ["offset", "shared"])
def test_concurrent_readers_share_barriers(open_map: OpenMap, barriers: str) -> None:
    writer = open_map()
    reader = open_map(consistency="linearizable", barriers=barriers, log=_SlowAppends)
    ops_topic = f"{reader.name}_ops"
    log = reader._engine.log
    start = log.end_offset(ops_topic, 0)
    failures: list[BaseException] = []
    reads = [0] * 16

    def read(i: int) -> None:
        try:
            for _ in range(50):
                reader.get("k")
                reads[i] += 1
        except BaseException as exc:  # pragma: no cover - reported below
            failures.append(exc)

    writer["k"] = 1
    threads = [threading.Thread(target=read, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures and sum(reads) == 800
    appended = log.end_offset(ops_topic, 0) - start - 1  # minus the writer's put
    if barriers == "offset":
        assert appended == 0  # the end offset is the barrier: nothing appended
    else:
        assert 1 <= appended < 800  # shared: far fewer barrier records than reads


def test_flush_then_a_fresh_replica_loads_data_and_ops(open_map: OpenMap) -> None:
    a = open_map(partitions=2, flush_period=10)
    for i in range(100):
        a[f"k{i}"] = i
    for i in range(0, 100, 3):
        del a[f"k{i}"]
    a.flush()
    a["late"] = 1  # after the last flush: comes from the ops topic
    fresh = open_map()
    assert fresh == a
    assert fresh.check() == [] and a.check() == []


def test_close_fails_calls_and_pending_updates(open_map: OpenMap) -> None:
    m = open_map()
    m["k"] = 1
    m.close()
    with pytest.raises(ClosedError):
        m["k"]
    with pytest.raises(ClosedError):
        m["k"] = 2
    with pytest.raises(ClosedError):
        m.put_async("k", 2)
    m.close()  # idempotent


class Hold:
    """The registered function ``slow`` holds the thread that applies it until :meth:`release`."""

    def __init__(self) -> None:
        self.released, self.running = threading.Event(), threading.Event()

    def slow(self, key: Any, old: Any) -> int:
        self.running.set()
        # Until the test releases it, however long that takes (the teardown releases it at the
        # latest): a bound of 15 s ran out under load before the update it held up was sent.
        self.released.wait()
        return 1

    def release(self) -> None:
        self.released.set()


@pytest.fixture
def hold() -> Any:
    """Registers ``slow`` (see :class:`Hold`) for the test."""
    held = Hold()
    functions.register("slow")(held.slow)
    yield held
    held.release()
    functions.unregister("slow")


def test_timeouts_raise_a_clear_error(open_map: OpenMap, hold: Hold) -> None:
    m = open_map(timeout=0.3, max_in_flight=1)
    first = m.compute_async("k", "slow")
    start = time.monotonic()
    with pytest.raises(OperationTimeoutError):
        m.put_async("j", 1)  # no room in flight while "slow" runs
    assert time.monotonic() - start < 3
    hold.release()
    assert first.result(timeout=10) == 1


def test_update_waits_for_every_pair_and_times_out_clearly(open_map: OpenMap, hold: Hold) -> None:
    m = open_map(timeout=2.0)  # room for a Kafka round trip, well below the hold-up
    m.update({f"k{i}": i for i in range(100)})  # returns with every pair applied
    assert m == {f"k{i}": i for i in range(100)}
    engine = m._engine
    end = engine.log.end_offset(engine.topics.ops, 0)
    first = m.compute_async("held", "slow")  # holds up everything after it in the log
    wait_for(lambda: engine.log.end_offset(engine.topics.ops, 0) > end, what="the compute sent")
    # The replica's follower applies it and waits in "slow": else the update's own thread may
    # apply it first and wait there for a release that only comes after the update returns (a
    # fresh-clone run under stress-ng hung so until pytest's timeout).
    assert hold.running.wait(30), "the follower never applied the compute"
    start = time.monotonic()
    with pytest.raises(OperationTimeoutError, match="not applied in time"):
        m.update({f"n{i}": i for i in range(50)})
    assert time.monotonic() - start < 10
    hold.release()
    assert first.result(timeout=10) == 1
    m.sync(timeout=10)
    assert all(m[f"n{i}"] == i for i in range(50))  # timed out waiting, not lost


def test_every_async_form_decides_like_its_sync_form(open_map: OpenMap) -> None:
    m = open_map()
    m["k"] = "a"
    assert m.put_if_absent_async("k", "x").result(timeout=10) == "a"
    assert m.put_if_absent_async("n", "x").result(timeout=10) is None
    assert m.replace_async("absent", "x").result(timeout=10) is None
    assert m.replace_async("k", "b").result(timeout=10) == "a"
    assert m.remove_if_async("k", "a").result(timeout=10) is False
    assert m.remove_if_async("k", "b").result(timeout=10) is True
    assert m.merge_async("s", "ab", "concat").result(timeout=10) == "ab"
    assert m.merge_async("s", "cd", "concat").result(timeout=10) == "abcd"
    assert m == {"n": "x", "s": "abcd"} and "absent" not in m


def test_a_removed_listener_hears_nothing_more(open_map: OpenMap) -> None:
    m = open_map()
    seen: list[Any] = []

    def listener(*event: Any) -> None:
        seen.append(event)

    m.add_listener(listener)
    m["a"] = 1
    m.remove_listener(listener)
    m["b"] = 2
    assert seen == [("a", None, 1, True)]
