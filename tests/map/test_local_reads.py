"""The local read path (kafkakv.map.reads): the C type and its Python twin behave alike, read
by read; the C type is what this installation uses; it leaks neither memory nor references;
and KAFKAKV_PURE_PYTHON=1 selects the twin for a whole process."""

from __future__ import annotations

import contextlib
import gc
import importlib
import mmap
import os
import subprocess
import sys
import textwrap
import types
import weakref
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafkakv.codecs import BytesCodec, IntCodec, JsonCodec, StrCodec
from kafkakv.map import reads
from tests.leaks import growth

PURE = os.environ.get("KAFKAKV_PURE_PYTHON", "") not in ("", "0")


def _compiled() -> Any:
    """The C module; the test fails, saying how to build it, when it is not built."""
    try:
        return importlib.import_module("kafkakv.map._reads")
    except ImportError as exc:
        pytest.fail(
            "kafkakv.map._reads is not built; reinstall kafkakv where a C compiler is "
            f"(pip install -e .): {exc}"
        )


def test_this_installation_reads_through_the_c_type() -> None:
    if PURE:
        assert not reads.COMPILED and reads.LocalReads is reads.PyLocalReads
    else:
        _compiled()
        assert reads.COMPILED, "the C type is built but kafkakv.map.reads did not take it"
        assert reads.LocalReads.__module__ == "kafkakv.map._reads"


# The states an end watch can be in when a linearizable map reads (see reads.PyEndWatch).
_STATES = ["at end", "unnoted", "moved", "behind", "closed", "cleared"]
# A map's watches, one per partition: one in each state, none, several. Reads skip catching
# up for the ones in _AT_END only.
_WATCHES = [None, *_STATES, "none", "3 at end", "1 of 3 moved"]
_AT_END = ("at end", "3 at end")


def _watches(watch_type: type, spec: str | None) -> tuple[Any, ...] | None:
    """The end watches of a map (see _WATCHES), of watch_type."""
    if spec is None:
        return None
    states = {"none": [], "3 at end": ["at end"] * 3, "1 of 3 moved": ["at end", "moved", "at end"]}
    return tuple(_watch(watch_type, state) for state in states.get(spec, [spec]))


def _watch(watch_type: type, state: str) -> Any:
    """An end watch of watch_type in ``state``: noted at end offset 5 over a mapping of 16
    bytes, with a machine that has applied up to 5, then changed as the state says."""
    machine = types.SimpleNamespace(applied=5)
    watch = watch_type(machine)
    mapping = mmap.mmap(-1, 16)
    mapping[:6] = b"head-1"
    if state != "unnoted":
        watch.note(5, mapping, mapping[:16])
    if state == "moved":  # a publish since: the head's bytes changed
        mapping[:6] = b"head-2"
    elif state == "behind":  # noted, not applied yet
        machine.applied = 4
    elif state == "closed":
        mapping.close()
    elif state == "cleared":
        watch.clear()
    return watch


def _harness(
    base: type, gate_type: type, watch_type: type = reads.PyEndWatch
) -> Callable[..., Any]:
    """An object with base's reads whose checked paths say they were taken."""

    class Harness(base):  # type: ignore[misc]
        def _checked_getitem(self, key: Any) -> Any:
            return ("checked []", key)

        def _checked_get(self, key: Any, default: Any) -> Any:
            return ("checked get", key, default)

        def _checked_contains(self, key: Any) -> bool:
            return bool(self.contains_answer)

    def make(
        table: Any,
        gate_open: bool,
        key_bytes: Any,
        decode: Any,
        lookup: str | None = None,
        catch_up: str | None = None,
        prefix: bytes = b"",
        end_watches: str | None = None,
    ) -> Any:
        h = Harness()
        h.contains_answer = True
        h.caught_up = []  # the record keys catch_up was called with, in order
        gate = gate_type()
        gate.open = gate_open
        h._gate = gate
        h._table = None if table is None else table
        h._key_bytes = key_bytes
        h._decode = decode
        h._prefix = prefix
        source = {} if table is None else table
        h._lookup = {
            None: None,
            "get": source.get,
            "absent": lambda encoded: None,
            "raise": _refusing_lookup,
        }[lookup]
        h._catch_up = {
            None: None,
            "record": h.caught_up.append,
            "noop": lambda record_key: None,
            "raise": _refusing_catch_up,
        }[catch_up]
        h._end_watches = _watches(watch_type, end_watches)
        return h

    return make


def _refusing_lookup(encoded: bytes) -> Any:
    raise OSError("the store could not be read")


def _refusing_catch_up(record_key: bytes) -> None:
    raise TimeoutError("the barrier did not finish in time")


