"""The crash-state explorer: record a workload's file-system effects, open every crash state.

A **workload** runs against an embedded log in a fresh directory while a
:class:`~tests.log.fs_record.Recorder` notes every effect, and says what it was told: the
offset ``append()`` (or a transaction's commit) returned for each record, and from which
point of the recording each record is acknowledged as durable under the fsync policy in
force (``always``: when its append returns; ``interval``: when a flusher pass that began
after it returns, or ``close()``; ``never``: not at all). That is a :class:`Recording`.

:func:`explore` builds its crash states (tests/log/crash_states.py), skips those whose files
are byte for byte a state already seen, and opens each of the others as a process after a
reboot would: the heads carry another boot id. Each state must satisfy:

- the log opens and every partition reads to its end (a typed kafkakv error refusing it is
  counted apart, and is a violation too: every state the model allows must open; any other
  exception is a violation with its traceback);
- ``check()`` reports nothing afterwards;
- every record acknowledged as durable at that point of the recording reads back at the
  offset it was given (for a compacted topic: its key reads back at that offset or later),
  unless retention the workload ran has removed it;
- every record that reads back is one that was appended, at the offset it was given, with
  its content (so nothing unacknowledged shows up in a wrong place or torn);
- the records of one transaction are visible together or not at all;
- any check of the workload's own (a map: its data topic and flush point agree).

``KAFKAKV_CRASH_STATES`` bounds how many states each workload opens (spread over all of them,
first and last included); the benchmark-style script ``benchmarks/crash_explorer.py`` opens all.
"""

from __future__ import annotations

import bisect
import hashlib
import os
import shutil
import tempfile
import traceback
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from kafkakv.errors import KafkaKVError
from kafkakv.log import EmbeddedLog, FsyncPolicy, Record
from kafkakv.log.embedded.head import HEAD_SIZE, unpack_head
from tests.log.crash_states import Disk, FsOp, crash_states, materialize
from tests.log.fs_record import Recorder
from tests.records import offset_of

__all__ = ["Outcome", "Recording", "Session", "explore", "reboot", "record"]

TP = tuple[str, int]
Extra = Callable[[str, int], list[str]]  # (state directory, prefix length) -> violations
TEARS = 8  # tear points tried per unsynced write (sector and page boundaries, spread)


@dataclass
class Recording:
    """What a workload did to the disk and what it was told."""

    name: str
    ops: list[FsOp] = field(default_factory=list)
    base: Disk | None = None
    appended: dict[TP, dict[int, tuple[bytes | None, bytes | None]]] = field(default_factory=dict)
    durable: list[tuple[int, TP, int]] = field(default_factory=list)  # (from op, tp, offset)
    compacted: set[str] = field(default_factory=set)
    start_at_most: dict[TP, int] = field(default_factory=dict)  # retention's furthest start
    groups: list[list[tuple[TP, int]]] = field(default_factory=list)  # transactions
    extra: Extra | None = None
    acks: list[int] = field(default_factory=list)  # every op count at which something was acked

    def acked(self, at: int) -> None:
        """Note that something (a record, a map's update) is acknowledged from op ``at`` on."""
        self.acks.append(at)

    def appended_at(self, tp: TP, offset: int, records: list[Record]) -> None:
        """Note that ``records`` were given offsets from ``offset`` on."""
        into = self.appended.setdefault(tp, {})
        for i, r in enumerate(records):
            into[offset + i] = (r.key, r.value)

    def acknowledge(self, at: int, tp: TP, offset: int, count: int) -> None:
        """Records ``offset..offset+count-1`` of ``tp`` are durable in states of ``at`` ops on."""
        self.durable += [(at, tp, o) for o in range(offset, offset + count)]
        self.acked(at)

    def acknowledge_all(self, at: int) -> None:
        """Every record appended so far is durable from op ``at`` on (a flush or a close)."""
        known = {(tp, o) for _, tp, o in self.durable}
        for tp, records in self.appended.items():
            self.durable += [(at, tp, o) for o in records if (tp, o) not in known]
        self.acked(at)


class Session:
    """A workload's handle: the log directory, the recorder, and the recording to fill."""

    def __init__(self, path: str, recorder: Recorder, recording: Recording):
        self.path = path
        self.rec = recorder
        self.recording = recording

    def append(self, log: EmbeddedLog, topic: str, partition: int, records: list[Record]) -> int:
        """``log.append`` noted: the offsets it gave, and (under ``always``) its durability."""
        offset = log.append(topic, partition, records)
        self.recording.appended_at((topic, partition), offset, records)
        if log.settings.fsync is FsyncPolicy.ALWAYS:
            self.recording.acknowledge(self.rec.mark(), (topic, partition), offset, len(records))
        return offset


