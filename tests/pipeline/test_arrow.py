"""Keys and values between encoded bytes and Arrow columns (no Spark, no I/O)."""

from __future__ import annotations

from array import array

import pyarrow as pa
import pytest

from kafkakv.codecs import codec_for
from kafkakv.errors import DecodeError, EncodeError
from kafkakv.log.columns import Columns, columns_of
from kafkakv.pipeline import arrow
from kafkakv.pipeline.arrow import (
    binary_column,
    columns_arrays,
    decode_column,
    encode_column,
    json_columns,
    spark_type,
)


@pytest.mark.parametrize(
    ("codec", "values"),
    [
        ("str", ["a", "é", ""]),
        ("int", [0, -1, 2**62]),
        ("bytes", [b"\x00\xff", b""]),
        ("json", [{"a": 1}, [1, 2], "x"]),
        ("msgpack", [{"a": [1, 2]}, 3]),
    ],
)
def test_read_then_write_gives_back_the_same_bytes(codec: str, values: list[object]) -> None:
    c = codec_for(codec)
    encoded = [c.encode(v) for v in values]
    column = decode_column(encoded, codec, "value")
    assert (
        str(column.type)
        == {"string": "string", "bigint": "int64", "binary": "binary"}[spark_type(codec)]
    )
    assert encode_column(column, codec, "value") == encoded


def test_str_and_json_columns_are_text_and_int_is_numeric() -> None:
    assert decode_column([b'{"a":1}'], "json", "v").to_pylist() == ['{"a":1}']
    assert decode_column([codec_for("int").encode(-5)], "int", "k").to_pylist() == [-5]


def test_text_that_is_not_utf8_is_a_decode_error() -> None:
    with pytest.raises(DecodeError, match="not UTF-8"):
        decode_column([b"\xff\xfe"], "str", "topic 't' partition 0: key")


def test_a_null_key_is_refused_with_its_row() -> None:
    with pytest.raises(EncodeError, match="row 2 is null"):
        encode_column(pa.array(["a", "b", None]), "str", "key")


def test_a_null_value_is_a_delete() -> None:
    assert encode_column(pa.array(["1", None]), "json", "value") == [b"1", None]


def test_invalid_json_is_refused_before_anything_is_written() -> None:
    with pytest.raises(EncodeError, match="row 1 does not decode"):
        encode_column(pa.array(['{"a": 1}', "{not json"]), "json", "value")


def test_json_keys_are_canonical_so_equal_keys_give_equal_bytes() -> None:
    out = encode_column(pa.array(['{"b": 1, "a": 2}', '{"a":2,"b":1}']), "json", "key")
    assert out[0] == out[1] == codec_for("json").encode({"a": 2, "b": 1})


def test_a_column_of_the_wrong_type_is_refused() -> None:
    with pytest.raises(EncodeError, match="int column must hold integers"):
        encode_column(pa.array(["1"]), "int", "key")
    with pytest.raises(EncodeError, match="must be binary"):
        encode_column(pa.array(["x"]), "bytes", "value")


def test_json_members_become_typed_columns() -> None:
    values = [b'{"id": 1, "name": "a"}', b'{"id": 2}', b"[1]"]
    ids, names = json_columns(values, [("id", pa.int64()), ("name", pa.string())], "v")
    assert ids.to_pylist() == [1, 2, None]
    assert names.to_pylist() == ["a", None, None]


def test_a_json_member_of_the_wrong_type_names_the_column() -> None:
    with pytest.raises(DecodeError, match="member 'id'"):
        json_columns([b'{"id": "x"}'], [("id", pa.int64())], "v")


def test_a_binary_column_holds_the_values_and_nulls_and_text_checks_utf8() -> None:
    values = [b"", b"ab", "é".encode(), b"\x00" * 300]
    column = binary_column(values)
    assert column.type == pa.binary() and column.to_pylist() == values
    assert decode_column(values, "str", "v").to_pylist() == ["", "ab", "é", "\x00" * 300]
    with_nulls = [None if i % 8 in (0, 3) else bytes([i]) * (i % 5) for i in range(21)]
    column = binary_column(with_nulls)
    assert column.null_count == 6 and column.to_pylist() == with_nulls
    assert len(binary_column([])) == 0
    with pytest.raises(DecodeError, match="v: stored bytes are not UTF-8"):
        decode_column([b"ok", b"k\xc3"], "json", "v")


@pytest.mark.parametrize("limit", [arrow._SMALL, 3])  # 3 bytes: the large form
def test_a_column_past_2_gib_takes_64_bit_offsets(
    limit: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(arrow, "_SMALL", limit)
    values = [b"ab", None, b"", "é".encode()]
    column, text = binary_column(values), decode_column([b"ab", "é".encode()], "str", "v")
    assert column.type == (pa.binary() if limit > 3 else pa.large_binary())
    assert text.type == (pa.string() if limit > 3 else pa.large_string())
    assert column.to_pylist() == values and text.to_pylist() == ["ab", "é"]


def test_unchecked_json_values_are_taken_as_they_are_but_keys_still_parse() -> None:
    texts = pa.array(['{"a":1}', "not json", None])
    assert encode_column(texts, "json", "value", check=False) == [b'{"a":1}', b"not json", None]
    with pytest.raises(EncodeError, match="row 1 does not decode"):
        encode_column(pa.array(['"k"', "not json"]), "json", "key", check=False)


@pytest.mark.parametrize("bad", ["{not json", "1,2", "[1", ""])
def test_a_value_that_is_not_one_json_value_is_named_by_its_row(bad: str) -> None:
    """Values are checked in one parse of the whole batch; the row named counts the nulls
    before it (a value that hides a comma would split in two)."""
    column = pa.array(['{"a": [1, 2]}', None, "3", bad, '"x"'])
    with pytest.raises(EncodeError, match="value: row 3 does not decode"):
        encode_column(column, "json", "value")


def test_columns_become_arrow_columns_over_their_buffers_and_decode_as_bytes_would() -> None:
    """32-bit offsets (``binary``) and 64-bit ones (``large_binary``, a map past 2 GiB, told
    here with few bytes): the same text, ints and errors as the same values given as bytes."""
    enc = codec_for("int").encode
    narrow = columns_of({b"a": enc(5), b"\xc3\xa9": enc(-7)}, ())
    wide = Columns(
        2,
        True,
        array("q", [0, 1, 3]).tobytes(),
        b"a\xc3\xa9",
        array("q", [0, 8, 16]).tobytes(),
        enc(5) + enc(-7),
        {},
    )
    for columns, kind, text in (
        (narrow, pa.binary(), pa.string()),
        (wide, pa.large_binary(), pa.large_string()),
    ):
        keys, values = columns_arrays(columns)
        assert keys.type == values.type == kind
        assert keys.to_pylist() == [b"a", b"\xc3\xa9"]
        as_text = decode_column(keys, "str", "key")
        assert as_text.type == text and as_text.to_pylist() == ["a", "é"]
        assert decode_column(keys, "json", "key").to_pylist() == ["a", "é"]
        assert decode_column(values, "int", "value").to_pylist() == [5, -7]
        assert decode_column(keys, "bytes", "key") is keys
        with pytest.raises(DecodeError, match="value: stored bytes are not UTF-8"):
            decode_column(values, "str", "value")  # enc(-7) is not UTF-8
