"""The last value per key as columns (Log.latest_columns, kafkakv.log.embedded.columns): the
C accumulator and its Python twin agree body by body, errors included; every log gives the
columns a dict of the last values would give, from any offset and through any read shape; the
accumulator leaks neither memory nor references."""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kafkakv._native import PURE_PYTHON
from kafkakv.errors import CorruptLogError, RecordTooLargeError
from kafkakv.log import EmbeddedLog, MemoryLog
from kafkakv.log.base import Log, Record
from kafkakv.log.columns import Columns, columns_of
from kafkakv.log.embedded import columns as embedded_columns
from kafkakv.log.embedded import frame
from tests.leaks import growth
from tests.log.test_frame import _ROWS, _columns_args, _misfit_rows

APART = (b"\x00flush", b"\x00settings")


def _compiled() -> Any:
    """The C accumulator; the test fails, saying how to build it, when it is not built."""
    try:
        return importlib.import_module("kafkakv.log.embedded._columns").LatestColumns
    except ImportError as exc:
        pytest.fail(
            "kafkakv.log.embedded._columns is not built; reinstall kafkakv where a C compiler "
            f"is (pip install -e .): {exc}"
        )


def test_this_installation_gathers_columns_in_c() -> None:
    if PURE_PYTHON:
        assert not embedded_columns.COMPILED
    else:
        _compiled()
        assert embedded_columns.COMPILED
        assert type(embedded_columns.new_latest_columns()).__module__ == (
            "kafkakv.log.embedded._columns"
        )


def _fed(make: Callable[[], Any], steps: list[tuple[Any, ...]]) -> list[Any]:
    """What an accumulator answers to each step (``add`` with a body, ``put`` with a pair),
    a ValueError or TypeError standing for its type, then what it finishes with."""
    acc = make()
    said: list[Any] = []
    for step in steps:
        try:
            if step[0] == "add":
                said.append(acc.add(*step[1:]))
            else:
                said.append(acc.put(*step[1:]))
        except (ValueError, TypeError) as exc:  # (msgspec's errors are ValueErrors)
            said.append("ValueError" if isinstance(exc, ValueError) else "TypeError")
        said.append(len(acc))
    said.append(Columns(*acc.finish(APART)))
    return said


def _damaged(body: bytes, damage: tuple[str, int, bytes] | None) -> bytes:
    if damage is None or not body:
        return body
    how, at, extra = damage
    at %= len(body)
    if how == "cut":
        return body[:at]
    if how == "flip":
        return body[:at] + bytes([body[at] ^ (extra[0] if extra else 0x40)]) + body[at + 1 :]
    return body[:at] + extra + body[at:]


_KEYS = st.one_of(st.none(), st.sampled_from([b"a", b"b", b"", b"\x00flush", b"k" * 40]))
_DAMAGE = st.one_of(
    st.none(),
    st.tuples(st.sampled_from(["cut", "flip", "add"]), st.integers(0, 10_000), st.binary()),
)
_STEPS = st.lists(
    st.one_of(
        st.tuples(
            st.just("add"),
            st.one_of(_ROWS, _ROWS, _misfit_rows()),
            st.one_of(st.integers(-2, 30), st.just(2**63 - 1)),
            st.one_of(st.integers(0, 25), st.just(1 << 30), st.integers(-3, -1)),
            _DAMAGE,
        ),
        st.tuples(
            st.just("put"),
            _KEYS,
            st.one_of(st.none(), st.binary(max_size=8), st.just("not bytes")),
        ),
    ),
    max_size=6,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=_STEPS)
def test_the_c_accumulator_and_its_twin_agree(steps: list[tuple[Any, ...]]) -> None:
    """Bodies as stored, cut short, with a byte changed or bytes added, and rows put one by
    one: the same answers, the same errors (a failed add changes nothing), the same columns,
    which are those of a dict of the last values."""
    fed: list[tuple[Any, ...]] = []
    for step in steps:
        if step[0] == "add":
            _, rows, first, limit, damage = step
            fed.append(("add", _damaged(frame.pack_rows(rows), damage), first, limit))
        else:
            fed.append(step)
    seed = 12345
    mine = _fed(lambda: _compiled()(seed), fed)
    assert mine == _fed(lambda: embedded_columns.PyLatestColumns(seed), fed)
    latest: dict[bytes | None, bytes | None] = {}
    for step in fed:  # what a dict of the last values holds after the same steps
        if step[0] == "add":
            with contextlib.suppress(ValueError):
                frame.py_latest_into(latest, *step[1:])
        elif step[1] is not None and (step[2] is None or isinstance(step[2], bytes)):
            latest[step[1]] = step[2]
    assert mine[-1] == columns_of(latest, APART)


