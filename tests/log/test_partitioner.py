"""partition_for must agree with the Java client's default partitioner; the C functions
(kafkakv.log._murmur2) and their Python twins agree on every key, and this installation uses
the C ones."""

from __future__ import annotations

import contextlib
import importlib
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafkakv._native import PURE_PYTHON
from kafkakv.log import murmur2, partition_for
from kafkakv.log import partitioner as P
from tests.leaks import growth

PURE = PURE_PYTHON  # the twins for this whole process (kafkakv._native)

# Expected values from Apache Kafka's clients UtilsTest.testMurmur2 (signed Java ints).
KAFKA_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


@pytest.mark.parametrize("hash_of", [murmur2, P.py_murmur2], ids=["selected", "python"])
@pytest.mark.parametrize(("key", "expected"), KAFKA_VECTORS.items())
def test_murmur2_matches_kafka(hash_of: Callable[[bytes], int], key: bytes, expected: int) -> None:
    assert hash_of(key) == expected


def test_partition_masks_the_sign_bit_like_java() -> None:
    # murmur2(b"21") is negative: Java's toPositive clears the sign bit (not abs()).
    assert partition_for(b"21", 7) == (-973932308 & 0x7FFFFFFF) % 7
    assert partition_for(b"21", 7) != abs(-973932308) % 7
    for key, h in KAFKA_VECTORS.items():
        for n in (1, 2, 3, 12, 100):
            assert partition_for(key, n) == (h & 0x7FFFFFFF) % n


