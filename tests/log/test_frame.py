"""The append-side encoding (kafkakv.log.embedded.frame): the C functions and their Python
twins give the same bytes and the same errors for every input; what they write reads back;
the C module is what this installation uses; it leaks neither memory nor references; and
KAFKAKV_PURE_PYTHON=1 selects the twins for a whole process."""

from __future__ import annotations

import contextlib
import importlib
import itertools
import os
import struct
import subprocess
import sys
import textwrap
import zlib
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafkakv._native import PURE_PYTHON
from kafkakv.log.base import Record
from kafkakv.log.embedded import format as fmt
from kafkakv.log.embedded import frame
from kafkakv.log.embedded.head import BOOT_ID, HEAD_SIZE, HeadState, py_read_head, unpack_head
from tests.leaks import growth

PURE = PURE_PYTHON  # the twins for this whole process (kafkakv._native)


def _compiled() -> Any:
    """The C module; the test fails, saying how to build it, when it is not built."""
    try:
        module = importlib.import_module("kafkakv.log.embedded._frame")
    except ImportError as exc:
        pytest.fail(
            "kafkakv.log.embedded._frame is not built; reinstall kafkakv where a C compiler "
            f"and zlib's header are (pip install -e .): {exc}"
        )
    module.bind(Record)  # as frame.py and head.py do (not under KAFKAKV_PURE_PYTHON=1)
    module.bind_head(HeadState)
    return module


def outcome(fn: Callable[..., Any], *args: Any) -> tuple[Any, ...]:
    """What ``fn(*args)`` returns, or the type of what it raises."""
    try:
        return ("returned", fn(*args))
    except Exception as exc:
        return ("raised", type(exc))


def test_this_installation_encodes_through_the_c_module() -> None:
    if PURE:
        assert not frame.COMPILED and frame.plain_body is frame.py_plain_body
    else:
        _compiled()
        assert frame.COMPILED, (
            "the C module is built but kafkakv.log.embedded.frame did not take it"
        )
        assert frame.frame.__module__ == "kafkakv.log.embedded._frame"


# -- plain_body ----------------------------------------------------------------------------
class RecordLike(Record):
    """A Record subclass: not plain (the checked path takes it)."""


class Truthy:
    """Headers whose truth test says yes, or raises."""

    def __init__(self, answer: bool | None) -> None:
        self.answer = answer

    def __bool__(self) -> bool:
        if self.answer is None:
            raise LookupError("no truth here")
        return self.answer


def _sized(max_size: int) -> st.SearchStrategy[bytes]:
    # Sizes across msgpack's bin8 / bin16 bounds, with short ones most often.
    return st.one_of(
        st.binary(max_size=12),
        st.binary(min_size=250, max_size=260),
        st.binary(min_size=max_size - 2, max_size=max_size),
    )


KEYS = st.one_of(
    _sized(300), _sized(300), st.none(), st.text(max_size=3), st.binary().map(bytearray)
)
VALUES = st.one_of(_sized(300), _sized(300), st.none(), st.text(max_size=3), st.just(b""))
HEADERS: st.SearchStrategy[Any] = st.one_of(
    st.just(()),
    st.just(()),
    st.just([]),
    st.just([("h", b"x")]),
    st.builds(Truthy, st.sampled_from([False, True, None])),
)
TIMESTAMPS = st.one_of(st.none(), st.none(), st.integers(-5, 10), st.just([1]))  # [1]: unhashable


@st.composite
def a_record(draw: st.DrawFn) -> Any:
    kind = draw(st.sampled_from(["plain", "plain", "plain", "odd", "subclass", "tuple"]))
    if kind == "plain":
        return Record(draw(_sized(300)), draw(st.one_of(_sized(300), st.none())))
    if kind == "tuple":
        return (draw(_sized(8)), draw(_sized(8)))
    fields: tuple[Any, ...] = (draw(KEYS), draw(VALUES), draw(HEADERS), draw(TIMESTAMPS))
    return (RecordLike if kind == "subclass" else Record)(*fields)


