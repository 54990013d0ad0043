"""The ops records of many puts and removes at once (kafkakv.map.bulk): the C functions and
their Python twins give the same records (or columns), seqs and refusals; what they encode
decodes as the ops a replica applies, and the columns hold what the row path makes; the C
functions leak neither memory nor references (nor, for the columns, a buffer)."""

from __future__ import annotations

import importlib
from array import array
from itertools import accumulate
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafkakv._native import PURE_PYTHON
from kafkakv.log.base import Record
from kafkakv.log.columns import Columns
from kafkakv.log.partitioner import partition_for, py_partition_for
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


# update_columns: the records of an Arrow batch's two binary columns, as columns per partition.


def _compiled_columns() -> Any:
    """The C function; the test fails, saying how to build it, when it is not built."""
    try:
        return importlib.import_module("kafkakv.map._bulk").update_columns
    except (ImportError, AttributeError) as exc:
        pytest.fail(f"kafkakv.map._bulk is not built; reinstall kafkakv (pip install -e .): {exc}")


def _fields(columns: Any) -> tuple[Any, ...]:
    """A Columns' fields with its buffers as bytes, to compare."""
    assert type(columns) is Columns
    length, wide, key_offsets, key_data, value_offsets, value_data, apart = columns
    buffers = (bytes(b) for b in (key_offsets, key_data, value_offsets, value_data))
    return (length, wide, *buffers, apart)


def _columns_outcome(fn: Any, *args: Any) -> Any:
    """What ``fn`` gives (in the order of its partitions) or raises, and the seqs after."""
    seqs = list(args[8])
    try:
        out, bad = fn(*args[:8], seqs, *args[9:])
    except (TypeError, ValueError, OverflowError, BufferError) as exc:
        return type(exc).__name__, seqs
    return [(p, _fields(c)) for p, c in out.items()], bad, seqs


_FORMS = ["bytes", "memoryview", "numpy", "pyarrow", "array"]


def _as(form: str, data: bytes, code: str = "B") -> Any:
    """``data`` as a buffer of another kind (``code``: what its items are)."""
    if form == "bytes":
        return data
    if form == "memoryview":
        return memoryview(data)
    if form == "numpy":
        return np.frombuffer(data, dtype=np.int64 if code == "q" else np.uint8).copy()
    if form == "pyarrow":
        return pa.py_buffer(data)
    return array(code, data)


def _batch(
    rows: list[tuple[bytes, bytes | None]], junk: bytes, form: str, nulls_as: str
) -> tuple[Any, Any, Any, Any, Any]:
    """The buffers of two large_binary columns holding ``rows``, in ``form``; the data after
    ``junk`` (the offsets start past 0), a null's value bytes ``junk`` too (to be ignored)."""
    keys = [k for k, _ in rows]
    values = [junk if v is None else v for _, v in rows]
    key_offsets = array("q", accumulate(map(len, keys), initial=len(junk)))
    value_offsets = array("q", accumulate(map(len, values), initial=len(junk)))
    valid = bytes(v is not None for _, v in rows)
    if nulls_as == "none" and all(v is not None for _, v in rows):
        valid_arg: Any = None
    else:
        valid_arg = _as(form, bytes(2 * b for b in valid) if nulls_as == "twos" else valid)
    return (
        _as(form, key_offsets.tobytes(), "q"),
        _as(form, junk + b"".join(keys) + junk),
        _as(form, value_offsets.tobytes(), "q"),
        _as(form, junk + b"".join(values)),
        valid_arg,
    )


_KEYS = st.one_of(st.binary(max_size=12), st.binary(min_size=200, max_size=300))
_COLUMN_VALUES = st.one_of(st.none(), st.binary(max_size=40), st.binary(max_size=300))


@settings(max_examples=300, deadline=None)
@given(
    rows=st.lists(st.tuples(_KEYS, _COLUMN_VALUES), max_size=40),
    prefix=st.one_of(st.sampled_from([b"", b"m:"]), st.binary(max_size=20)),
    count=st.integers(1, 7),
    seqs=st.lists(_SEQS, min_size=7, max_size=7),
    stride=st.sampled_from([1, 7, 1000]),
    limit=st.one_of(st.just(1 << 20), st.integers(0, 400), st.just(1 << 70)),
    origin=st.binary(max_size=300),
    junk=st.sampled_from([b"", b"?", b"junk:" * 3]),
    form=st.sampled_from(_FORMS),
    nulls_as=st.sampled_from(["none", "ones", "twos"]),
)
def test_the_c_columns_and_their_twin_agree(
    rows: list[tuple[bytes, bytes | None]],
    prefix: bytes,
    count: int,
    seqs: list[int],
    stride: int,
    limit: int,
    origin: bytes,
    junk: bytes,
    form: str,
    nulls_as: str,
) -> None:
    buffers = _batch(rows, junk, form, nulls_as)
    args = (Columns, *buffers, prefix, origin, seqs[:count], stride, limit)
    mine = _columns_outcome(_compiled_columns(), *args)
    assert mine == _columns_outcome(bulk.py_update_columns, *args)
    # The same records as the row path, with partitions from the Python partitioner.
    record_keys = [prefix + k for k, _ in rows]
    values = [v for _, v in rows]
    parts = [py_partition_for(k, count) for k in record_keys]
    by_rows = _outcome(
        bulk.py_update_records,
        Record,
        record_keys,
        values,
        parts,
        origin,
        seqs[:count],
        stride,
        limit,
    )
    assert mine[1:] == by_rows[1:]
    decoded = {p: Columns(*fields).pairs() for p, fields in mine[0]}
    assert decoded == {p: [r[:2] for r in records] for p, records in by_rows[0].items()}
    assert [p for p, _ in mine[0]] == list(dict.fromkeys(parts[: len(rows) if mine[1] < 0 else 0]))


