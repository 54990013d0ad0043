"""Encoded keys and values to Arrow columns and back, without Spark and without I/O.

The data source's column types follow the codec: ``str`` and ``json`` are Spark strings (a
``json`` column holds the JSON text, as ``to_json`` writes it), ``int`` is a ``bigint``,
``bytes`` and ``msgpack`` are ``binary``. Reading copies the stored bytes into Arrow in one
pass (:func:`binary_column`), then casts a text column, which checks UTF-8 in one pass over
its data; only ``int`` decodes one value at a time. Writing goes the other way and checks every value its
codec must accept: JSON text must parse, so a bad row fails the task with
:class:`~kafkakv.errors.EncodeError` before its batch is appended, unless the caller knows the
text is JSON (``check=False``: Spark's ``to_json`` wrote it).

>>> import pyarrow as pa
>>> encode_column(pa.array(["a", None]), "str", "key")
Traceback (most recent call last):
...
kafkakv.errors.EncodeError: key: row 1 is null; a key cannot be null
>>> decode_column([b'{"a":1}'], "json", "value").to_pylist()
['{"a":1}']
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, cast

import orjson
import pyarrow as pa

from kafkakv.codecs import codec_for
from kafkakv.errors import DecodeError, EncodeError
from kafkakv.log.columns import Columns
from kafkakv.log.embedded.columns import packed

__all__ = [
    "Buffers",
    "binary_buffers",
    "binary_column",
    "columns_arrays",
    "decode_column",
    "encode_column",
    "json_columns",
    "spark_type",
]

_SMALL = 2**31 - 1
"""The most bytes an Arrow ``binary`` column (32-bit offsets) holds; beyond, ``large_binary``."""

_SPARK_TYPES = {"str": "string", "json": "string", "int": "bigint", "bytes": "binary"}


def spark_type(codec: str) -> str:
    """The Spark SQL type of a key or value column for ``codec``."""
    return _SPARK_TYPES.get(codec, "binary")


def decode_column(encoded: Sequence[bytes] | pa.Array[Any], codec: str, what: str) -> pa.Array[Any]:
    """An Arrow column of ``encoded`` values (bytes, or an Arrow binary column of them: see
    :func:`columns_arrays`) as :func:`spark_type` says.

    Raises :class:`~kafkakv.errors.DecodeError` for text that is not UTF-8 or an ``int`` that
    is not 8 bytes.

    >>> decode_column(pa.array([b"\\xff"]), "str", "key")
    Traceback (most recent call last):
    ...
    kafkakv.errors.DecodeError: key: stored bytes are not UTF-8 text (...)
    """
    if codec == "int":
        decode = codec_for("int").decode
        values = (
            cast("list[bytes]", encoded.to_pylist()) if isinstance(encoded, pa.Array) else encoded
        )
        return pa.array([decode(b) for b in values], pa.int64())
    if codec in ("str", "json"):
        try:
            column = encoded if isinstance(encoded, pa.Array) else binary_column(encoded)
            # the cast checks UTF-8 in one pass over the data, copying nothing
            return column.cast(pa.large_string() if _wide(column) else pa.string())
        except pa.ArrowInvalid as exc:
            raise DecodeError(f"{what}: stored bytes are not UTF-8 text ({exc})") from exc
    return encoded if isinstance(encoded, pa.Array) else binary_column(encoded)


def columns_arrays(columns: Columns) -> tuple[pa.Array[Any], pa.Array[Any]]:
    """The keys and values of ``columns`` as two Arrow binary columns over its buffers (no
    copy): ``binary``, or ``large_binary`` for 64-bit offsets.

    >>> from kafkakv.log.columns import columns_of
    >>> keys, values = columns_arrays(columns_of({b"a": b"1", b"b": b"22"}, ()))
    >>> keys.to_pylist(), values.type
    ([b'a', b'b'], DataType(binary))
    """
    kind = pa.large_binary() if columns.wide else pa.binary()
    n = columns.length
    keys = pa.Array.from_buffers(
        kind, n, [None, pa.py_buffer(columns.key_offsets), pa.py_buffer(columns.key_data)]
    )
    values = pa.Array.from_buffers(
        kind, n, [None, pa.py_buffer(columns.value_offsets), pa.py_buffer(columns.value_data)]
    )
    return keys, values


def _wide(column: pa.Array[Any]) -> bool:
    return bool(column.type == pa.large_binary())


def binary_column(values: Sequence[bytes | None]) -> pa.Array[Any]:
    """``values`` as an Arrow ``binary`` column (``large_binary`` past 2 GiB), null where None:
    their sizes summed, then their bytes copied into buffers of that size from Arrow's memory
    pool (:func:`~kafkakv.log.embedded.columns.packed`), which a worker reuses from task to
    task. Arrow's own converter (``pa.array``) grows its buffers as it goes: 4 to 5 times as
    long on a stream task's values. A text column is this, cast (:func:`decode_column`).
    Raises TypeError for a value that is neither bytes nor None.

    >>> binary_column([b"ab", None, b"c"]).to_pylist()
    [b'ab', None, b'c']
    """
    rows = values if type(values) is list else list(values)
    n, wide, offsets, data, valid, nulls = packed(rows, pa.allocate_buffer, _SMALL)
    kind = pa.large_binary() if wide else pa.binary()
    return pa.Array.from_buffers(kind, n, [valid, offsets, data], null_count=nulls)


def encode_column(
    column: pa.Array[Any] | pa.ChunkedArray[Any], codec: str, what: str, *, check: bool = True
) -> list[Any]:
    """The encoded bytes of each value of ``column`` (``None`` where it is null).

    Keys (``what == "key"``) may not be null; a JSON key is re-encoded so that equal keys give
    equal bytes. Raises :class:`~kafkakv.errors.EncodeError` naming the row for a null key, a
    value of the wrong type or JSON that does not parse. ``check=False`` skips the parse of
    JSON values (not keys): for text known to be JSON, such as ``to_json``'s.
    """
    is_key = what == "key"
    if is_key and column.null_count:
        row = column.is_null().to_pylist().index(True)
        raise EncodeError(f"{what}: row {row} is null; a key cannot be null")
    if codec in ("str", "bytes", "msgpack"):
        if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
            if codec != "str":
                raise EncodeError(f"{what}: a {codec} column must be binary, not string")
            column = column.cast(_binary_of(column.type))
        elif not (pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type)):
            raise EncodeError(
                f"{what}: a {codec} column must be string or binary, not {column.type}"
            )
        values: list[Any] = column.to_pylist()
        if codec == "msgpack":
            _check_each(values, codec_for("msgpack").decode, what)
        return values
    if codec == "int":
        if not pa.types.is_integer(column.type):
            raise EncodeError(f"{what}: an int column must hold integers, not {column.type}")
        encode = codec_for("int").encode
        return [None if v is None else encode(v) for v in column.to_pylist()]
    # json: the column holds JSON text (string) or its UTF-8 bytes (binary)
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        column = column.cast(_binary_of(column.type))
    elif not (pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type)):
        raise EncodeError(f"{what}: a json column holds JSON text, not {column.type}")
    texts: list[Any] = column.to_pylist()
    if is_key:
        dumps = codec_for("json").encode
        return [dumps(v) for v in _check_each(texts, orjson.loads, what)]
    if check:
        _check_json(texts, what)
    return texts


class Buffers(NamedTuple):
    """A binary column's bytes as they lie: ``length + 1`` 64-bit offsets (native order, not
    necessarily from 0) into ``data``; ``valid``, one byte per row (0: null), or None when no
    row is null."""

    length: int
    offsets: Any
    data: Any
    valid: Any


def binary_buffers(
    column: pa.Array[Any], codec: str, what: str, *, check: bool = True
) -> Buffers | None:
    """The buffers of ``column`` where its codec takes each value's bytes as they are: ``str``
    over text, ``bytes`` over binary, and ``json`` over either for values the caller knows
    are JSON (``check=False``). None for any other codec or type (and for JSON keys, which
    are re-encoded): :func:`encode_column` handles those. For writers that hand the rows on
    without a Python object per row.

    >>> b = binary_buffers(pa.array(["ab", None, "c"]), "str", "value")
    >>> b.length, bytes(b.data), bytes(b.valid)
    (3, b'abc', b'\\x01\\x00\\x01')
    """
    text = pa.types.is_string(column.type) or pa.types.is_large_string(column.type)
    binary = pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type)
    if not (
        (codec == "str" and text)
        or (codec == "bytes" and binary)
        or (codec == "json" and what != "key" and not check and (text or binary))
    ):
        return None
    if not pa.types.is_large_binary(column.type):
        column = column.cast(pa.large_binary())  # the data as it is; 64-bit offsets
    _validity, offsets, data = column.buffers()
    assert offsets is not None  # a binary array always has them
    first, n = column.offset, len(column)
    window = memoryview(offsets).cast("B")[8 * first : 8 * (first + n + 1)]
    valid = None
    if column.null_count:
        valid = column.is_valid().to_numpy(zero_copy_only=False).view("uint8")
    return Buffers(n, window, b"" if data is None else data, valid)


def _check_json(texts: list[bytes | None], what: str) -> None:
    """Raise EncodeError naming the first row of ``texts`` that is not one JSON value, as
    the map's JSON codec reads them: one parse of the whole batch, at C speed (the codec's
    :meth:`~kafkakv.codecs.Codec.undecodable`)."""
    rows = [i for i, t in enumerate(texts) if t is not None] if None in texts else None
    present = cast("list[bytes]", texts if rows is None else [texts[i] for i in rows])
    bad = codec_for("json").undecodable(present)
    if bad:
        row = bad[0] if rows is None else rows[bad[0]]
        try:
            codec_for("json").check(present[bad[0]])
        except DecodeError as exc:
            raise EncodeError(f"{what}: row {row} does not decode: {exc}") from exc
        raise EncodeError(f"{what}: row {row} does not decode as one JSON value")


def _binary_of(text: pa.DataType) -> pa.DataType:
    """The binary type with ``text``'s offsets: a cast between them copies no data."""
    return pa.large_binary() if pa.types.is_large_string(text) else pa.binary()


