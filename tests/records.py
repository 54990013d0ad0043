"""Records as tests read them back from a log."""

from __future__ import annotations

from kafkakv.log import Record

__all__ = ["offset_of"]


def offset_of(record: Record) -> int:
    """The offset of a record read from a log: every record read back has one (only records
    built for an append leave it None, which fails the test here).

    >>> offset_of(Record(b"k", b"v", offset=7))
    7
    """
    assert record.offset is not None, f"{record!r} was not read from a log"
    return record.offset
