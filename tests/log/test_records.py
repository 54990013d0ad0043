"""The checks every backend runs before an append: a batch of plain records takes passes over
the whole batch, and that agrees with checking record by record, results and refusals alike."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from kafkakv.log.base import Record, records_of
from kafkakv.log.records import RECORD_OVERHEAD, check_batch, check_record, plain_batch
from tests.log.test_embedded_format import LIMIT, ODD, PLAIN, SHORT, record

TOMBSTONE = record(SHORT, st.none())


def checked_one_by_one(records: list[Any], null_keys: bool) -> Any:
    try:
        return [
            check_record(i, r, max_message_bytes=LIMIT, null_keys=null_keys)
            for i, r in enumerate(records)
        ]
    except Exception as exc:
        return (type(exc), str(exc))


def checked_as_a_batch(records: list[Any], null_keys: bool) -> Any:
    try:
        return check_batch(records, max_message_bytes=LIMIT, null_keys=null_keys)
    except Exception as exc:
        return (type(exc), str(exc))


@settings(max_examples=300, deadline=None)
@given(
    records=st.lists(st.one_of(PLAIN, PLAIN, TOMBSTONE, ODD), min_size=1, max_size=8),
    null_keys=st.booleans(),
)
def test_a_batch_is_checked_as_record_by_record(records: list[Any], null_keys: bool) -> None:
    assert checked_as_a_batch(records, null_keys) == checked_one_by_one(records, null_keys)


def test_plain_batches_and_what_is_not_one() -> None:
    keys = [b"a", b"b", b"c"]
    assert plain_batch(records_of(keys, [b"1", None, b""]), 10) == (keys, [b"1", None, b""])
    not_plain: list[list[object]] = [
        [Record(None, b"v")],  # a null key
        [Record(b"k", b"v", [("h", b"x")])],  # headers
        [Record(b"k", b"v", (), 5)],  # a timestamp
        # bytes-like (which Record's annotation leaves out), normalised by the checking loop
        [Record(bytearray(b"k"), b"v")],  # type: ignore[arg-type]
        [(b"k", b"v")],  # not a Record
        [Record(b"k" * 6, b"v" * 5)],  # 11 bytes: over the limit
    ]
    for records in not_plain:
        assert plain_batch(records, 10) is None, records
    # The limit counts key and value; the per-record overhead is the caller's.
    assert plain_batch([Record(b"k" * 5, b"v" * 5)], 10) is not None
    big = Record(b"k" * 4, b"v" * (100 - RECORD_OVERHEAD - 4))  # exactly at the limit
    assert check_batch([big], max_message_bytes=100, null_keys=False) == [
        (big.key, big.value, None, None)
    ]