def _offsets_and_data(column: pa.Array[Any]) -> tuple[pa.Buffer, pa.Buffer]:
    """A large_binary array's offsets (its own, of a slice too) and data buffers."""
    _, offsets, data = column.buffers()
    assert offsets is not None and data is not None
    return offsets.slice(8 * column.offset, 8 * (len(column) + 1)), data


def test_columns_of_an_arrow_batch_are_its_rows_records() -> None:
    """The buffers a pyarrow batch holds, a slice of it included, as the Spark writer gives
    them (its validity bitmap as a byte per row)."""
    keys = pa.array([f"T{i:06d}".encode() for i in range(1000)], pa.large_binary())
    values = pa.array(
        [None if i % 10 == 3 else b"{}" * (i % 50) for i in range(1000)], pa.large_binary()
    )
    for start, length in [(0, 1000), (17, 500), (999, 1), (5, 0)]:
        k, v = keys.slice(start, length), values.slice(start, length)
        (key_offsets, key_data), (value_offsets, value_data) = map(_offsets_and_data, (k, v))
        valid = np.asarray(v.is_valid()).astype(np.uint8)
        seqs = [0, 1, 2]
        out, bad = bulk.update_columns(
            key_offsets,
            key_data,
            value_offsets,
            value_data,
            valid,
            b"m:",
            b"o",
            seqs,
            3,
            1 << 20,
        )
        record_keys = [b"m:" + x for x in k.to_pylist() if x is not None]
        row_seqs = [0, 1, 2]
        parts = [partition_for(x, 3) for x in record_keys]
        records, _ = bulk.update_records(
            record_keys, v.to_pylist(), parts, b"o", row_seqs, 3, 1 << 20
        )
        assert bad == -1 and seqs == row_seqs
        assert {p: c.pairs() for p, c in out.items()} == {
            p: [(r.key, r.value) for r in rs] for p, rs in records.items()
        }
        assert all(c.wide and c.apart == {} and c.length == len(c.pairs()) for c in out.values())


def test_no_rows_give_no_columns() -> None:
    for fn in (_compiled_columns(), bulk.py_update_columns):
        for offsets in (b"", array("q", [0]).tobytes(), array("q", [5]).tobytes()):
            seqs = [4, 5]
            assert fn(Columns, offsets, b"", offsets, b"", None, b"p", b"o", seqs, 2, 0) == ({}, -1)
            assert seqs == [4, 5]


def _q(*offsets: int) -> bytes:
    return array("q", offsets).tobytes()