def test_keys_that_collide_in_the_table_and_a_table_that_grows_keep_their_last_values() -> None:
    """200,000 keys over many growths of the table, every one put twice, some removed."""
    make = _compiled()
    rows: list[tuple[int, int, bytes, bytes | None, None]]
    rows = [(i, 0, b"%d" % (i % 100_000), b"v%d" % i, None) for i in range(200_000)]
    rows += [(200_000 + i, 0, b"%d" % i, None, None) for i in range(0, 100_000, 7)]
    body = frame.pack_rows(rows)
    acc = make(0)  # seed 0 too: any seed works
    assert acc.add(body, 0, 1 << 40) == (len(rows), rows[-1][0], True)
    assert len(acc) == 100_000
    got = Columns(*acc.finish(()))
    wanted = {b"%d" % i: b"v%d" % (100_000 + i) for i in range(100_000) if i % 7}
    assert got.length == len(wanted)
    assert dict(got.pairs()) == wanted
    assert [k for k, _ in got.pairs()] == list(wanted)  # the order keys first came in


def test_the_accumulator_refuses_what_is_not_bytes_and_holds_what_it_points_into() -> None:
    make = _compiled()
    acc = make(1)
    with pytest.raises(TypeError):
        acc.add("text", 0, 1)
    with pytest.raises(TypeError):
        acc.put("a", b"1")
    with pytest.raises(TypeError):
        acc.finish([b"a"])
    body = bytearray(frame.pack_rows([(0, 0, b"key", b"value", None)]))
    acc.add(body, 0, 10)
    with pytest.raises(BufferError):  # the body is held: it cannot be resized under the table
        body.extend(b"more")
    key, value = bytes(b"k%d" % 7), bytes(b"v" * 50)
    acc.put(key, value)
    del key, value
    assert Columns(*acc.finish(())).pairs() == [(b"key", b"value"), (b"k7", b"v" * 50)]


@pytest.mark.parametrize("implementation", ["c", "python"])
def test_columns_are_written_into_the_buffers_allocate_gives(implementation: str) -> None:
    """Arrow's pool, or any writable buffer: the same columns as new bytes; a buffer too
    short or read-only is refused."""
    make = _compiled() if implementation == "c" else embedded_columns.PyLatestColumns
    acc = make(3)
    acc.add(frame.pack_rows([(i, 0, b"k%d" % i, b"v" * i, None) for i in range(30)]), 0, 99)
    plain = Columns(*acc.finish(APART))
    pooled = Columns(*acc.finish(APART, pa.allocate_buffer))
    assert all(isinstance(b, pa.Buffer) for b in pooled[2:6])
    assert pooled.pairs() == plain.pairs() and pooled.length == plain.length == 30
    given = Columns(*acc.finish(APART, bytearray))
    assert given == plain and all(type(b) is bytearray for b in given[2:6])
    with pytest.raises(ValueError, match="gave a buffer of"):
        acc.finish(APART, lambda n: bytearray(max(n - 1, 0)))
    with pytest.raises(BufferError):
        acc.finish(APART, bytes)


# -- packed: a list of values as one column ------------------------------------------------
def _packed() -> Any:
    """The C ``packed``; the test fails, saying how to build it, when it is not built."""
    _compiled()
    return importlib.import_module("kafkakv.log.embedded._columns").packed


@settings(max_examples=300, deadline=None)
@given(
    values=st.lists(st.one_of(st.none(), st.binary(max_size=40)), max_size=70),
    narrow=st.sampled_from([0, 5, 100, 2**31 - 1]),
)
def test_packed_and_its_twin_give_the_arrow_column_of_the_values(
    values: list[bytes | None], narrow: int
) -> None:
    """The same buffers from C and Python; as an Arrow array they are the values (32-bit
    offsets up to ``narrow`` bytes of data, 64-bit past it), nulls where None."""
    c, py = _packed()(values, None, narrow), embedded_columns.py_packed(values, None, narrow)
    assert c == py
    n, wide, offsets, data, valid, nulls = c
    assert (n, nulls, wide) == (len(values), values.count(None), len(data) > narrow)
    kind = pa.large_binary() if wide else pa.binary()
    column = pa.Array.from_buffers(
        kind,
        n,
        [None if valid is None else pa.py_buffer(valid), pa.py_buffer(offsets), pa.py_buffer(data)],
        null_count=nulls,
    )
    column.validate(full=True)
    assert column.to_pylist() == values