def _check_each(values: list[Any], decode: Any, what: str) -> list[Any]:
    try:  # all at once; only when one fails is it found, to name its row
        return list(map(decode, values)) if None not in values else _each(values, decode, what)
    except Exception:
        return _each(values, decode, what)


def _each(values: list[Any], decode: Any, what: str) -> list[Any]:
    out: list[Any] = []
    for row, value in enumerate(values):
        if value is None:
            out.append(None)
            continue
        try:
            out.append(decode(value))
        except Exception as exc:
            raise EncodeError(f"{what}: row {row} does not decode: {exc}") from exc
    return out


def json_columns(
    encoded: Sequence[bytes], fields: Sequence[tuple[str, pa.DataType]], what: str
) -> list[pa.Array[Any]]:
    """One Arrow column per ``(name, type)`` in ``fields``, holding that member of each JSON
    object in ``encoded`` (null where it is missing or the value is not an object).

    Raises :class:`~kafkakv.errors.DecodeError` naming the column when a member does not fit
    its type, or a value is not JSON.
    """
    objects = []
    for value in encoded:
        try:
            obj = orjson.loads(value)
        except orjson.JSONDecodeError as exc:
            raise DecodeError(f"{what}: a value is not JSON: {exc}") from exc
        objects.append(obj if isinstance(obj, dict) else None)
    columns = []
    for name, arrow_type in fields:
        members = [None if o is None else o.get(name) for o in objects]
        try:
            columns.append(pa.array(members, arrow_type))
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise DecodeError(
                f"{what}: JSON member {name!r} does not fit {arrow_type}: {exc}"
            ) from exc
    return columns