_GOOD: tuple[Any, ...] = (
    Columns,
    _q(0, 1, 2),
    b"ab",
    _q(0, 1, 2),
    b"12",
    None,
    b"p",
    b"o",
    [0],
    1,
    100,
)
_REFUSED: list[tuple[dict[int, Any], type[Exception], str | None]] = [
    ({1: _q(0, 2, 1)}, ValueError, "key_offsets: row 1 ends at 1, before it starts at 2"),
    ({1: _q(0, 1, 3)}, ValueError, "key_offsets: row 1 ends at 3, past the 2 bytes of key_data"),
    ({1: _q(-1, 1, 2)}, ValueError, "key_offsets: row 0 starts at -1, before 0"),
    ({3: _q(0, 2, 1)}, ValueError, "value_offsets: row 1 ends at 1, before it starts at 2"),
    ({4: b"1"}, ValueError, "value_offsets: row 1 ends at 2, past the 1 bytes of value_data"),
    ({3: _q(0, 1)}, ValueError, "key_offsets hold 2 rows, value_offsets 1"),
    ({3: b""}, ValueError, "key_offsets hold 2 rows, value_offsets 0"),
    ({1: _q(0, 1, 2)[:-1]}, ValueError, "not a whole number of 64-bit offsets"),
    ({5: b"\x01"}, ValueError, "value_valid holds 1 bytes for 2 rows"),
    ({1: [0, 1, 2]}, TypeError, "key_offsets must be a buffer"),
    ({2: "ab"}, TypeError, "key_data must be a buffer"),
    ({1: b"\0" * 12, 4: None}, TypeError, "value_data must be a buffer"),  # before the counts
    ({5: [1, 1]}, TypeError, "value_valid must be a buffer"),
    ({1: memoryview(_q(0, 9, 1, 9, 2, 9)).cast("q")[::2]}, BufferError, None),
    ({6: "p"}, TypeError, "prefix and origin must be bytes"),
    ({7: bytearray(b"o")}, TypeError, "prefix and origin must be bytes"),
    ({0: dict}, TypeError, "columns_type must be a tuple type"),
    ({0: Columns(0, True, b"", b"", b"", b"", {})}, TypeError, "columns_type"),
    ({8: (0,)}, TypeError, "next_seqs must be a list"),
    ({8: []}, ValueError, "at least one"),
    ({8: [-1]}, OverflowError, None),
    ({8: [1 << 64]}, OverflowError, None),
    ({8: ["0"]}, TypeError, None),
    ({8: [(1 << 64) - 2]}, OverflowError, "row 1: partition 0's seqs go past 2\\*\\*64 - 1"),
    ({9: 0}, ValueError, "stride must be positive"),
    ({9: -(1 << 70)}, ValueError, "stride must be positive"),
    ({9: 1 << 63}, OverflowError, "stride is over"),
    ({9: 1.0}, TypeError, None),
    ({10: "100"}, TypeError, None),
]


@pytest.mark.parametrize(("change", "error", "message"), _REFUSED)
def test_bad_columns_are_refused_alike_with_nothing_numbered(
    change: dict[int, Any], error: type[Exception], message: str | None
) -> None:
    args: list[Any] = list(_GOOD)
    for at, arg in change.items():
        args[at] = arg
    for fn in (_compiled_columns(), bulk.py_update_columns):
        seqs = args[8]
        before = list(seqs) if isinstance(seqs, list) else seqs
        with pytest.raises(error, match=message):
            fn(*args)
        assert seqs == before


def test_limits_and_arguments_that_are_no_error() -> None:
    c = _compiled_columns()
    for fn in (c, bulk.py_update_columns):
        args: list[Any] = list(_GOOD)
        for limit, bad in [(-(1 << 70), 0), (-5, 0), (0, 0), (1 << 70, -1), (True, 0)]:
            seqs = [3]
            args[8], args[10] = seqs, limit
            assert fn(*args)[1] == bad
            assert seqs == ([3] if bad >= 0 else [5])
        # A partition's seqs may move on up to 2**64 - 1, the largest an ops record holds.
        seqs = [(1 << 64) - 3]
        args[8], args[10] = seqs, 100
        assert fn(*args)[1] == -1 and seqs == [(1 << 64) - 1]
    with pytest.raises(TypeError, match="takes 11 arguments"):
        c(*_GOOD[:10])


def test_update_columns_leaks_no_memory_no_references_and_no_buffer() -> None:
    c = _compiled_columns()
    keys = [b"key-%d" % i for i in range(50)]
    values = [b"v" * 100 if i % 3 else b"" for i in range(50)]
    key_offsets = bytearray(array("q", accumulate(map(len, keys), initial=0)).tobytes())
    key_data = bytearray(b"".join(keys))
    value_offsets = memoryview(array("q", accumulate(map(len, values), initial=0)).tobytes())
    value_data = pa.py_buffer(b"".join(values))
    valid = np.array([i % 5 != 0 for i in range(50)], dtype=np.uint8)
    prefix, origin = b"prefix:", b"origin!!"
    buffers = (key_offsets, key_data, value_offsets, value_data, valid)
    broken = bytearray(key_offsets)
    broken[8:16] = array("q", [1 << 40]).tobytes()

    def work() -> None:
        for _ in range(1_000):
            seqs = [0, 1, 2]
            c(Columns, *buffers, prefix, origin, seqs, 8, 1 << 20)
            c(Columns, *buffers, prefix, origin, seqs, 8, 30)  # refused at row 0
            with pytest.raises(ValueError):
                c(Columns, broken, *buffers[1:], prefix, origin, seqs, 8, 1 << 20)
            with pytest.raises(TypeError):
                c(Columns, *buffers[:4], "valid", prefix, origin, seqs, 8, 1 << 20)

    found = growth(work, (prefix, origin, None, Columns, *buffers))
    assert found.allocated < 64 * 1024, f"{found.allocated} bytes still allocated"
    assert found.refs_after[:2] == found.refs_before[:2]
    assert abs(found.refs_after[2] - found.refs_before[2]) < 100
    assert found.refs_after[3:] == found.refs_before[3:]
    key_offsets.extend(b"x" * 8)  # refused while a view of it is held
    broken.extend(b"x" * 8)
