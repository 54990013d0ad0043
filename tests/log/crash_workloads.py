"""The workloads of the crash-state explorer (tests/log/crash_explorer.py), one per way the
embedded log changes its files: appends under each fsync policy, a transaction across
partitions, segment rolls, a compaction and its manifest swap, retention, recovery itself,
and a map's flush. Each is small (a few dozen effects) and deterministic in what it writes;
its crash states are what the explorer multiplies."""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import partial

import kafkakv
from kafkakv.errors import KafkaKVError
from kafkakv.log import EmbeddedLog, Record
from kafkakv.log.embedded.partition import Partition
from tests.log.crash_explorer import Recording, Session, reboot, record

__all__ = ["WORKLOADS"]


def _records(tag: str, n: int, size: int = 40) -> list[Record]:
    """``n`` records whose values say who they are (so a wrong offset shows)."""
    return [
        Record(f"{tag}-k{i % 5}".encode(), f"{tag}-{i}|".encode().ljust(size, b"."))
        for i in range(n)
    ]


def _appends(s: Session, policy: str) -> None:
    log = EmbeddedLog(s.path, fsync=policy, fsync_interval_ms=3_600_000, background_cleaner=False)
    log.create_topic("t", 2)
    sizes = [(1, 30), (3, 200), (1, 5000), (2, 700), (1, 9000), (4, 60), (1, 2100), (2, 90)]
    sizes += [(1, 6000), (3, 400), (1, 13000)]
    for i, (n, size) in enumerate(sizes):
        s.append(log, "t", i % 2, _records(f"a{i}", n, size))
        if policy == "interval" and i == 3:
            log._flush_pending()  # a flusher pass: what was appended before it is durable
            s.recording.acknowledge_all(s.rec.mark())
    log.close()
    if policy != "never":
        s.recording.acknowledge_all(s.rec.mark())  # close() flushes


def _transactions(s: Session, policy: str) -> None:
    log = EmbeddedLog(s.path, fsync=policy, fsync_interval_ms=3_600_000, background_cleaner=False)
    log.create_topic("a", 1)
    log.create_topic("b", 2)
    writer = log.writer("tx")
    for i in range(3):
        batches = {("a", 0): _records(f"x{i}a", 2), ("b", 1): _records(f"x{i}b", 1, 3000)}
        offsets = writer.append(batches)
        group = []
        for tp, records in batches.items():
            s.recording.appended_at(tp, offsets[tp], records)
            if policy == "always":
                s.recording.acknowledge(s.rec.mark(), tp, offsets[tp], len(records))
            group += [(tp, offsets[tp] + j) for j in range(len(records))]
        s.recording.groups.append(group)
        s.append(log, "b", 0, _records(f"p{i}", 1))
        if policy == "interval" and i == 1:
            log._flush_pending()
            s.recording.acknowledge_all(s.rec.mark())
    writer.close()
    log.close()
    if policy == "interval":
        s.recording.acknowledge_all(s.rec.mark())


def _rolls(s: Session, policy: str) -> None:
    log = EmbeddedLog(s.path, fsync=policy, fsync_interval_ms=3_600_000, background_cleaner=False)
    log.create_topic("r", 1, {"segment.bytes": 1024, "index.interval.bytes": 128})
    for i in range(10):
        s.append(log, "r", 0, _records(f"r{i}", 1 + i % 3, 150))
    log.close()
    if policy == "interval":
        s.recording.acknowledge_all(s.rec.mark())


def _compact(s: Session, policy: str) -> None:
    log = EmbeddedLog(s.path, fsync=policy, fsync_interval_ms=3_600_000, background_cleaner=False)
    log.create_topic("c", 1, {"cleanup.policy": "compact", "segment.bytes": 1024})
    s.recording.compacted.add("c")
    for i in range(12):
        s.append(log, "c", 0, _records(f"c{i}", 2, 90))
    s.append(log, "c", 0, [Record(b"c0-k0", None)])  # a tombstone
    log.compact("c")
    s.append(log, "c", 0, _records("after", 1))
    log.close()
    if policy == "interval":
        s.recording.acknowledge_all(s.rec.mark())


def _retain(s: Session, policy: str) -> None:
    log = EmbeddedLog(s.path, fsync=policy, fsync_interval_ms=3_600_000, background_cleaner=False)
    log.create_topic("d", 1, {"segment.bytes": 1024, "retention.bytes": 600})
    for i in range(8):
        s.append(log, "d", 0, _records(f"d{i}", 1, 200))
    assert log.enforce_retention("d") > 0
    s.recording.start_at_most[("d", 0)] = log.start_offset("d", 0)
    s.append(log, "d", 0, _records("late", 1))
    log.close()
    if policy == "interval":
        s.recording.acknowledge_all(s.rec.mark())


def _damaged(path: str, recording: Recording) -> None:
    """A log whose power failed mid-append: the last batch of each partition half written,
    its head from the boot before."""
    with EmbeddedLog(path, fsync="never", background_cleaner=False) as log:
        log.create_topic("v", 2, {"index.interval.bytes": 100})
        for p in range(2):
            for i in range(4):
                records = _records(f"v{p}{i}", 2, 120)
                offset = log.append("v", p, records)
                recording.appended_at(("v", p), offset, records)
                if i < 3:
                    recording.acknowledge(0, ("v", p), offset, len(records))
    for p in range(2):
        pdir = os.path.join(path, "topics", "v", str(p))
        (seg,) = [f for f in os.listdir(pdir) if f.endswith(".log")]
        os.truncate(os.path.join(pdir, seg), os.path.getsize(os.path.join(pdir, seg)) - 100)
    reboot(path)


