"""The ops records of many puts and removes at once (kafkakv.map.bulk): the C function and its
Python twin give the same records, seqs and refusals; what they encode decodes as the ops a
replica applies; the C function leaks neither memory nor references."""

from __future__ import annotations

import importlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafkakv._native import PURE_PYTHON
from kafkakv.log.base import Record
from kafkakv.map import bulk
from kafkakv.map.ops import OpCode, decode_op
from tests.leaks import growth


def _compiled() -> Any:
    """The C function; the test fails, saying how to build it, when it is not built."""
    try:
        return importlib.import_module("kafkakv.map._bulk").update_records
    except ImportError as exc:
        pytest.fail(f"kafkakv.map._bulk is not built; reinstall kafkakv (pip install -e .): {exc}")


def test_this_installation_encodes_bulk_updates_in_c() -> None:
    if PURE_PYTHON:
        assert not bulk.COMPILED
    else:
        _compiled()
        assert bulk.COMPILED


def _outcome(fn: Any, *args: Any) -> Any:
    seqs = list(args[5])
    try:
        out, bad = fn(*args[:5], seqs, *args[6:])
    except (TypeError, ValueError) as exc:
        return type(exc).__name__, seqs
    return {p: [tuple(r) for r in rs] for p, rs in out.items()}, bad, seqs


# Values around msgpack's size bounds (bin 8/16/32) and seqs around its int bounds.
_VALUES = st.one_of(
    st.none(),
    st.binary(max_size=20),
    st.sampled_from([b"x" * 255, b"x" * 256, b"y" * 65_535, b"y" * 65_536]),
)
_SEQS = st.one_of(
    st.integers(0, 300),
    st.sampled_from([127, 128, 255, 256, 65_535, 65_536, 2**32 - 1, 2**32, 2**62]),
)


@settings(max_examples=300, deadline=None)
@given(
    rows=st.lists(st.tuples(st.binary(max_size=12), _VALUES, st.integers(0, 3)), max_size=30),
    seqs=st.lists(_SEQS, min_size=4, max_size=4),
    stride=st.sampled_from([1, 8, 1000]),
    limit=st.one_of(st.just(1 << 20), st.integers(20, 400)),
    origin=st.binary(min_size=0, max_size=300),
)
def test_the_c_function_and_its_twin_agree(
    rows: list[tuple[bytes, bytes | None, int]],
    seqs: list[int],
    stride: int,
    limit: int,
    origin: bytes,
) -> None:
    keys = [k for k, _, _ in rows]
    values = [v for _, v, _ in rows]
    parts = [p for _, _, p in rows]
    args = (Record, keys, values, parts, origin, seqs, stride, limit)
    mine = _outcome(_compiled(), *args)
    assert mine == _outcome(bulk.py_update_records, *args)
    if mine[1] != -1:
        return
    for p, records in mine[0].items():  # what a replica reads of them
        for n, (key, op, *rest) in enumerate(records):
            code, got_origin, seq, op_args = decode_op(op)
            assert got_origin == origin and seq == seqs[p] + n * stride
            value = values[[i for i, q in enumerate(parts) if q == p][n]]
            assert key == keys[[i for i, q in enumerate(parts) if q == p][n]]
            assert (code, op_args) == (
                (OpCode.REMOVE, ()) if value is None else (OpCode.PUT, (value,))
            )
            assert rest == [(), None, None, None]


def test_bad_arguments_are_refused_alike() -> None:
    c = _compiled()
    for fn in (c, bulk.py_update_records):
        with pytest.raises(ValueError, match="differ in length"):
            fn(Record, [b"a"], [], [0], b"o", [0], 1, 100)
        with pytest.raises(ValueError, match="not one of"):
            fn(Record, [b"a"], [b"1"], [2], b"o", [0, 0], 1, 100)
        with pytest.raises(TypeError, match="a key must be bytes"):
            fn(Record, ["a"], [b"1"], [0], b"o", [0], 1, 100)  # type: ignore[list-item]
        with pytest.raises(ValueError, match="stride"):
            fn(Record, [b"a"], [b"1"], [0], b"o", [0], 0, 100)
    with pytest.raises(TypeError):
        c(Record, (b"a",), [b"1"], [0], b"o", [0], 1, 100)


def test_the_c_function_leaks_no_memory_and_no_references() -> None:
    c = _compiled()
    key, value, origin = b"k" * 16, b"v" * 100, b"origin!!"
    keys, values = [key] * 50, [value, None] * 25
    parts = [i % 3 for i in range(50)]

    def work() -> None:
        for _ in range(2_000):
            seqs = [0, 1, 2]
            c(Record, keys, values, parts, origin, seqs, 8, 1 << 20)
            c(Record, keys, values, parts, origin, seqs, 8, 30)  # refused at row 0
            with pytest.raises(ValueError):
                c(Record, keys, values, [5] * 50, origin, seqs, 8, 1 << 20)

    found = growth(work, (key, value, origin, None))
    assert found.allocated < 64 * 1024, f"{found.allocated} bytes still allocated"
    assert found.refs_after[:3] == found.refs_before[:3]
    assert abs(found.refs_after[3] - found.refs_before[3]) < 100
