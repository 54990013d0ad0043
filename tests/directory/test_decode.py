"""The pure part: which change each record stands for (no log, no threads)."""

from __future__ import annotations

from typing import Any

from kafkakv.codecs import codec_for
from kafkakv.directory import DirectoryRecord, RecordDecoder
from kafkakv.log import Record
from kafkakv.map import FLUSH_POINT_KEY
from tests.records import offset_of


def records(*pairs: tuple[bytes | None, bytes | None]) -> list[Record]:
    return [Record(k, v, (("h", b"x"),), 1000 + i, 3, 10 + i) for i, (k, v) in enumerate(pairs)]


def test_plain_records_decode_and_tombstones_delete() -> None:
    decoder = RecordDecoder(codec_for("str"), codec_for("json"))
    changes, errors = decoder.decode(records((b"a", b"[1]"), (b"b", None), (b"c", b'"x"')))
    assert changes == [("a", [1]), ("b", None), ("c", "x")] and errors == []


def test_flush_points_are_skipped_under_every_key_codec() -> None:
    for codec in ("str", "bytes", "int", "json"):
        decoder = RecordDecoder(codec_for(codec), codec_for("msgpack"))
        changes, errors = decoder.decode(records((FLUSH_POINT_KEY, b"\x91\x05")))
        assert (changes, errors) == ([], []), codec


def test_entries_decode_as_their_records_do_or_not_at_all() -> None:
    decoder = RecordDecoder(codec_for("str"), codec_for("json"))
    good = records((b"a", b"[1]"), (FLUSH_POINT_KEY, b"\x91\x05"), (b"b", None), (b"c", b"2"))
    entries = [(r.key, r.value, offset_of(r)) for r in good]
    assert (
        decoder.decode_entries(entries)
        == decoder.decode(good)[0]
        == [
            ("a", [1]),
            ("b", None),
            ("c", 2),
        ]
    )
    for bad in [(None, b"1"), (b"k", b"{"), (b"\xff", b"1")]:  # keyless, not JSON, not UTF-8
        assert decoder.decode_entries([*entries, (*bad, 99)]) is None, bad
    assert decoder.decode_entries([]) == []


def test_failures_name_the_record_and_keep_the_rest() -> None:
    decoder = RecordDecoder(codec_for("int"), codec_for("json"))
    changes, errors = decoder.decode(
        records((bytes(8), b"1"), (b"short", b"2"), (None, b"3"), (bytes(8), b"{"))
    )
    assert changes == [(-(2**63), 1)]
    assert [(e.partition, e.offset, e.key) for e in errors] == [
        (3, 11, b"short"),
        (3, 12, None),
        (3, 13, bytes(8)),
    ]
    assert errors[0].error.startswith("DecodeError") and "8 bytes" in errors[0].error
    assert "without a key" in errors[1].error
    assert "Traceback" in errors[2].traceback
    assert str(errors[1]).startswith("partition 3 offset 12 key None")


def test_transform_sees_the_whole_record_and_decides() -> None:
    seen: list[DirectoryRecord] = []

    def transform(record: DirectoryRecord) -> Any:
        seen.append(record)
        kind = record.value["kind"]
        if kind == "rekey":
            return record.value["id"], record.value
        if kind == "drop":
            return None
        if kind == "delete-other":
            return "other", None
        if kind == "keyless":
            return None, "v"
        return "not a pair"

    decoder = RecordDecoder(codec_for("str"), codec_for("json"), transform)
    changes, errors = decoder.decode(
        records(
            (b"k1", b'{"kind": "rekey", "id": 7}'),
            (b"k2", b'{"kind": "drop"}'),
            (b"k3", b'{"kind": "delete-other"}'),
            (b"k4", None),  # a tombstone: no transform
            (None, b'{"kind": "drop"}'),  # keyless and dropped: nothing to delete
            (b"k6", b'{"kind": "keyless"}'),
            (b"k7", b'{"kind": "odd"}'),
            (b"k8", b"null"),  # decodes to None: a delete, no transform either
        )
    )
    assert changes == [
        (7, {"kind": "rekey", "id": 7}),
        ("k2", None),
        ("other", None),
        ("k4", None),
        ("k8", None),
    ]
    assert [e.offset for e in errors] == [15, 16]
    assert "key None" in errors[0].error and "not a pair" in errors[1].error
    assert seen[0] == DirectoryRecord("k1", {"kind": "rekey", "id": 7}, 3, 10, (("h", b"x"),), 1000)
    assert len(seen) == 6


def test_encoding_for_a_byte_table_is_part_of_the_decision() -> None:
    keys, values = codec_for("str"), codec_for("json")

    def encode(k: Any, v: Any) -> tuple[bytes, bytes | None]:
        return keys.encode(k), None if v is None else values.encode(v)

    decoder = RecordDecoder(
        keys, values, lambda r: (r.key, {1j} if r.key == "b" else r.value), encode
    )
    changes, errors = decoder.decode(
        records((b"a", b'{"z": 1, "y": 2}'), (b"b", b"1"), (b"c", None))
    )
    assert changes == [("a", {"z": 1, "y": 2}, b"a", b'{"y":2,"z":1}'), ("c", None, b"c", None)]
    assert [e.offset for e in errors] == [11] and "EncodeError" in errors[0].error