def _recovery(s: Session) -> None:
    log = EmbeddedLog(s.path, fsync="always", background_cleaner=False)
    for p in range(2):  # recovery runs here: it truncates the torn batch, rebuilds the index
        s.append(log, "v", p, _records(f"new{p}", 1, 300))
    log.close()


def _half_committed(path: str, recording: Recording) -> None:
    """A log whose writer died between a transaction's commit point (its journal) and
    publishing the heads, then lost power: recovery must roll the transaction forward."""
    log = EmbeddedLog(path, fsync="always", background_cleaner=False)
    log.create_topic("a", 1)
    log.create_topic("b", 1)
    for tp in (("a", 0), ("b", 0)):
        records = _records(f"pre-{tp[0]}", 2, 100)
        recording.appended_at(tp, log.append(*tp, records), records)
    writer = log.writer("tx")
    batches = {("a", 0): _records("tx-a", 2, 300), ("b", 0): _records("tx-b", 1, 300)}

    def dies(self: Partition, head: object, origin: object = None) -> None:
        raise _Died

    real = Partition.publish_locked
    Partition.publish_locked = dies  # type: ignore[method-assign]
    try:
        writer.append(batches)
    except _Died:
        pass
    finally:
        Partition.publish_locked = real  # type: ignore[method-assign]
    for tp, records in batches.items():  # committed: offsets follow the records before
        recording.appended_at(tp, 2, records)
    recording.groups.append([(tp, 2 + i) for tp, rs in batches.items() for i in range(len(rs))])
    recording.acknowledge_all(0)
    log.close()  # as the dead process's exit would: nothing is published
    reboot(path)


class _Died(Exception):
    pass


def _roll_forward(s: Session) -> None:
    log = EmbeddedLog(s.path, fsync="always", background_cleaner=False)  # rolls forward here
    s.append(log, "a", 0, _records("after-a", 1, 200))
    writer = log.writer("tx")
    offsets = writer.append({("b", 0): _records("tx2", 1)})
    s.recording.appended_at(("b", 0), offsets[("b", 0)], _records("tx2", 1))
    s.recording.acknowledge(s.rec.mark(), ("b", 0), offsets[("b", 0)], 1)
    log.close()


def _map_updates(s: Session, policy: str) -> None:
    """Updates of a map of two partitions that flushes every 4 updates (and once on demand);
    under ``always`` each update is acknowledged as durable when it returns, under
    ``interval`` all of them at a flusher pass in the middle and at close."""
    states: list[dict[str, int]] = [{}]
    durable = [0]  # from which op on each state is acknowledged (0: from the start)
    big = 1 << 62
    db = kafkakv.connect(
        s.path, fsync=policy, fsync_interval_ms=3_600_000, background_cleaner=False
    )
    m = db.map("m", partitions=2, flush_period=4)
    part_of = {f"k{i}": m.partition_of(f"k{i}") for i in range(6)}
    for i in range(14):
        key = f"k{i % 6}"
        if i % 5 == 4:
            m.pop(key, None)
        else:
            m[key] = i
        states.append(dict(m.items()))
        durable.append(s.rec.mark() if policy == "always" else big)
        s.recording.acked(s.rec.mark())
        if i == 8:
            m.flush()
        if i == 10 and policy == "interval":
            assert isinstance(db.log, EmbeddedLog)
            db.log._flush_pending()
            durable = [min(at, s.rec.mark()) for at in durable]
    db.close()
    durable = [min(at, s.rec.mark()) for at in durable]  # close() flushes

    def agrees(path: str, k: int) -> list[str]:
        """In each partition, the map a fresh replica loads is the state after some update,
        no earlier than the last one acknowledged before this crash point (partitions are
        separate logs: one may have lost an unsynced tail that another kept)."""
        least = max(n for n, at in enumerate(durable) if at <= k)
        try:
            with kafkakv.connect(path, fsync="never", background_cleaner=False) as db2:
                got = dict(db2.map("m", create=False, timeout=10).items())
        except KafkaKVError as exc:
            return [f"the map does not open: {type(exc).__name__}: {exc}"] if least else []
        problems = []
        for p in (0, 1):
            mine = {key: v for key, v in got.items() if part_of[key] == p}
            options = [{key: v for key, v in st.items() if part_of[key] == p} for st in states]
            if mine not in options[least:]:
                problems.append(
                    f"partition {p} of the map reads {mine}, not a state from {least} on"
                )
        return problems

    s.recording.extra = agrees


_BY_POLICY: list[tuple[str, Callable[..., None], tuple[str, ...]]] = [
    ("appends", _appends, ("always", "interval", "never")),
    ("transaction", _transactions, ("always", "interval")),
    ("segment-roll", _rolls, ("always", "interval")),
    ("compaction", _compact, ("always", "interval")),
    ("retention", _retain, ("always", "interval")),
    ("map-flush", _map_updates, ("always", "interval")),
]

WORKLOADS: dict[str, Callable[[], Recording]] = {
    f"{name}-{policy}": partial(record, f"{name}-{policy}", partial(run, policy=policy))
    for name, run, policies in _BY_POLICY
    for policy in policies
}
WORKLOADS["recovery"] = partial(record, "recovery", _recovery, setup=_damaged)
WORKLOADS["roll-forward"] = partial(record, "roll-forward", _roll_forward, setup=_half_committed)