@settings(max_examples=600, deadline=None)
@given(
    records=st.one_of(
        st.lists(a_record(), max_size=20), st.lists(a_record(), max_size=20).map(tuple)
    ),
    limit=st.one_of(st.integers(0, 700), st.just(1 << 20)),
)
def test_plain_body_the_c_function_and_its_twin_agree(records: Any, limit: int) -> None:
    c = _compiled()
    mine = outcome(c.plain_body, records, limit)
    assert mine == outcome(frame.py_plain_body, records, limit)
    if mine[0] == "returned" and mine[1] is not None:  # and it is the rows the reader expects
        rows = msgspec.msgpack.decode(mine[1])
        assert rows == [[i, 0, r[0], r[1], None] for i, r in enumerate(records)]


@pytest.mark.parametrize("short", [0, 1])
def test_plain_body_holds_the_largest_key_and_value_to_the_limit(short: int) -> None:
    """The largest key plus the largest value, of any records: at the limit a batch is plain,
    a byte over it is for the checked path (which says which record is too large)."""
    c = _compiled()
    one = [Record(b"k" * 10, b"v" * 20)]
    two = [Record(b"k" * 10, b"v"), Record(b"k", b"v" * 20)]  # from different records
    for records in (one, two):
        body = c.plain_body(records, 30 - short)
        assert body == frame.py_plain_body(records, 30 - short)
        assert (body is None) == bool(short)


