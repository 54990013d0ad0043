"""Directories on a store: on disk (LMDB), a restart reads only the records added since."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

import kafkakv
from kafkakv import DirectoryRecord
from kafkakv.errors import ConfigError
from kafkakv.store import SortedStore
from tests.directory.conftest import sample, terminal_rows
from tests.waiting import wait_for


def test_restart_reads_only_new_records(
    db: kafkakv.Database, make_topic: Any, registry: CollectorRegistry, tmp_path: Path
) -> None:
    topic = make_topic(partitions=2)
    topic.write(terminal_rows(100), partition=0)
    topic.write(terminal_rows(50, start=100), partition=1)
    path = tmp_path / "store"
    d = db.directory(topic.name, store="lmdb", store_path=path, metrics=registry)
    assert len(d) == 150 and d.records_applied == 150
    assert d["T0000120"]["acquirerId"] == "A023"
    topic.put("T0000001", None)  # followed, and kept on disk
    wait_for(lambda: "T0000001" not in d)
    d.close()

    topic.write(terminal_rows(5, start=1000), partition=1)
    topic.put("T0000002", {"acquirerId": "moved"})
    again = db.directory(topic.name, store="lmdb", store_path=path, metrics=registry)
    assert again.records_applied == 6  # the new records only
    labels = {"directory": topic.name, "topic": topic.name}
    assert sample(registry, "kafkakv_directory_records_total", **labels) == 6
    assert len(again) == 154 and "T0000001" not in again
    assert again["T0000002"] == {"acquirerId": "moved"} and again["T0001003"]["id"] == 1003
    assert again.positions() == {p: db.log.end_offset(topic.name, p) for p in (0, 1)}
    again.close()
    with pytest.raises(ConfigError, match="holds partitions"):
        db.directory(topic.name, store="lmdb", store_path=path, partitions=[0])


def test_transformed_entries_on_disk(
    db: kafkakv.Database, make_topic: Any, registry: CollectorRegistry, tmp_path: Path
) -> None:
    topic = make_topic()
    topic.write(terminal_rows(20))

    def acquirer(record: DirectoryRecord) -> tuple[Any, Any]:
        if record.value["id"] == 3:
            return record.key, {1, 2}  # a set is no JSON: this record is an error
        return record.value["id"], record.value["acquirerId"]

    d = db.directory(
        topic.name,
        value_codec="json",
        key_codec="int",
        transform=acquirer,
        store="lmdb",
        store_path=tmp_path / "s",
        metrics=registry,
    )
    # Keys decode with the int codec first: these str keys are 8 bytes, so they pass.
    assert len(d) == 19 and d[7] == "A007" and 3 not in d and "x" not in d
    assert [e.offset for e in d.errors()] == [3]
    assert "EncodeError" in d.errors()[0].error


def test_any_store_object(
    db: kafkakv.Database, make_topic: Any, registry: CollectorRegistry
) -> None:
    topic = make_topic()
    topic.write([(b"b", b"2"), (b"a", b"1"), (b"c", b"3")])
    d = db.directory(topic.name, store=SortedStore(), metrics=registry)
    assert list(d.items()) == [("a", 1), ("b", 2), ("c", 3)]  # in key order
    assert d.get("b") == 2 and len(d) == 3
    with pytest.raises(ConfigError):
        db.directory(topic.name, name="x", store=SortedStore(), store_path="/tmp/x")