def test_empty_key_and_bad_input() -> None:
    assert 0 <= partition_for(b"", 5) < 5
    with pytest.raises(TypeError):
        partition_for("text", 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        partition_for(b"k", 0)


def _compiled() -> Any:
    """The C module; the test fails, saying how to build it, when it is not built."""
    try:
        return importlib.import_module("kafkakv.log._murmur2")
    except ImportError as exc:
        pytest.fail(
            "kafkakv.log._murmur2 is not built; reinstall kafkakv where a C compiler is "
            f"(pip install -e .): {exc}"
        )


def test_this_installation_places_keys_through_the_c_module() -> None:
    if PURE:
        assert not P.COMPILED and P.partition_for is P.py_partition_for
    else:
        _compiled()
        assert P.COMPILED, "the C module is built but kafkakv.log.partitioner did not take it"
        assert partition_for.__module__ == "kafkakv.log._murmur2"
        assert murmur2.__module__ == "kafkakv.log._murmur2"


def _outcome(fn: Callable[..., Any], *args: Any) -> tuple[Any, ...]:
    try:
        return ("returned", fn(*args))
    except Exception as exc:
        return ("raised", type(exc), str(exc))


_KEYS = st.binary(max_size=70) | st.sampled_from(list(KAFKA_VECTORS))
_COUNTS = st.integers(min_value=1, max_value=300) | st.sampled_from([2**31 - 1, 2**31, 2**70])


@settings(max_examples=400, deadline=None)
@given(key=_KEYS, partitions=_COUNTS, shape=st.sampled_from([bytes, bytearray, memoryview]))
def test_the_c_functions_and_their_twins_agree(key: bytes, partitions: int, shape: type) -> None:
    c = _compiled()
    data = shape(key)
    assert c.murmur2(data) == P.py_murmur2(key)
    assert c.partition_for(data, partitions) == P.py_partition_for(data, partitions)


@settings(max_examples=300, deadline=None)
@given(
    keys=st.lists(_KEYS, max_size=6),
    partitions=_COUNTS,
    prefix=st.sampled_from([b"", b"\x03abc", b"p" * 40]),
    shape=st.sampled_from([bytes, bytearray, memoryview]),
)
def test_partition_each_places_every_key_as_partition_for_does(
    keys: list[bytes], partitions: int, prefix: bytes, shape: type
) -> None:
    c = _compiled()
    expected = [P.py_partition_for(prefix + k, partitions) for k in keys]
    items = [shape(k) for k in keys]
    assert c.partition_each(items, partitions, shape(prefix)) == expected
    assert P.py_partition_each(items, partitions, shape(prefix)) == expected
    assert c.partition_each(tuple(items), partitions, prefix) == expected


_KEYS_GROW_IN_A_FINALIZER = """
import gc
from kafkakv.log._murmur2 import partition_each

keys = [b"k%d" % i for i in range(8)]

class Grows:  # in a reference cycle: only the collector frees it
    def __init__(self):
        self.me = self
    def __del__(self):
        keys.extend([b"x"] * 100_000)  # moves the list's items elsewhere

outcomes = []
gc.collect()
gc.disable()
for _ in range(5):
    Grows()
    gc.enable()
    gc.set_threshold(1)  # the result list partition_each allocates sets a collection off
    try:
        result = partition_each(keys, 7, b"p")
    except RuntimeError as exc:
        result = exc
    gc.disable()
    del keys[8:]
    outcomes.append(str(result) if isinstance(result, RuntimeError) else len(result))
print(outcomes)
"""


def test_partition_each_over_keys_a_finalizer_changes_raises() -> None:
    """A collection run while partition_each allocates its result may run finalizers that
    change the key list; the call then raises RuntimeError. Before, it read the list's old,
    freed item array (a use after free: under PYTHONMALLOC=debug, a crash)."""
    _compiled()
    env = {**os.environ, "PYTHONMALLOC": "debug", "PYTHONFAULTHANDLER": "1"}
    done = subprocess.run(
        [sys.executable, "-c", _KEYS_GROW_IN_A_FINALIZER],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "partition_each: the keys changed during the call" in done.stdout, done.stdout


@pytest.mark.parametrize(
    "args",
    [
        ([b"a", "b"], 3, b""),
        ([b"a", None], 3, b"p"),
        ([b"a"], 0, b""),
        ([], 0, b""),
        ([b"a"], 3, "p"),
        (None, 3, b""),
    ],
    ids=["str-key", "none-key", "zero", "zero-no-keys", "str-prefix", "not-a-sequence"],
)
def test_partition_each_refuses_what_its_twin_refuses(args: tuple[Any, int, Any]) -> None:
    c = _compiled()
    assert _outcome(c.partition_each, *args)[:2] == _outcome(P.py_partition_each, *args)[:2]


@pytest.mark.parametrize(
    "args",
    [("text", 3), (None, 3), (7, 3), (b"k", 0), (b"k", -1), (b"k", -(2**70))],
    ids=["str", "none", "int", "zero", "negative", "hugely-negative"],
)
def test_the_c_functions_refuse_what_their_twins_refuse(args: tuple[Any, int]) -> None:
    c = _compiled()
    assert _outcome(c.partition_for, *args) == _outcome(P.py_partition_for, *args)
    assert _outcome(c.partition_for, b"k")[:2] == ("raised", TypeError)  # one argument short


def test_the_c_functions_leak_no_memory_and_no_references() -> None:
    c = _compiled()
    key, count = b"k" * 16, 7
    keys = [key] * 10

    def work() -> None:
        for _ in range(20_000):
            c.partition_for(key, count)
            c.murmur2(key)
            with contextlib.suppress(ValueError):
                c.partition_for(key, 0)
            with contextlib.suppress(TypeError):
                c.partition_for(None, count)
            c.partition_each(keys, count, key)
            with contextlib.suppress(TypeError):
                c.partition_each([key, None], count, key)

    found = growth(work, (key, count, None))
    assert found.allocated < 16 * 1024, f"{found.allocated} bytes still allocated"
    assert found.refs_after[:2] == found.refs_before[:2]
    assert abs(found.refs_after[2] - found.refs_before[2]) < 100  # None: one per call if leaked


def test_kafkakv_pure_python_selects_the_twins() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from kafkakv.log import partitioner as P, partition_for\n"
            "assert not P.COMPILED and partition_for is P.py_partition_for\n"
            "print(partition_for(b'21', 7))",
        ],
        env=dict(os.environ, KAFKAKV_PURE_PYTHON="1"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str((-973932308 & 0x7FFFFFFF) % 7)
