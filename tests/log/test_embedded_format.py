"""The embedded log's batch encoding: the fast path for plain batches agrees with the checking
loop on every batch, stored rows and refusals alike."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafkakv.errors import CorruptLogError
from kafkakv.log.base import Record, records_of
from kafkakv.log.embedded import format as fmt
from kafkakv.log.embedded.frame import pack_rows, plain_body

NOW = 1_700_000_000_000
LIMIT = 200  # max.message.bytes of these tests: small, so oversized records are common


def sized(most: int) -> st.SearchStrategy[bytes]:
    """Bytes of any length up to ``most``, long ones as likely as short ones."""
    return st.binary(max_size=8) | st.integers(0, most).map(lambda n: bytes(range(n % 256)) * 2)


def record(*fields: st.SearchStrategy[Any]) -> st.SearchStrategy[Record]:
    """Records of these first fields and defaults for the rest (st.builds would fill those)."""
    return st.tuples(*fields).map(lambda values: Record(*values))


SHORT = st.binary(max_size=8)
PLAIN = record(sized(60), sized(190))
ODD = st.one_of(
    record(st.none(), SHORT),  # null key
    record(SHORT, st.none()),  # tombstone
    record(st.text(max_size=4), SHORT),  # wrong key type
    record(SHORT, SHORT, st.just([("h", b"x")])),
    record(SHORT, SHORT, st.just(()), st.integers(-5, NOW)),
    st.tuples(SHORT, SHORT),  # a bare tuple, not a Record
)


def encode(records: list[Any], null_keys: bool, fast: bool = True) -> tuple[Any, ...]:
    """What encode_records gives (decoded rows, timestamps) or raises (the error's type);
    ``fast=False``: what the checking loop alone gives."""
    try:
        if fast:
            body, base_ts, max_ts = fmt.encode_records(
                records, NOW, max_message_bytes=LIMIT, null_keys=null_keys
            )
        else:
            rows, base_ts, max_ts = fmt._checked_rows(records, NOW, LIMIT, null_keys)
            body = pack_rows(rows)
    except Exception as exc:
        return ("raised", type(exc))
    batch = fmt.encode_batch(
        0,
        body,
        record_count=len(records),
        last_offset_delta=len(records) - 1,
        base_timestamp=base_ts,
        max_timestamp=max_ts,
    )
    header = fmt.parse_header(batch)
    rows = fmt.decode_rows(batch, 0, header)
    return ("stored", [r[:4] for r in fmt.records_from_rows(rows, header, 0)], max_ts)


@settings(max_examples=300, deadline=None)
@given(
    records=st.lists(st.one_of(PLAIN, PLAIN, PLAIN, ODD), min_size=1, max_size=8),
    null_keys=st.booleans(),
)
def test_the_fast_path_stores_and_refuses_exactly_what_the_checking_loop_does(
    records: list[Any], null_keys: bool
) -> None:
    assert encode(records, null_keys) == encode(records, null_keys, fast=False)


def test_a_plain_batch_takes_the_fast_path_and_reads_back() -> None:
    keys = [f"k{i}".encode() for i in range(50)]
    records = records_of(keys, [b"v" * i for i in range(50)])
    body = plain_body(records, LIMIT)
    assert body is not None
    rows = msgspec.msgpack.decode(body)
    assert [r[2:4] for r in rows] == [[r.key, r.value] for r in records]
    assert [r[0] for r in rows] == list(range(50)) and {r[1] for r in rows} == {0}
    _, stored, max_ts = encode(records, null_keys=False)
    assert stored == [(k, b"v" * i, (), NOW) for i, k in enumerate(keys)] and max_ts == NOW


def test_records_of_builds_plain_records() -> None:
    records = records_of([b"a", None], [b"1", None])
    assert records == [Record(b"a", b"1"), Record(None, None)]
    assert all(type(r) is Record for r in records) and records_of([], []) == []


@pytest.mark.parametrize(
    "rows",
    [
        [[0, 0, "a str key", b"v", None]],
        [[0, 0, b"k", b"v"]],  # a field short
        [[0, 0, b"k", b"v", [["h", "a str header value"]]]],
        {"not": "a list"},
    ],
)
def test_rows_of_the_wrong_shape_are_a_corrupt_batch(rows: Any) -> None:
    batch = fmt.encode_batch(
        0,
        pack_rows(rows),
        record_count=1,
        last_offset_delta=0,
        base_timestamp=0,
        max_timestamp=0,
    )
    header = fmt.parse_header(batch)
    assert fmt.verify_crc(batch, 0, header)  # a valid batch as far as the CRC can tell
    with pytest.raises(CorruptLogError, match="undecodable"):
        fmt.decode_rows(batch, 0, header)