def _outcome(call: Callable[[], Any]) -> tuple[Any, ...]:
    try:
        return ("returned", call())
    except BaseException as exc:  # every outcome is compared, interrupts too
        return ("raised", type(exc), exc.args, exc.__suppress_context__)


class _Interrupt(KeyboardInterrupt):
    pass


def _interrupting(key: Any) -> bytes:
    raise _Interrupt("pressed Ctrl-C while encoding")


def _refusing_decode(data: Any) -> Any:
    if data[:1] == b"\xff":
        raise ValueError("cannot decode")
    return ("decoded", data)


# The key codecs' encodes as a map keeps them (fast_encode or encode), and encodes that
# misbehave: one that interrupts, one that returns its argument (an unhashable key then).
_ENCODES: list[Any] = [
    str.encode,
    StrCodec().encode,
    BytesCodec().encode,
    IntCodec().encode,
    JsonCodec().encode,
    _interrupting,
    lambda key: key,
]
_DECODES: list[Any] = [None, _refusing_decode, len]

_keys = st.one_of(
    st.text(max_size=3),  # lone surrogates included: str.encode refuses them
    st.binary(max_size=3),
    st.integers(-3, 3),
    st.tuples(st.text(max_size=2)),
    st.lists(st.integers(), max_size=2),
    st.none(),
    st.text(max_size=3).map(lambda s: type("S", (str,), {})(s)),  # a str subclass
    # ASCII keys around the C type's probe room (128): looked up through its probe or not
    st.text(st.characters(max_codepoint=127), min_size=126, max_size=130),
)


@st.composite
def _cases(draw: st.DrawFn) -> tuple[Any, ...]:
    """Keys to read, the fields of a map (a local path, a direct path, both, or neither)
    and what its checked `in` answers."""
    probes = draw(st.lists(_keys, min_size=1, max_size=8))
    table: dict[Any, Any] = {}
    for key in draw(st.lists(st.sampled_from(probes))):  # some probes are present
        for encode in (str.encode, BytesCodec().encode, IntCodec().encode):
            with contextlib.suppress(Exception):
                table[encode(key)] = draw(st.binary(max_size=3))
    kind = draw(st.sampled_from(["dict", "mapping", "none"]))
    shown: Any = {"dict": table, "mapping": types.MappingProxyType(table), "none": None}[kind]
    if draw(st.booleans()) and table:
        table[next(iter(table))] = None  # a None stored: [] returns it, get and in do not
    fields = {
        "table": shown,
        "gate_open": draw(st.booleans()),
        "key_bytes": draw(st.sampled_from(_ENCODES)),
        "decode": draw(st.sampled_from(_DECODES)),
        "lookup": draw(st.sampled_from([None, "get", "absent", "raise"])),
        "catch_up": draw(st.sampled_from([None, "record", "raise"])),
        "prefix": draw(st.sampled_from([b"", b"p\x00"])),
        "end_watches": draw(st.sampled_from(_WATCHES)),
    }
    return probes, fields, draw(st.booleans())


_READS: dict[str, Callable[[Any, Any], Any]] = {
    "m[k]": lambda m, key: m[key],
    "m.get(k)": lambda m, key: m.get(key),
    "m.get(k, d)": lambda m, key: m.get(key, "d"),
    "m.get(k, default=d)": lambda m, key: m.get(key, default="d"),
    "m.get(key=k)": lambda m, key: m.get(key=key),
    "k in m": lambda m, key: key in m,
}


@settings(max_examples=400, deadline=None)
@given(_cases())
def test_the_c_type_and_the_python_twin_give_the_same_outcome_for_every_read(
    case: tuple[Any, ...],
) -> None:
    _reads = _compiled()
    probes, fields, contains_answer = case
    c = _harness(_reads.LocalReads, _reads.ReadGate, _reads.EndWatch)(**fields)
    py = _harness(reads.PyLocalReads, reads.PyReadGate, reads.PyEndWatch)(**fields)
    c.contains_answer = py.contains_answer = contains_answer
    for key in probes:
        for label, read in _READS.items():
            expected, got = _outcome(partial(read, py, key)), _outcome(partial(read, c, key))
            assert got == expected, f"{label} with key {key!r}"
            assert c.caught_up == py.caught_up, f"catch_up calls of {label} with key {key!r}"


