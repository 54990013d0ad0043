"""What map replicas report to Prometheus (kafkakv.map.metrics), scraped as Prometheus would.

- updates applied are counted per partition, by every replica, barriers and flush marks aside.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgpack
import pytest

from kafkakv import functions
from kafkakv.codecs import codec_for
from kafkakv.log.base import Record
from kafkakv.map.machine import MapState, MapTable, PartitionMachine
from kafkakv.map.ops import OpCode, encode_op
from kafkakv.store.memory import DictStore

# -- updates applied --------------------------------------------------------------------------
NO_ARGS = msgpack.packb([])  # a compute's arguments, as the map packs them


def _machine() -> PartitionMachine:
    state = MapState("m", b"", codec_for("str"), codec_for("json"), DictStore())
    return PartitionMachine(0, MapTable([state]), b"me------", 1000, "ops")


def _records(values: list[tuple[bytes | None, bytes]], first: int = 0) -> list[Record]:
    return [Record(k, v, (), None, 0, first + i) for i, (k, v) in enumerate(values)]


@pytest.fixture
def failing() -> Iterator[str]:
    name = "test_metrics.failing"

    def refuse(key: str, old: Any) -> Any:
        raise ValueError("refused")

    functions.register(name)(refuse)
    yield name
    functions.unregister(name)


def test_the_machine_counts_update_records_whatever_their_outcome(failing: str) -> None:
    me = b"me------"
    machine = _machine()
    step = machine.apply_batch(
        _records(
            [
                (b"a", encode_op(OpCode.PUT, me, 1, [b"1"])),
                (None, encode_op(OpCode.BARRIER, me, 2)),  # no update
                (b"a", encode_op(OpCode.PUT_IF_ABSENT, me, 3, [b"2"])),  # changes nothing
                (b"a", encode_op(OpCode.COMPUTE, me, 4, [failing, NO_ARGS])),  # fails
                (b"b", b"\xc1 not an op"),  # noted as an error, no update
                (b"c", encode_op(OpCode.WRITE_MANY, me, 5, ([b"c", b"d"], [b"1", b"2"]))),
                (None, encode_op(OpCode.FLUSHED, me, -1, [0])),  # no update
            ]
        ),
        7,
    )
    assert step.updates == 4
    machine.advance(step)
    assert machine.updates == 4
    # The bulk path (16 puts or more) counts as the record loop does.
    puts = _records([(b"k%d" % i, encode_op(OpCode.PUT, me, i, [b"1"])) for i in range(20)], 7)
    bulk = machine.apply_puts(puts, 27)
    assert bulk is not None and bulk.updates == 20
    machine.advance(bulk)
    assert machine.updates == 24
    # A stall: the records before it are counted, it and those after are not.
    step = machine.apply_batch(
        _records(
            [
                (b"x", encode_op(OpCode.PUT, me, 30, [b"1"])),
                (None, encode_op(OpCode.BARRIER, me, 31)),
                (b"x", encode_op(OpCode.COMPUTE, me, 32, ["test_metrics.nowhere", NO_ARGS])),
                (b"y", encode_op(OpCode.PUT, me, 33, [b"1"])),
            ],
            27,
        ),
        31,
    )
    assert step.stall is not None and step.updates == 1
    machine.advance(step)
    assert machine.updates == 25
