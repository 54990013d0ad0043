"""Copying and pickling a map or a database.

``m.copy()`` gives a plain dict snapshot. ``copy.copy(m)`` and ``copy.deepcopy(m)`` raise a
TypeError that says so (a copy would be a second handle on the replica, whose close would
close this one); pickling a map or a database raises a TypeError that says to open the map in
the other process.

Runs on every log backend and every store (see conftest.py).
"""

from __future__ import annotations

import copy
import pickle
from collections.abc import Callable
from typing import Any

import pytest

import kafkakv
from kafkakv.errors import ClosedError
from tests.map.conftest import OpenMap, log_options


# -- copies ----------------------------------------------------------------------------------
def test_copy_is_a_dict_snapshot(open_map: OpenMap) -> None:
    m = open_map()
    m.update({"a": 1, "b": [1, 2]})
    snapshot = m.copy()
    assert type(snapshot) is dict and snapshot == {"a": 1, "b": [1, 2]}
    m["a"] = 5
    del m["b"]
    assert snapshot == {"a": 1, "b": [1, 2]}  # later updates leave it as it was
    snapshot["c"] = 3
    m.sync()
    assert "c" not in m and m.copy() == {"a": 5}


def test_copy_copy_and_deepcopy_raise_a_type_error_saying_what_to_do(open_map: OpenMap) -> None:
    m = open_map()
    m["a"] = 1
    cases: list[tuple[Callable[[Any], object], str, object]] = [
        (copy.copy, "copy.copy", m),
        (copy.deepcopy, "copy.deepcopy", m),
        (copy.deepcopy, "copy.deepcopy", [m]),  # inside what is deep-copied
    ]
    for make, how, thing in cases:
        with pytest.raises(TypeError, match=r"Use m\.copy\(\) for a dict snapshot") as raised:
            make(thing)
        assert f"{how}() cannot copy a {type(m).__name__}" in str(raised.value)
        assert repr(m.name) in str(raised.value)
    m["b"] = 2  # the original is untouched and open
    assert m.copy() == {"a": 1, "b": 2}


def test_a_sorted_map_copies_in_key_order(target: str, map_name: str) -> None:
    with kafkakv.connect(target, **log_options(target)) as db:
        m = db.sorted_map(map_name, key_codec="int", value_codec="str")
        m.update({3: "c", 1: "a", 2: "b", -5: "z"})
        assert list(m.copy().items()) == [(-5, "z"), (1, "a"), (2, "b"), (3, "c")]


def test_a_linearizable_copy_has_what_other_replicas_wrote(open_map: OpenMap) -> None:
    reader = open_map(consistency="linearizable")
    writer = open_map()
    expected = {f"k{i}": i for i in range(2000)}
    writer.put_all(expected)
    assert reader.copy() == expected


def test_copying_a_closed_map_raises(open_map: OpenMap) -> None:
    m = open_map()
    m["a"] = 1
    m.close()
    with pytest.raises(ClosedError):
        m.copy()


# -- pickling --------------------------------------------------------------------------------
def test_pickling_a_map_raises_a_type_error_saying_what_to_do(open_map: OpenMap) -> None:
    m = open_map()
    m["a"] = 1
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        for thing in (m, [m], {"inside": m}):
            with pytest.raises(TypeError, match="Open the map in the other process") as raised:
                pickle.dumps(thing, protocol=protocol)
            assert type(m).__name__ in str(raised.value) and repr(m.name) in str(raised.value)
    m["b"] = 2  # nothing was left locked or closed
    assert m.copy() == {"a": 1, "b": 2}
    assert pickle.loads(pickle.dumps(m.copy())) == {"a": 1, "b": 2}  # as the message says


def test_pickling_or_copying_a_database_raises_a_type_error(target: str, map_name: str) -> None:
    with kafkakv.connect(target, **log_options(target)) as db:
        for protocol in (0, 2, pickle.HIGHEST_PROTOCOL):
            with pytest.raises(TypeError, match=r"cannot be pickled.*kafkakv\.connect\(\)"):
                pickle.dumps(db, protocol=protocol)
        for make in (copy.copy, copy.deepcopy):
            with pytest.raises(TypeError, match="cannot be copied"):
                make(db)
        m = db.map(map_name)  # the database is still open
        m["a"] = 1
        assert m["a"] == 1