@pytest.mark.parametrize(
    ("count", "key_size", "value_size"),
    [
        (15, 3, 3),  # fixarray
        (16, 3, 3),  # array16
        (65_535, 1, 0),
        (65_536, 1, 0),  # array32, and offsets as uint16 / uint32
        (2, 65_535, 65_536),  # bin16 and bin32
        (1, 0, 300_000),  # a body over 64 KiB: the CRC runs without the GIL
    ],
)
def test_plain_body_at_the_msgpack_size_bounds(count: int, key_size: int, value_size: int) -> None:
    c = _compiled()
    records = [Record(b"k" * key_size, b"v" * value_size) for _ in range(count)]
    body = c.plain_body(records, 1 << 20)
    assert body == frame.py_plain_body(records, 1 << 20)
    batch = c.frame(7, body, count, count - 1, 5, 5, 0, -1, 0)
    assert batch == frame.py_frame(7, body, count, count - 1, 5, 5, 0, -1, 0)
    header = fmt.parse_header(batch)
    assert fmt.verify_crc(batch, 0, header)
    stored = fmt.records_from_rows(fmt.decode_rows(batch, 0, header), header, 3)
    assert [(r.key, r.value, r.offset) for r in stored[:: max(1, count // 7)]] == [
        (b"k" * key_size, b"v" * value_size, 7 + i) for i in range(0, count, max(1, count // 7))
    ]


def test_plain_body_refuses_what_is_not_a_sequence_or_a_limit_as_its_twin_does() -> None:
    c = _compiled()
    for args in ((5, 10), ([Record(b"k", b"v")], "10")):
        assert outcome(c.plain_body, *args)[0] == "raised"
        assert outcome(c.plain_body, *args) == outcome(frame.py_plain_body, *args)
    for limit in (2**70, -(2**70), True):  # past 64 bits: every record fits, or none
        records = [Record(b"k", b"v")]
        assert outcome(c.plain_body, records, limit) == outcome(frame.py_plain_body, records, limit)
    with pytest.raises(TypeError):
        c.plain_body([])


# -- plain_body_columns ---------------------------------------------------------------------


def _columns_args(rows: list[tuple[bytes, bytes]], wide: bool) -> tuple[Any, ...]:
    """``plain_body_columns``'s first six arguments for ``rows``."""
    kind = "q" if wide else "i"
    key_offsets = array(kind, [0, *itertools.accumulate(len(k) for k, _ in rows)])
    value_offsets = array(kind, [0, *itertools.accumulate(len(v) for _, v in rows)])
    return (
        len(rows),
        wide,
        key_offsets.tobytes(),
        b"".join(k for k, _ in rows),
        value_offsets.tobytes(),
        b"".join(v for _, v in rows),
    )


@settings(max_examples=400, deadline=None)
@given(
    rows=st.lists(st.tuples(_sized(300), _sized(300)), max_size=40),
    wide=st.booleans(),
    limit=st.integers(0, 700),
    as_views=st.booleans(),
)
def test_plain_body_columns_the_c_function_its_twin_and_plain_body_agree(
    rows: list[tuple[bytes, bytes]], wide: bool, limit: int, as_views: bool
) -> None:
    """From buffers of any kind, with 32- or 64-bit offsets: the body plain_body makes of the
    same rows as records, and None where it gives None (too large) or for no rows."""
    c = _compiled()
    args = _columns_args(rows, wide)
    if as_views:
        args = tuple(memoryview(a) if isinstance(a, bytes) else a for a in args)
    mine = outcome(c.plain_body_columns, *args, limit)
    assert mine == outcome(frame.py_plain_body_columns, *args, limit)
    assert mine == outcome(c.plain_body, [Record(k, v) for k, v in rows], limit)


def test_plain_body_columns_at_the_msgpack_size_bounds() -> None:
    c = _compiled()
    for count, key_size, value_size in (
        (15, 3, 3),
        (16, 3, 3),
        (65_536, 1, 0),
        (2, 65_535, 65_536),
    ):
        rows = [(b"k" * key_size, b"v" * value_size)] * count
        args = _columns_args(rows, count % 2 == 0)
        body = c.plain_body_columns(*args, 1 << 20)
        twin: Any = frame.py_plain_body_columns
        assert body == twin(*args, 1 << 20)
        assert body == c.plain_body([Record(k, v) for k, v in rows], 1 << 20)


def test_plain_body_columns_refuses_offsets_that_do_not_bound_rows_as_its_twin_does() -> None:
    c = _compiled()
    good = _columns_args([(b"ab", b"x"), (b"c", b"yz")], False)
    bad: list[tuple[Any, ...]] = [
        (3, *good[1:]),  # more rows than offsets
        (-1, *good[1:]),
        (2, False, array("i", [1, 0, 3]).tobytes(), *good[3:]),  # going back
        (2, False, array("i", [-1, 0, 3]).tobytes(), *good[3:]),  # below 0
        (2, False, good[2], b"ab", *good[4:]),  # past the key data
        (*good[:4], array("i", [0, 1, 4]).tobytes(), good[5]),  # past the value data
        (2, True, *good[2:]),  # 32-bit offsets read as 64-bit
        (*good[:2], "not a buffer", *good[3:]),
        (2**70, *good[1:]),
    ]
    for args in bad:
        mine = outcome(c.plain_body_columns, *args, 100)
        assert mine[0] == "raised", args
        assert mine == outcome(frame.py_plain_body_columns, *args, 100), args
    with pytest.raises(TypeError):
        c.plain_body_columns(*good)


def test_plain_body_columns_leaks_no_memory_and_no_references() -> None:
    c = _compiled()
    args = _columns_args([(b"k%d" % i, b"v" * i) for i in range(50)], True)

    def work() -> None:
        for _ in range(200):
            c.plain_body_columns(*args, 1000)
            c.plain_body_columns(*args, 10)  # too large: None
            with contextlib.suppress(ValueError):
                c.plain_body_columns(3, *args[1:], 1000)

    found = growth(work, args)
    assert found.allocated < 16 * 1024, f"{found.allocated} bytes still allocated"
    assert found.refs_after == found.refs_before


# -- frame --------------------------------------------------------------------------------
# (bits, signed) of frame()'s arguments after the body, in order.
_FIELDS = {
    "base_offset": (64, False),
    "record_count": (32, False),
    "last_offset_delta": (32, False),
    "base_timestamp": (64, True),
    "max_timestamp": (64, True),
    "attributes": (8, False),
    "delete_horizon_ms": (64, True),
    "producer": (32, False),
}


def _bounds(bits: int, signed: bool) -> tuple[int, int]:
    return (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)


@st.composite
def frame_args(draw: st.DrawFn) -> list[Any]:
    """frame()'s arguments: every field in its range (its bounds often), or now and then one
    of them out of range or not an int."""
    values: dict[str, Any] = {}
    for name, (bits, signed) in _FIELDS.items():
        low, high = _bounds(bits, signed)
        values[name] = draw(st.one_of(st.integers(low, high), st.sampled_from([low, high])))
    if draw(st.integers(0, 3)) == 0:
        name = draw(st.sampled_from(sorted(_FIELDS)))
        low, high = _bounds(*_FIELDS[name])
        values[name] = draw(st.sampled_from([low - 1, high + 1, 1.5, "1", True, None]))
    body = draw(st.one_of(st.binary(max_size=300), st.just(bytearray(b"ab")), st.just("ab")))
    names = list(_FIELDS)
    return [values["base_offset"], body, *(values[n] for n in names[1:])]


@settings(max_examples=600, deadline=None)
@given(args=frame_args())
def test_frame_the_c_function_and_its_twin_agree(args: list[Any]) -> None:
    c = _compiled()
    mine = outcome(c.frame, *args)
    assert mine == outcome(frame.py_frame, *args)
    if mine[0] == "returned":  # the fields where format.py's readers look for them
        batch = mine[1]
        (base, size, crc, magic, attributes, _, count, last, *rest) = frame.BATCH_HEADER.unpack(
            batch[:56]
        )
        assert (base, size, magic) == (args[0], len(batch), 2)
        assert crc == zlib.crc32(batch[16:], zlib.crc32(batch[:8]))  # the offset, then 16..
        assert [attributes, count, last, *rest] == args[6:7] + args[2:6] + args[7:]
        assert batch[56:] == args[1]
    # frame_header: the same header alone, or the same error
    header = outcome(c.frame_header, *args)
    assert header == outcome(frame.py_frame_header, *args)
    assert header == (("returned", mine[1][:56]) if mine[0] == "returned" else mine)


def test_frame_takes_nine_arguments() -> None:
    c = _compiled()
    for function in (c.frame, c.frame_header):
        with pytest.raises(TypeError):
            function(0, b"")


def test_frame_header_of_a_body_of_megabytes_covers_it_all() -> None:
    """A body past 64 KiB takes the CRC without the GIL: the same CRC as zlib's."""
    c = _compiled()
    body = os.urandom(3 << 20)
    header = c.frame_header(1, body, 1, 0, 2, 3, 0, -1, 0)
    assert header == frame.py_frame_header(1, body, 1, 0, 2, 3, 0, -1, 0)
    crc = zlib.crc32(body, zlib.crc32(header[16:], zlib.crc32(header[:8])))
    assert int.from_bytes(header[12:16], "little") == crc


# -- pack_head ----------------------------------------------------------------------------
@settings(max_examples=400, deadline=None)
@given(
    fields=st.lists(
        st.one_of(st.integers(0, 2**64 - 1), st.sampled_from([0, 2**64 - 1])),
        min_size=7,
        max_size=7,
    ),
    spoil=st.one_of(st.none(), st.tuples(st.integers(0, 6), st.sampled_from([-1, 2**64, 1.5]))),
    boot=st.one_of(
        st.binary(min_size=16, max_size=16),
        st.binary(max_size=20),
        st.binary(max_size=20).map(bytearray),
        st.just("boot"),
    ),
    shape=st.sampled_from(["head", "tuple", "short", "list"]),
)
def test_pack_head_the_c_function_and_its_twin_agree(
    fields: list[Any], spoil: tuple[int, Any] | None, boot: Any, shape: str
) -> None:
    c = _compiled()
    if spoil is not None:  # one field out of range or not an int
        fields[spoil[0]] = spoil[1]
    if shape == "head":
        state: Any = HeadState._make([*fields, boot])
    elif shape == "tuple":
        state = (*fields, boot)
    elif shape == "short":
        state = tuple(fields)
    else:
        state = [*fields, boot]
    mine = outcome(c.pack_head, state)
    assert mine == outcome(frame.py_pack_head, state)
    if mine[0] == "returned" and type(boot) is bytes and len(boot) == 16:
        assert unpack_head(mine[1]) == HeadState._make([*fields, boot])


# -- read_head ----------------------------------------------------------------------------
@settings(max_examples=400, deadline=None)
@given(
    fields=st.lists(st.integers(0, 2**64 - 1), min_size=7, max_size=7),
    boot=st.binary(min_size=16, max_size=16),
    damage=st.one_of(
        st.none(),
        st.tuples(st.integers(0, HEAD_SIZE - 1), st.integers(1, 255)),  # a byte flipped
        st.integers(0, HEAD_SIZE - 1).map(lambda n: ("short", n)),  # a mapping too small
    ),
    tail=st.binary(max_size=8),  # what a buffer holds past the record (an mmap: nothing)
    last_is=st.sampled_from(["same", "other", "empty"]),
    kind=st.sampled_from([bytes, bytearray]),
)
def test_read_head_the_c_function_and_its_twin_agree(
    fields: list[int],
    boot: bytes,
    damage: Any,
    tail: bytes,
    last_is: str,
    kind: type,
) -> None:
    c = _compiled()
    frame.bind_head(HeadState)  # as head.py does (not under KAFKAKV_PURE_PYTHON=1)
    state = HeadState._make([*fields, boot])
    raw = bytearray(state.pack())
    if isinstance(damage, tuple) and damage[0] == "short":
        raw = raw[: damage[1]]
    elif damage is not None:
        raw[damage[0]] ^= damage[1]
    record = bytes(raw[:HEAD_SIZE])
    if last_is == "same":
        last: Any = (record, unpack_head(record))
    elif last_is == "other":
        other = HeadState(1, 2, 3, 4, 5, 6, 7, BOOT_ID).pack()
        last = (other, unpack_head(other))
    else:
        last = (b"", None)
    buffer = kind(raw + tail) if len(raw) == HEAD_SIZE else kind(raw)
    mine, twin = c.read_head(buffer, last), py_read_head(buffer, last)
    if twin is last:
        assert mine is last
    else:
        assert mine == twin
    if damage is None:  # a whole record reads as its state
        assert mine is last or mine == (bytes(state.pack()), state)


def test_read_head_refuses_what_is_not_a_buffer_and_a_pair() -> None:
    c = _compiled()
    frame.bind_head(HeadState)
    raw = HeadState(3, 100, 0, 64, 8_192, 2, 4_096, BOOT_ID).pack()
    for args in [("head", (b"", None)), (raw, [b"", None]), (raw, (b"",)), (raw,)]:
        with pytest.raises(TypeError):
            c.read_head(*args)
    got = c.read_head(memoryview(raw), (b"", None))  # any buffer
    assert got is not None and got[1] == unpack_head(raw) and type(got[1]) is HeadState


def test_a_head_packs_and_reads_back() -> None:
    state = HeadState(3, 100, 0, 64, 8_192, 2, 4_096, BOOT_ID)
    assert unpack_head(state.pack()) == state
    assert _compiled().pack_head(state) == frame.py_pack_head(state) == state.pack()
    with pytest.raises(struct.error):
        _compiled().pack_head(HeadState(-1, 0, 0, 0, 0, 0, 0, BOOT_ID))


# -- latest_into ---------------------------------------------------------------------------
_OFFSET_DELTAS = st.one_of(
    st.integers(0, 200),
    st.sampled_from([127, 128, 255, 256, 65_535, 65_536, 2**32, 2**63 - 1, 2**63, 2**64 - 1]),
    st.integers(-(2**63), -1),
)
_ROWS = st.lists(
    st.tuples(
        _OFFSET_DELTAS,
        st.one_of(st.integers(-300, 300), st.integers(-(2**63), 2**64 - 1)),
        st.one_of(st.none(), st.binary(max_size=4), _sized(300)),
        st.one_of(st.none(), st.binary(max_size=4), _sized(300)),
        st.one_of(st.none(), st.just(()), st.just([("h", b"x"), ("é" * 20, b"")])),
    ),
    max_size=20,
)
# Values of every msgpack type, for a field of a row (or the row itself) that should not hold it.
_MISFITS = st.sampled_from(
    [
        "",
        "x",
        1.5,
        True,
        False,
        {},
        {"a": 1},
        [],
        [1],
        [b"k"],
        [["h", b"x", 1]],
        [[1, b"x"]],
        [["h", "x"]],
        b"",
        0,
        -1,
        None,
        msgspec.msgpack.Ext(1, b"x"),
    ]
)


@st.composite
def _misfit_rows(draw: st.DrawFn) -> list[Any]:
    """Rows with one field, or one row, replaced by a value of another type (or shape)."""
    rows: list[Any] = [list(r) for r in draw(_ROWS.filter(bool))]
    i = draw(st.integers(0, len(rows) - 1))
    field = draw(st.integers(0, 5))
    if field == 5:  # the row itself: too short, too long, not an array
        rows[i] = draw(st.sampled_from([rows[i][:4], [*rows[i], None], draw(_MISFITS)]))
    else:
        rows[i][field] = draw(_MISFITS)
    return rows


def _latest(fn: Callable[..., Any], body: bytes, first: int, limit: int) -> tuple[Any, ...]:
    """What ``fn`` returns and leaves in a dict that held one key before, or that it raised
    a ValueError (msgspec's errors are ValueErrors; the C function's messages differ) and
    left the dict as it was."""
    target: dict[bytes | None, bytes | None] = {b"before": b"1"}
    try:
        result = fn(target, body, first, limit)
    except ValueError:
        assert target == {b"before": b"1"}, "a failed call changed the dict"
        return ("raised ValueError",)
    return result, list(target.items())


@settings(max_examples=800, deadline=None)
@given(
    rows=st.one_of(_ROWS, _ROWS, _misfit_rows()),
    first=st.one_of(st.integers(-2, 30), st.just(2**63 - 1)),
    limit=st.one_of(st.integers(0, 25), st.just(1 << 30), st.integers(-3, -1)),
    damage=st.one_of(
        st.none(),
        st.tuples(st.sampled_from(["cut", "flip", "add"]), st.integers(0, 10_000), st.binary()),
    ),
)
def test_latest_into_the_c_function_and_its_twin_agree(
    rows: list[Any], first: int, limit: int, damage: tuple[str, int, bytes] | None
) -> None:
    """On stored bodies, and on bodies cut short, with a byte changed or with bytes added:
    the same dict and answer, or a ValueError from both with the dict untouched."""
    c = _compiled()
    body = frame.pack_rows(rows)
    if damage is not None:
        how, at, extra = damage
        at %= len(body)
        if how == "cut":
            body = body[:at]
        elif how == "flip":
            body = body[:at] + bytes([body[at] ^ (extra[0] if extra else 0x40)]) + body[at + 1 :]
        else:
            body = body[:at] + extra + body[at:]
    mine = _latest(c.latest_into, body, first, limit)
    assert mine == _latest(frame.py_latest_into, body, first, limit)
    if damage is None and mine[0] != "raised ValueError":  # what a reader of the rows builds
        wanted = [r for r in rows if r[0] >= first]
        taken = wanted[: max(limit, 0)] if limit >= 0 else wanted
        assert mine[0] == (len(taken), taken[-1][0] if taken else -1, taken == wanted)
        assert dict(mine[1]) == {b"before": b"1", **{r[2]: r[3] for r in taken}}


def test_latest_into_takes_a_memoryview_and_refuses_what_is_not_a_dict() -> None:
    c = _compiled()
    body = frame.pack_rows([(0, 0, b"a", b"1", None), (1, 0, b"a", b"2", None)])
    for fn in (c.latest_into, frame.py_latest_into):
        target: dict[bytes | None, bytes | None] = {}
        assert fn(target, memoryview(body), 0, 10) == (2, 1, True)
        assert target == {b"a": b"2"}
        with pytest.raises(TypeError):
            fn([], body, 0, 10)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        c.latest_into({}, body, 0)
    with pytest.raises(TypeError):
        c.latest_into({}, "not bytes", 0, 10)


# -- the module as a whole ----------------------------------------------------------------
def test_the_c_functions_leak_no_memory_and_no_references() -> None:
    c = _compiled()
    key, value = b"k" * 16, b"v" * 100
    plain = [Record(key, value) for _ in range(8)]
    odd = [Record(key, value), Record(key, value, [("h", b"x")])]
    raising = [Record(key, value, Truthy(None))]  # type: ignore[arg-type]
    state = HeadState(3, 100, 0, 64, 8_192, 2, 4_096, BOOT_ID)
    packed = state.pack()
    torn = packed[:40] + bytes(40)
    frame.bind_head(HeadState)

    def work() -> None:
        for _ in range(5_000):
            body = c.plain_body(plain, 1_000)
            c.plain_body(odd, 1_000)
            c.plain_body(plain, 10)
            with contextlib.suppress(LookupError):
                c.plain_body(raising, 1_000)
            c.frame(1, body, 8, 7, 1, 2, 0, -1, 0)
            with contextlib.suppress(struct.error):
                c.frame(-1, body, 8, 7, 1, 2, 0, -1, 0)
            c.pack_head(state)
            last = c.read_head(packed, (b"", None))
            c.read_head(packed, last)
            c.read_head(torn, last)
            with contextlib.suppress(TypeError):
                c.read_head(packed, [b"", None])
            target: dict[bytes | None, bytes | None] = {}
            c.latest_into(target, rows, 0, 8)
            c.latest_into(target, rows, 3, 2)  # stops inside, over the same keys
            with contextlib.suppress(ValueError):
                c.latest_into(target, rows[:-3], 0, 8)
            with contextlib.suppress(ValueError):
                c.latest_into(target, bad_name, 0, 8)

    rows = frame.pack_rows([(i, 0, key, value, [("h", b"x")] if i % 2 else None) for i in range(8)])
    # A header name that is not UTF-8: a str of one byte, 0xff.
    bad_name = frame.pack_rows([(0, 0, key, value, [("~", b"x")])]).replace(b"\xa1~", b"\xa1\xff")
    found = growth(work, (key, value, plain[0], state, None))
    assert found.allocated < 64 * 1024, (
        f"{found.allocated} bytes still allocated after 75,000 calls"
    )
    assert found.refs_after[:4] == found.refs_before[:4]
    # None: a reference leaked per call would be thousands
    assert abs(found.refs_after[4] - found.refs_before[4]) < 100


def test_kafkakv_pure_python_selects_the_twins_for_a_whole_process(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        from kafkakv.log import EmbeddedLog, Record
        from kafkakv.log.embedded import frame
        assert not frame.COMPILED and frame.frame is frame.py_frame
        with EmbeddedLog(DIR) as log:
            log.create_topic("t", 1)
            log.append("t", 0, [Record(b"k", b"v"), Record(b"l", None)])
            print([(r.key, r.value) for r in log.read("t", 0, 0)])
        """
    ).replace("DIR", repr(str(tmp_path / "log")))
    env = dict(os.environ, KAFKAKV_PURE_PYTHON="1")
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[(b'k', b'v'), (b'l', None)]"