@pytest.mark.parametrize("state", _WATCHES)
def test_a_linearizable_read_catches_up_unless_its_end_watches_are_all_at_the_end(
    state: str | None,
) -> None:
    _reads = _compiled()
    table = {b"k": b"v"}
    for base, gate, watch_type in (
        (_reads.LocalReads, _reads.ReadGate, _reads.EndWatch),
        (reads.PyLocalReads, reads.PyReadGate, reads.PyEndWatch),
    ):
        m = _harness(base, gate, watch_type)(
            None, True, str.encode, None, lookup="get", catch_up="record", end_watches=state
        )
        m._lookup = table.get
        assert (m["k"], m.get("k"), "k" in m, m.get("x")) == (b"v", b"v", True, None)
        skipped = state in _AT_END
        assert m.caught_up == ([] if skipped else [b"k", b"k", b"k", b"x"]), (base, state)
        watches = m._end_watches or ()
        assert all(watch.at_end() for watch in watches) is (skipped or not watches)


def test_an_end_watch_notes_a_whole_mark_and_refuses_a_bad_one() -> None:
    _reads = _compiled()
    for watch_type in (_reads.EndWatch, reads.PyEndWatch):
        machine = types.SimpleNamespace(applied=10)
        watch = watch_type(machine)
        first, second = bytearray(b"head-1"), bytearray(b"head-2")
        assert not watch.at_end()  # nothing noted
        watch.note(10, first, bytes(first))
        assert watch.at_end()
        watch.note(11, second, bytes(second))  # the later mark replaces the whole first one
        assert not watch.at_end()  # applied 10 < 11, though the bytes match
        machine.applied = 11
        assert watch.at_end()
        first[0:1] = b"H"  # the old mapping no longer matters
        assert watch.at_end()
        second[0:1] = b"H"
        assert not watch.at_end()
        machine.applied = "eleven"  # not an int: not at the end, no error
        second[0:1] = b"h"
        assert not watch.at_end()
        with pytest.raises(TypeError):
            watch.note(12, second, bytearray(second))  # type: ignore[arg-type]


_NO_PREFIX_LINEARIZABLE = """
from kafkakv.map._reads import LocalReads, ReadGate

class Half(LocalReads):
    pass

m = Half()
m._gate, m._lookup, m._catch_up = ReadGate(), {}.get, lambda key: None
m._key_bytes = lambda key: bytearray(key.encode())  # not bytes; no _prefix set
try:
    m.get("a")
except TypeError as exc:
    print("TypeError", exc)
"""


