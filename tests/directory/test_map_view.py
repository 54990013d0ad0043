"""A directory on a replicated map's data topic: a read-only view of the map's flushed state."""

from __future__ import annotations

import uuid
from typing import Any

from prometheus_client import CollectorRegistry

import kafkakv
from kafkakv.map import FLUSH_POINT_KEY
from tests.waiting import wait_for


def test_directory_on_a_map_data_topic(db: kafkakv.Database, registry: CollectorRegistry) -> None:
    name = f"m-{uuid.uuid4().hex[:10]}"
    prices = db.map(name, partitions=2, flush_period=1_000_000)
    prices.update({"tea": 3, "coffee": {"small": 2, "large": 4}, "cocoa": 5})
    del prices["cocoa"]
    prices.flush()
    ends = {p: db.log.end_offset(name, p) for p in (0, 1)}
    flush_points = sum(
        1
        for p in (0, 1)
        for r in db.log.read(name, p, 0, max_records=100)
        if r.key == FLUSH_POINT_KEY
    )
    assert flush_points >= 1  # the data topic holds the marker the view must skip
    view = db.directory(name, metrics=registry)
    assert dict(view.items()) == {"tea": 3, "coffee": {"small": 2, "large": 4}}
    assert view.error_count == 0 and view.positions() == ends
    prices["tea"] = 4
    prices.flush()
    wait_for(lambda: view.get("tea") == 4)
    assert len(view) == 2 and view.error_count == 0


def test_int_keys_of_a_map(db: kafkakv.Database, registry: CollectorRegistry) -> None:
    name = f"m-{uuid.uuid4().hex[:10]}"
    m: Any = db.map(name, key_codec="int", value_codec="msgpack", flush_period=1_000_000)
    m.update({1: b"one", -2: [1, 2]})
    m.flush()
    view = db.directory(name, key_codec="int", value_codec="msgpack", metrics=registry)
    assert dict(view.items()) == {1: b"one", -2: [1, 2]}
    assert view.error_count == 0  # the flush point does not decode as an int: skipped