@pytest.mark.parametrize("implementation", ["c", "python"])
def test_packed_writes_into_what_allocate_gives_and_names_a_row_not_bytes(
    implementation: str,
) -> None:
    packed: Callable[..., Any] = _packed() if implementation == "c" else embedded_columns.py_packed
    values = [b"ab", None, b"", b"c" * 9] * 5
    pooled = packed(values, pa.allocate_buffer)
    assert all(isinstance(b, pa.Buffer) for b in pooled[2:5])
    assert [bytes(b) for b in pooled[2:5]] == list(packed(values)[2:5])
    assert packed([b"a"], pa.allocate_buffer)[4] is None  # no null: no bitmap
    with pytest.raises(TypeError, match="row 2 is str, not bytes or None"):
        packed([b"a", None, "b"])
    with pytest.raises(TypeError, match="values must be a list"):
        packed((b"a",))
    with pytest.raises(ValueError, match="gave a buffer of"):
        packed(values, lambda n: bytearray(max(n - 1, 0)))


def test_packed_refuses_a_list_that_allocate_changed() -> None:
    """``allocate`` runs Python code between the sizes and the copy: a list changed meanwhile
    is refused, nothing written past the buffers it sized."""
    packed = _packed()
    for change in (
        lambda rows: rows.append(b"more"),
        lambda rows: rows.__setitem__(0, b"x" * 1000),
        lambda rows: rows.__setitem__(0, None),
        lambda rows: rows.__setitem__(0, b""),
    ):
        rows: list[bytes | None] = [b"abc", b"de"]

        def allocate(size: int, rows: list[bytes | None] = rows, change: Any = change) -> Any:
            change(rows)
            return bytearray(size)

        with pytest.raises(RuntimeError, match="the list changed while packed"):
            packed(rows, allocate)


def test_packed_leaks_no_memory_and_no_references() -> None:
    packed = _packed()
    values = [b"v" * 100, None, b"k" * 16] * 30

    def work() -> None:
        for _ in range(2_000):
            packed(values)
            packed(values, bytearray, 10)
            with contextlib.suppress(TypeError):
                packed([b"a", 1])
            with contextlib.suppress(ValueError):
                packed(values, lambda n: bytearray(max(n - 1, 0)))

    found = growth(work, (values, None))
    assert found.allocated < 64 * 1024, f"{found.allocated} bytes still allocated"
    assert found.refs_after[:2] == found.refs_before[:2]


def test_the_accumulator_leaks_no_memory_and_no_references() -> None:
    make = _compiled()
    key, value = b"k" * 16, b"v" * 100
    rows = frame.pack_rows([(i, 0, key + bytes([i]), value, None) for i in range(50)])
    broken = rows[:-3]

    def work() -> None:
        for _ in range(2_000):
            acc = make(5)
            acc.add(rows, 0, 100)
            acc.add(rows, 10, 5)
            with contextlib.suppress(ValueError):
                acc.add(broken, 0, 100)
            acc.put(key, value)
            acc.put(key, None)
            acc.finish((key,))
            acc.finish((), bytearray)
            with contextlib.suppress(ValueError):
                acc.finish((), lambda n: bytearray(max(n - 1, 0)))

    found = growth(work, (key, value, rows, None))
    assert found.allocated < 64 * 1024, f"{found.allocated} bytes still allocated"
    assert found.refs_after[:3] == found.refs_before[:3]
    assert abs(found.refs_after[3] - found.refs_before[3]) < 100


# -- Log.latest_columns --------------------------------------------------------------------
_BATCHES = st.lists(
    st.lists(
        st.tuples(
            st.one_of(st.none(), st.sampled_from([b"a", b"b", b"c", b"\x00flush"]), st.binary()),
            st.one_of(st.none(), st.binary(max_size=20)),
        ),
        min_size=1,
        max_size=30,
    ),
    min_size=1,
    max_size=12,
)


def _expected(log: Log, offset: int) -> Columns:
    """The columns of a dict of the last values, built from the records themselves."""
    latest: dict[bytes | None, bytes | None] = {}
    for record in log.read("t", 0, offset, max_records=1 << 30, max_bytes=1 << 30):
        latest[record.key] = record.value
    return columns_of(latest, APART)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(batches=_BATCHES, start=st.integers(0, 200))
def test_every_log_gives_the_columns_of_its_records(
    tmp_path_factory: pytest.TempPathFactory, batches: list[list[tuple[Any, Any]]], start: int
) -> None:
    """From any offset (inside a batch too), over small and large batches: the embedded log
    (C, and its own Python path: Log's default), and the memory log."""
    path: Path = tmp_path_factory.mktemp("log")
    with EmbeddedLog(str(path)) as embedded, MemoryLog() as memory:
        for log in (embedded, memory):
            log.create_topic("t", 1)
            for batch in batches:
                log.append("t", 0, [Record(k, v) for k, v in batch])
        offset = min(start, embedded.end_offset("t", 0))
        wanted = _expected(embedded, offset)
        assert embedded.latest_columns("t", 0, offset, apart=APART) == wanted
        assert Log.latest_columns(embedded, "t", 0, offset, apart=APART) == wanted
        assert memory.latest_columns("t", 0, offset, apart=APART) == wanted