def test_a_linearizable_read_without_a_prefix_raises_instead_of_crashing() -> None:
    """A map half set up (no ``_prefix``) whose key codec gives something other than bytes:
    the catch-up key is the encoded key alone. Before, it was ``NULL + encoded``: a crash.
    In a child process, so that a crash is a failure with its output."""
    _compiled()
    done = subprocess.run(
        [sys.executable, "-c", _NO_PREFIX_LINEARIZABLE],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONFAULTHANDLER": "1"},
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("TypeError"), done.stdout


def test_get_refuses_bad_arguments_as_a_python_method_would() -> None:
    _reads = _compiled()
    for base, gate in (
        (_reads.LocalReads, _reads.ReadGate),
        (reads.PyLocalReads, reads.PyReadGate),
    ):
        m = _harness(base, gate)({b"a": b"1"}, True, str.encode, None)
        for args, kwargs in (
            ((), {}),
            (("a", 1, 2), {}),
            (("a",), {"nope": 1}),
            (("a",), {"key": "a"}),
            (("a", 1), {"default": 2}),
        ):
            with pytest.raises(TypeError):
                m.get(*args, **kwargs)


def test_a_read_before_the_fields_are_set_takes_the_checked_path() -> None:
    _reads = _compiled()
    for base in (_reads.LocalReads, reads.PyLocalReads):

        class Bare(base):  # type: ignore[misc, valid-type]
            def _checked_getitem(self, key: Any) -> Any:
                return ("checked", key)

            def _checked_get(self, key: Any, default: Any) -> Any:
                return ("checked get", key, default)

            def _checked_contains(self, key: Any) -> bool:
                return False

        bare = Bare()
        assert bare["k"] == ("checked", "k") and bare.get("k", 1) == ("checked get", "k", 1)
        assert "k" not in bare


class _Keeper:
    """A stored key that hashes as key_bytes does and, compared with a probe, keeps it and
    reads through ``reader`` (the map) first: Python code in the middle of a lookup."""

    def __init__(self, key_bytes: bytes, reader: Callable[[], Any]) -> None:
        self.key_bytes, self.reader = key_bytes, reader
        self.kept: list[Any] = []

    def __hash__(self) -> int:
        return hash(self.key_bytes)

    def __eq__(self, other: object) -> bool:
        self.kept.append(other)
        self.reader()
        return False


@pytest.mark.parametrize("base", ["c", "python"])
def test_a_key_compared_in_the_middle_of_a_lookup_neither_sees_nor_causes_a_wrong_read(
    base: str,
) -> None:
    """The C type looks ASCII keys up through one reused bytes object (its probe). A stored
    key whose __eq__ keeps what it is compared with, and reads the map again meanwhile, must
    see the key it was asked about, keep it unchanged, and not change the outer read."""
    _reads = _compiled()
    types_ = (
        (_reads.LocalReads, _reads.ReadGate)
        if base == "c"
        else (reads.PyLocalReads, reads.PyReadGate)
    )
    table: dict[Any, Any] = {}
    m = _harness(*types_)(table, True, str.encode, None)
    inner: list[Any] = []
    keeper = _Keeper(b"outer", lambda: None)
    table[keeper] = b"never"  # first in its hash's probe sequence: compared first
    table[b"outer"] = b"outer value"
    table[b"inner"] = b"inner value"
    # The dict's probe sequence can pass the keeper's slot more than once, as the hash seed
    # has it: count the comparisons of one plain lookup.
    keeper.kept.clear()
    assert table[b"outer"] == b"outer value"
    per_read = len(keeper.kept)
    assert per_read >= 1
    keeper.kept.clear()
    keeper.reader = lambda: inner.append((m["inner"], m.get("nope", 0)))
    for read in (lambda: m["outer"], lambda: m.get("outer"), lambda: "outer" in m):
        assert read() in (b"outer value", True)
    assert inner == [(b"inner value", 0)] * 3 * per_read
    assert keeper.kept == [b"outer"] * 3 * per_read
    for i in range(50):  # more reads: what was kept stays as it is
        m.get(f"key-{i}")
    assert keeper.kept == [b"outer"] * 3 * per_read
    assert all(type(k) is bytes for k in keeper.kept)


def test_reads_leak_no_memory_and_no_references() -> None:
    _reads = _compiled()
    table = {f"k{i}".encode(): f"v{i}".encode() for i in range(100)}
    m = _harness(_reads.LocalReads, _reads.ReadGate)(table, True, str.encode, None)
    decoding = _harness(_reads.LocalReads, _reads.ReadGate)(
        types.MappingProxyType(table), True, StrCodec().encode, _refusing_decode
    )
    direct = _harness(_reads.LocalReads, _reads.ReadGate)(
        None, True, str.encode, None, catch_up="noop", prefix=b"p"
    )
    direct._lookup = table.get  # the direct path of a linearizable map
    watched = _harness(_reads.LocalReads, _reads.ReadGate, _reads.EndWatch)(
        None, True, str.encode, None, catch_up="noop", end_watches="3 at end"
    )
    watched._lookup = table.get
    keys = [f"k{i}" for i in range(100)] + ["absent", "\ud800", ("t",)]
    value, default = table[b"k7"], object()

    def work() -> None:
        for _ in range(200):
            for key in keys:
                for target in (m, decoding, direct, watched):
                    with contextlib.suppress(KeyError):
                        target[key]
                    target.get(key)
                    target.get(key, default)
                    key in target  # noqa: B015 - the read is what is measured

    found = growth(work, (table, m._gate, value, default, keys[3]))
    # 200 x 103 keys x 4 maps x 4 reads: a leaked object per read would be megabytes.
    assert found.allocated < 64 * 1024, (
        f"{found.allocated} bytes still allocated after 329,600 reads"
    )
    assert found.refs_after == found.refs_before


def test_a_cycle_through_the_c_fields_is_collected() -> None:
    _reads = _compiled()
    m = _harness(_reads.LocalReads, _reads.ReadGate)({}, True, str.encode, None)
    m._table = {b"self": m}  # map -> table -> map
    m._decode = [m].copy  # map -> bound method -> list -> map
    gone = weakref.ref(m)
    del m
    gc.collect()
    assert gone() is None, "the map's C fields kept a cycle alive"


def test_kafkakv_pure_python_selects_the_twin_for_a_whole_process(tmp_path: Any) -> None:
    script = textwrap.dedent(
        """
        import kafkakv
        from kafkakv.errors import ClosedError
        from kafkakv.map import reads
        from kafkakv.map.replica import ReplicaMap
        assert not reads.COMPILED and issubclass(ReplicaMap, reads.PyLocalReads)
        with kafkakv.connect(DIR) as db:
            m = db.map("m", value_codec="bytes")
            m["a"] = b"1"
            assert (m["a"], m.get("b", 0), "a" in m, "b" in m) == (b"1", 0, True, False)
            m.close()
            try:
                m["a"]
            except ClosedError:
                print("ok")
        """
    ).replace("DIR", repr(str(tmp_path / "db")))
    env = dict(os.environ, KAFKAKV_PURE_PYTHON="1")
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