def record(
    name: str,
    workload: Callable[[Session], None],
    *,
    setup: Callable[[str, Recording], None] | None = None,
) -> Recording:
    """Run ``workload`` in a fresh directory and return its :class:`Recording`. ``setup``
    runs first, unrecorded: what it leaves is the durable ``base`` of every crash state (it
    notes in the recording what it appended, and what of that is durable: ``acknowledge(0,
    ...)``)."""
    root = tempfile.mkdtemp(prefix=f"kkv-rec-{name}-", dir=_scratch())
    try:
        path = os.path.join(root, "log")
        recording = Recording(name)
        if setup is not None:
            setup(path, recording)
            recording.base = _disk_of(root)
        with Recorder(root) as rec:
            workload(Session(path, rec, recording))
        recording.ops = rec.ops
        return recording
    finally:
        shutil.rmtree(root, ignore_errors=True)


@dataclass
class Outcome:
    """What exploring one recording found."""

    name: str
    states: int = 0  # distinct crash states built
    opened: int = 0  # of them, opened and checked
    refused: int = 0  # of those, refused with a typed error (each one is also a violation)
    violations: list[str] = field(default_factory=list)


def explore(recording: Recording, *, limit: int | None = None) -> Outcome:
    """Open the distinct crash states of ``recording`` (at most ``limit`` of them, spread
    evenly, the first and the last included) and check each (see the module docstring)."""
    states = _distinct(recording)
    outcome = Outcome(recording.name, states=len(states))
    chosen = states
    if limit is not None and len(states) > limit:
        step = (len(states) - 1) / max(limit - 1, 1)
        chosen = [states[round(i * step)] for i in range(limit)]
    scratch = tempfile.mkdtemp(prefix=f"kkv-crash-{recording.name}-", dir=_scratch())
    try:
        for n, (what, k, disk) in enumerate(chosen):
            root = os.path.join(scratch, str(n))
            materialize(disk, root)
            reboot(root)
            found, refused = _check_state(recording, os.path.join(root, "log"), k)
            outcome.opened += 1
            outcome.refused += refused
            outcome.violations += [f"{recording.name}: {what}: {v}" for v in found]
            shutil.rmtree(root, ignore_errors=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return outcome


def _distinct(recording: Recording) -> list[tuple[str, int, Disk]]:
    """The crash states, each distinct pair of (content, what is acknowledged by then) once,
    with the first description that made it and its prefix length. The same content reached
    from a longer prefix must hold more when more was acknowledged by then (a lost rename
    can undo every later write), so it is a state of its own."""
    seen: set[tuple[bytes, int]] = set()
    out: list[tuple[str, int, Disk]] = []
    acks = sorted(recording.acks)
    for what, disk in crash_states(recording.ops, base=recording.base, max_tears=TEARS):
        k = int(what.split()[1].rstrip(","))
        digest = hashlib.blake2b(digest_size=16)
        for d in sorted(disk.dirs):
            digest.update(b"d" + d.encode() + b"\0")
        for name, content in sorted(disk.files().items()):
            digest.update(b"f" + name.encode() + b"\0" + len(content).to_bytes(8, "little"))
            digest.update(content)
        key = (digest.digest(), bisect.bisect_right(acks, k))
        if key not in seen:
            seen.add(key)
            out.append((what, k, disk))
    return out


def _check_state(recording: Recording, path: str, k: int) -> tuple[list[str], bool]:
    """Violations of the state at ``path`` (from a prefix of ``k`` ops), and whether it was
    refused with a typed error."""
    durable = {(tp, o) for at, tp, o in recording.durable if at <= k}
    problems: list[str] = []
    try:
        if not os.path.isdir(path):
            if recording.base is not None or durable:
                return ["the log directory is gone"], False
            return [], False  # its creation was lost: nothing was acknowledged yet
        with EmbeddedLog(path, fsync="never", background_cleaner=False) as log:
            seen, starts = _read_everything(log, recording, problems)
            problems += [f"check(): {p}" for p in log.check()]
        problems += _missing(recording, durable, seen, starts)
        problems += _torn_transactions(recording, seen)
        if recording.extra is not None:
            problems += recording.extra(path, k)
    except KafkaKVError as exc:  # typed, but every state the model allows must open
        return [f"refused with {type(exc).__name__}: {exc}"], True
    except Exception:  # the finding itself: an untyped failure
        return [f"untyped failure:\n{traceback.format_exc()}"], False
    return problems, False


def _read_everything(
    log: EmbeddedLog, recording: Recording, problems: list[str]
) -> tuple[dict[TP, dict[int, tuple[bytes | None, bytes | None]]], dict[TP, int]]:
    """Every record of the recording's partitions, by offset, and each one's start offset."""
    seen: dict[TP, dict[int, tuple[bytes | None, bytes | None]]] = {}
    starts: dict[TP, int] = {}
    topics = set(log.topics())
    for tp, written in recording.appended.items():
        topic, partition = tp
        if topic not in topics:
            seen[tp] = {}
            continue
        start, end = log.start_offset(topic, partition), log.end_offset(topic, partition)
        starts[tp] = start
        limit = recording.start_at_most.get(tp)
        if limit is not None and start > limit:
            problems.append(f"{tp}: starts at {start}, retention only went to {limit}")
        got: dict[int, tuple[bytes | None, bytes | None]] = {}
        at = start
        while at < end:
            batch = log.read(topic, partition, at, max_records=10_000)
            if not batch:
                problems.append(f"{tp}: read at {at} returned nothing before the end {end}")
                break
            for r in batch:
                offset = offset_of(r)
                if offset in got or offset < at:
                    problems.append(f"{tp}: offset {offset} read twice or out of order")
                got[offset] = (r.key, r.value)
                want = written.get(offset)
                if want != (r.key, r.value):
                    problems.append(
                        f"{tp}: offset {offset} reads {(r.key, r.value)!r},"
                        f" but was given to {want!r}"
                    )
            at = offset_of(batch[-1]) + 1
        seen[tp] = got
    return seen, starts


def _missing(
    recording: Recording,
    durable: set[tuple[TP, int]],
    seen: dict[TP, dict[int, tuple[bytes | None, bytes | None]]],
    starts: dict[TP, int],
) -> list[str]:
    """Durable records that do not read back (retention's removals aside, which
    _read_everything bounds)."""
    problems = []
    latest: dict[tuple[TP, bytes | None], int] = {}
    for tp, o in durable:
        got = seen.get(tp, {})
        if tp[0] in recording.compacted:
            key = recording.appended[tp][o][0]
            latest[(tp, key)] = max(latest.get((tp, key), -1), o)
            continue
        removed = tp in recording.start_at_most and o < starts.get(tp, 0)
        if o not in got and not removed:
            problems.append(f"{tp}: durable record at offset {o} is missing")
    for (tp, key), o in latest.items():
        got = seen.get(tp, {})
        if not any(at >= o and kv[0] == key for at, kv in got.items()):
            problems.append(f"{tp}: key {key!r}, durable at offset {o}, reads back older or not")
    return problems


def _torn_transactions(
    recording: Recording, seen: dict[TP, dict[int, tuple[bytes | None, bytes | None]]]
) -> list[str]:
    problems = []
    for group in recording.groups:
        visible = [(tp, o) for tp, o in group if o in seen.get(tp, {})]
        if visible and len(visible) != len(group):
            problems.append(f"transaction {group} partly visible: only {visible}")
    return problems


def reboot(root: str) -> None:
    """Give every head file of the state another boot id, as after a power loss."""
    other = uuid.uuid4().bytes
    for path in _files(root):
        if os.path.basename(path) != "head":
            continue
        with open(path, "r+b") as f:
            state = unpack_head(f.read(HEAD_SIZE))
            if state is not None:
                f.seek(0)
                f.write(state._replace(boot_id=other).pack())


def _files(root: str) -> Iterator[str]:
    for top, _dirs, files in os.walk(root):
        for f in files:
            yield os.path.join(top, f)


def _disk_of(root: str) -> Disk:
    """The files and directories under ``root`` as a :class:`Disk` (all durable)."""
    disk = Disk()
    for top, dirs, files in os.walk(root):
        rel = os.path.relpath(top, root)
        rel = "" if rel == "." else rel.replace(os.sep, "/")
        for d in dirs:
            disk.dirs.add(f"{rel}/{d}" if rel else d)
        for f in files:
            name = f"{rel}/{f}" if rel else f
            with open(os.path.join(top, f), "rb") as fh:
                disk.inodes[disk.next_inode] = bytearray(fh.read())
            disk.names[name] = disk.next_inode
            disk.next_inode += 1
    return disk


def _scratch() -> str | None:
    """Where crash states are built: memory when there is a tmpfs (thousands of small
    directories), else the default temporary directory."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
