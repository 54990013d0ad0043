"""A replica's store against its log: :func:`deep_check`, which ``m.check(deep=True)`` runs.

A store's own check (:meth:`~kafkakv.store.base.Store.check`) verifies its structure; a byte
flipped inside a value on disk leaves the structure sound, and the store serves the wrong
value. The log holds the truth. :func:`deep_check` builds the state the log says this replica
holds, in a *reference replica* (:mod:`kafkakv.map.reference`): a second engine over the same
topics and partitions, never started, with an in-memory store, filled by the engine's own
bootstrap and apply code (the data topic up to its end, then the ops after its flush point, up
to the position the replica has applied). It then compares the reference with the store key
by key.

The replica keeps applying meanwhile; the comparison is still made at one position per
partition, without holding the replica for the whole of it:

1. per partition, the reference loads the data topic; the replica is brought up to its flush
   point if it is behind it; the reference replays the ops up to the replica's position ``a``;
2. one pass over the store and one over the reference, with the replica applying, collects
   the *suspects*: keys whose values differ or that one side lacks;
3. with applying paused, the reference replays the ops the replica applied during the pass
   (up to its position ``b`` now), and each suspect and each key those ops name is compared
   again. A key no op names between ``a`` and ``b`` did not change in the store during the
   pass, so what the pass saw of it is its value at ``b``: no key is missed, none reported
   for a change in flight.

Costs: the data topic and the unflushed ops are read once (what opening a fresh replica
reads), a copy of the map is held in memory while it runs, and the store is read twice (once
per key, once per reference key); applying pauses only for step 3. docs/maps-operations.md gives
measured figures.
"""

from __future__ import annotations

import time

from kafkakv.errors import DecodeError, PartitionStalledError
from kafkakv.map.engine import ReplicaEngine
from kafkakv.map.machine import MapState
from kafkakv.map.reference import rebuild, reference, replay
from kafkakv.store.base import Store
from kafkakv.store.memory import DictStore

__all__ = ["deep_check", "difference", "suspects"]

_SHOWN = 40  # bytes of a value shown in a problem


def deep_check(engine: ReplicaEngine, state: MapState) -> list[str]:
    """Compare the store of map ``state`` (held by ``engine``) with the state its log gives at
    the position the replica has applied; one problem per key that differs, is missing or is
    extra, and one per partition that could not be compared. See the module docstring for
    how and at what cost. Raises what reading the log raises (DataLossError when the ops topic
    lost unflushed ops, OperationTimeoutError, ClosedError)."""
    engine.check_usable()
    problems: list[str] = []
    expected_state = MapState(state.name, state.prefix, state.keys, state.values, DictStore())
    ref = reference(engine, expected_state)
    try:
        deadline = time.monotonic() + engine.settings.timeout
        compared: list[int] = []
        for p in engine.held:
            flushed = rebuild(ref, p)
            if engine.positions()[p].applied <= flushed:  # another replica flushed further
                try:
                    engine.apply_until(p, flushed, deadline)
                except PartitionStalledError as exc:
                    problems.append(f"partition {p}: not compared: {exc}")
                    continue
            if _replayed(ref, p, engine.positions()[p].applied, problems):
                compared.append(p)
        found = suspects(state.store, expected_state.store)
        with engine.paused():
            now = engine.positions()
            prefix = state.prefix
            for p in list(compared):
                touched = replay(ref, p, now[p].applied)
                if not _replayed(ref, p, now[p].applied, problems):
                    compared.remove(p)
                found.update(k[len(prefix) :] for k in touched if k.startswith(prefix))
            held = set(compared)
            for key in sorted(found):
                p = engine.partition_of(prefix + key)
                if p in held:
                    stored, expected = state.store.get(key), expected_state.store.get(key)
                    if stored != expected:
                        problems.append(difference(state, p, key, stored, expected))
    finally:
        ref.close()
    return problems


def _replayed(ref: ReplicaEngine, p: int, stop: int, problems: list[str]) -> bool:
    """Replay the reference's partition ``p`` up to ``stop``; False (and why, in
    ``problems``) when it cannot get there."""
    replay(ref, p, stop)
    reached = ref.positions()[p].applied
    if reached >= stop:
        return True
    stall = ref.stalled.get(p)
    if stall is not None:
        problems.append(f"partition {p}: not compared: {stall}")
    else:
        problems.append(
            f"partition {p}: the replica is at ops offset {stop} (it applied every op "
            f"before it), but {ref.topics.ops}[{p}] ends at {reached}"
        )
    return False


def suspects(store: Store, reference: Store) -> set[bytes]:
    """The keys whose values differ between ``store`` and ``reference`` (or that one of them
    lacks), from one pass over the store and, unless it saw every key of the reference, one
    over the reference: O(n) lookups, no lock. While ``store`` changes, a key changed during
    the pass may be in the set or not; every other key is decided right.

    >>> a, b = DictStore(), DictStore()
    >>> a.write({b"same": b"1", b"flipped": b"2", b"extra": b"3"}, {})
    >>> b.write({b"same": b"1", b"flipped": b"X", b"missing": b"4"}, {})
    >>> sorted(suspects(a, b))
    [b'extra', b'flipped', b'missing']
    """
    found = set()
    expected = reference.get
    shared = 0  # keys of the reference seen in the store, each at most once
    for key, value in store.items():
        other = expected(key)
        if other is not None:
            shared += 1
        if other != value:
            found.add(key)
    if shared < len(reference):  # some key of the reference was not seen: find which
        for key in reference:
            if key not in store:
                found.add(key)
    return found


def difference(
    state: MapState, p: int, key: bytes, stored: bytes | None, expected: bytes | None
) -> str:
    """The problem a key whose stored value is not the expected one makes: the key decoded
    by the map's codec when it can be, the values as bytes (the first 40).

    >>> from kafkakv.codecs import JsonCodec, StrCodec
    >>> s = MapState("m", b"", StrCodec(), JsonCodec(), DictStore())
    >>> print(difference(s, 3, b"k", b'"b"', b'"a"'))
    partition 3, key 'k': the store holds b'"b"'; the log says b'"a"'
    >>> print(difference(s, 3, b"k", None, b"1"))
    partition 3, key 'k': missing from the store; the log says b'1'
    """
    try:
        name = repr(state.keys.decode(key))
    except DecodeError:
        name = repr(key)
    if stored is None:
        return f"partition {p}, key {name}: missing from the store; the log says {_show(expected)}"
    if expected is None:
        return (
            f"partition {p}, key {name}: the store holds {_show(stored)}; the log has no such key"
        )
    return f"partition {p}, key {name}: the store holds {_show(stored)}; the log says {_show(expected)}"


def _show(value: bytes | None) -> str:
    if value is None or len(value) <= _SHOWN:
        return repr(value)
    return f"{value[:_SHOWN]!r}... ({len(value)} bytes)"