def test_a_columns_read_that_stops_inside_a_batch_goes_on_from_its_rows(tmp_path: Path) -> None:
    """The partition's columns shape, read a few records at a time (a read that stops inside
    a batch keeps its rows decoded for the next): the same columns as one read."""
    with EmbeddedLog(str(tmp_path / "log")) as log:
        log.create_topic("t", 1)
        log.append("t", 0, [Record(b"%d" % (i % 13), b"v%d" % i) for i in range(100)])
        log.append("t", 0, [Record(b"%d" % i, None) for i in range(0, 13, 3)])
        part = log._partition("t", 0)
        acc = embedded_columns.new_latest_columns()
        offset = 0
        while True:
            _, after = part.read(offset, 7, 1 << 20, "columns", acc)
            if after == offset:
                break
            offset = after
        assert offset == 105
        assert embedded_columns.finished(acc, APART) == _expected(log, 0)


def test_a_batch_larger_than_a_read_is_mapped_and_a_short_segment_is_corrupt(
    tmp_path: Path,
) -> None:
    """A batch past the read's first chunk (a flush of a whole map) is taken from a mapping of
    the segment: the same columns, and still a CorruptLogError (not a crash on a page past the
    file's end) when the segment is shorter than its published batches."""
    with EmbeddedLog(str(tmp_path / "log")) as log:
        log.create_topic("t", 1)
        log.append("t", 0, [Record(b"small", b"1")])
        log.append("t", 0, [Record(b"k%d" % i, b"v" * 300) for i in range(3_000)])  # ~1 MB
        log.append("t", 0, [Record(b"k7", None), Record(b"small", b"2")])
        wanted = _expected(log, 0)
        assert wanted.length == 3_000
        assert log.latest_columns("t", 0, 0, apart=APART) == wanted
        segment = next((tmp_path / "log").rglob("*.log"))
        with open(segment, "r+b") as f:
            f.truncate(200_000)  # inside the large batch
        with pytest.raises(CorruptLogError, match="shorter than published"):
            log.latest_columns("t", 0, 0, apart=APART)


# -- send_columns -------------------------------------------------------------------------


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    batches=st.lists(
        st.lists(st.tuples(st.binary(max_size=20), st.binary(max_size=300)), max_size=30),
        max_size=4,
    )
)
def test_send_columns_appends_what_send_of_the_records_appends_on_every_log(
    tmp_path_factory: pytest.TempPathFactory, batches: list[list[tuple[bytes, bytes]]]
) -> None:
    """The embedded log frames the columns itself (C), the memory log takes Log's default
    (records, then send): both store the records a send of the same rows stores, repeated
    keys and empty ones too, each batch at once; no rows append nothing."""
    path: Path = tmp_path_factory.mktemp("log")
    with EmbeddedLog(str(path)) as embedded, MemoryLog() as memory:
        for log in (embedded, memory):
            log.create_topic("by-columns", 1)
            log.create_topic("by-records", 1)
            for batch in batches:
                columns = _columns_of_rows(batch)
                log.send_columns("by-columns", 0, columns)
                if batch:
                    log.send("by-records", 0, [Record(k, v) for k, v in batch])
            got = [(r.key, r.value, r.offset) for r in _all(log, "by-columns")]
            assert got == [(r.key, r.value, r.offset) for r in _all(log, "by-records")]
            assert [r[:2] for r in got] == [row for batch in batches for row in batch]


def _columns_of_rows(rows: list[tuple[bytes, bytes]]) -> Columns:
    """Columns of ``rows`` as they are (repeated keys kept), with 64-bit offsets."""
    length, wide, key_offsets, key_data, value_offsets, value_data = _columns_args(rows, True)
    return Columns(length, wide, key_offsets, key_data, value_offsets, value_data, {})


def _all(log: Log, topic: str) -> list[Record]:
    return log.read(topic, 0, 0, max_records=1 << 30, max_bytes=1 << 30)


def test_send_columns_refuses_a_row_too_large_or_rows_set_apart_and_appends_nothing(
    tmp_path: Path,
) -> None:
    with EmbeddedLog(str(tmp_path)) as embedded, MemoryLog() as memory:
        for log in (embedded, memory):
            log.create_topic("t", 1, {"max.message.bytes": 1000})
            big = _columns_of_rows([(b"a", b"1"), (b"b", b"x" * 2000)])
            with pytest.raises(RecordTooLargeError):
                log.send_columns("t", 0, big)
            with pytest.raises(ValueError, match="none apart"):
                log.send_columns(
                    "t", 0, _columns_of_rows([(b"a", b"1")])._replace(apart={b"c": b"3"})
                )
            assert log.end_offset("t", 0) == 0
