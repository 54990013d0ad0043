"""Crash states: what a disk may hold after a power loss, given the file operations before it.

A recording is the list of file-system operations a workload made, in order (:class:`FsOp`).
:func:`crash_states` builds from it the states that POSIX and ext4 with ``data=ordered`` allow
a disk to be left in when power fails at any point, and :func:`materialize` writes one into a
directory for the engine to open. The model, deliberately on the pessimistic side of ext4:

- **Any prefix.** Power may fail after any operation: the state holds ops[:k], for every k.
- **File contents are durable at fsync.** A write (or truncate) after the file's last
  ``fsync``/``fdatasync`` may be missing, or present only in part: torn at a 512-byte sector
  boundary or a 4 KiB page boundary inside the write. Writes to different files are
  independent; the writes of one file since its last sync are kept as a prefix (a later
  write survives only if the earlier ones did, which data=ordered gives for appends).
- **Names are durable at the directory's fsync.** A create, mkdir, rename or unlink after the
  last fsync of its parent directory (both parents for a rename) may be lost: the name goes
  back to what it was. A file fsynced before its directory entry is fsynced may thus vanish
  with its data.

Each state is one such fault, or all of them at once, on top of a prefix: enough to find the
orderings a storage engine gets wrong (a rename before the data it names is synced, a
manifest pointing at a segment whose directory entry was never synced) without the
combinatorial explosion of every subset.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

__all__ = ["Disk", "FsOp", "crash_states", "materialize"]

SECTOR = 512
PAGE = 4096


@dataclass(frozen=True)
class FsOp:
    """One file-system effect. ``kind`` is one of ``mkdir``, ``rmdir``, ``create``, ``write``
    (``data`` at ``offset``), ``truncate`` (to ``size``), ``fsync`` (a file's data and size),
    ``dirsync`` (a directory's entries), ``rename`` (``path`` to ``dest``, a file or a whole
    directory), ``link`` (a second name ``dest`` for the file ``path``), ``unlink``.
    Paths are relative to the root of the recording, with ``/`` separators."""

    kind: str
    path: str
    offset: int = 0
    data: bytes = b""
    size: int = 0
    dest: str = ""


@dataclass
class Disk:
    """What the disk holds: directories, and files by name (a name maps to an inode)."""

    dirs: set[str] = field(default_factory=lambda: {""})
    names: dict[str, int] = field(default_factory=dict)
    inodes: dict[int, bytearray] = field(default_factory=dict)
    next_inode: int = 0

    def copy(self) -> Disk:
        return Disk(
            set(self.dirs),
            dict(self.names),
            {i: bytearray(b) for i, b in self.inodes.items()},
            self.next_inode,
        )

    def files(self) -> dict[str, bytes]:
        return {name: bytes(self.inodes[i]) for name, i in self.names.items()}


@dataclass
class _Step:
    """An op resolved against the tree as it was when it ran: the inodes it touched.

    ``ino``: the file written, truncated or synced, or the inode a name op creates, moves,
    links or removes; ``at``/``to``: (directory inode, name) of the entry it removes or
    makes. Resolving first lets a crash state keep a file's synced data whatever becomes of
    its names, as a real file system does."""

    op: FsOp
    ino: int = -1
    at: tuple[int, str] | None = None
    to: tuple[int, str] | None = None


class _Tree:
    """Directory entries ``(directory inode, name) -> inode`` and which inodes are directories."""

    def __init__(self, base: Disk | None):
        self.entries: dict[tuple[int, str], int] = {}
        self.dirs: set[int] = set()
        self.next = base.next_inode if base else 0
        self.root = self.fresh(directory=True)
        if base:
            for d in sorted(base.dirs, key=lambda p: p.count("/")):
                if d:
                    self.entries[self.where(d)] = self.fresh(directory=True)
            for name, ino in base.names.items():
                self.entries[self.where(name)] = ino

    def fresh(self, *, directory: bool = False) -> int:
        ino = self.next
        self.next += 1
        if directory:
            self.dirs.add(ino)
        return ino

    def lookup(self, path: str) -> int:
        ino = self.root
        for part in path.split("/") if path else ():
            ino = self.entries[(ino, part)]
        return ino

    def where(self, path: str) -> tuple[int, str]:
        parent, _, name = path.rpartition("/")
        return self.lookup(parent), name


def _resolve(base: Disk | None, ops: Sequence[FsOp]) -> tuple[list[_Step], _Tree]:
    """Each op with the inodes it touched, replaying the names as they were when it ran."""
    tree = _Tree(base)
    steps = []
    for op in ops:
        step = _Step(op)
        if op.kind in ("write", "truncate", "fsync", "dirsync"):
            step.ino = tree.lookup(op.path)
        elif op.kind in ("create", "mkdir"):
            step.to = tree.where(op.path)
            if step.to in tree.entries:  # opened with O_CREAT but already there
                step.ino = tree.entries[step.to]
            else:
                step.ino = tree.fresh(directory=op.kind == "mkdir")
                tree.entries[step.to] = step.ino
        elif op.kind in ("unlink", "rmdir"):
            step.at = tree.where(op.path)
            step.ino = tree.entries.pop(step.at)
        elif op.kind in ("rename", "link"):
            step.at, step.to = tree.where(op.path), tree.where(op.dest)
            step.ino = tree.entries[step.at]
            if op.kind == "rename":
                del tree.entries[step.at]
            tree.entries[step.to] = step.ino
        else:
            raise ValueError(f"unknown file-system op {op.kind!r}")
        steps.append(step)
    return steps, tree


def _tears(op: FsOp) -> list[int]:
    """How much of a write may survive a crash: nothing, each sector or page boundary inside
    it (absolute offsets, so a write not aligned to them tears where the device would)."""
    cuts = {0}
    end = op.offset + len(op.data)
    for unit in (SECTOR, PAGE):
        boundary = (op.offset // unit + 1) * unit
        while boundary < end:
            cuts.add(boundary - op.offset)
            boundary += unit
    return sorted(cuts)


def crash_states(
    ops: Sequence[FsOp], *, max_tears: int = 4, base: Disk | None = None
) -> Iterator[tuple[str, Disk]]:
    """Every crash state of the recording ``ops``: ``(description, disk)`` pairs.

    ``base`` is what the disk held, all of it durable, when the recording started (empty by
    default).

    For each prefix: the prefix itself, then each single fault the model allows on top of it
    (one unsynced write of a file missing or torn, with that file's later unsynced writes
    lost too; one unsynced name change lost), then all of its faults at once.
    ``max_tears`` bounds the tear points tried per write (spread over the write).
    """
    steps, _ = _resolve(base, ops)
    for k in range(len(ops) + 1):
        prefix = steps[:k]
        yield f"prefix {k}", _replay(base, prefix, {}, set())
        writes, names = _unsynced(prefix)
        for indexes in writes.values():
            for i in indexes:
                op = prefix[i].op
                cuts = _tears(op) if op.kind == "write" else [0]
                if len(cuts) > max_tears:
                    step = len(cuts) / max_tears
                    cuts = sorted({cuts[int(j * step)] for j in range(max_tears)})
                for cut in cuts:
                    lost = {j: 0 for j in indexes if j > i}
                    lost[i] = cut
                    what = "lost" if cut == 0 else f"torn at {cut}"
                    yield (
                        f"prefix {k}, op {i} ({op.kind} {op.path}) {what}",
                        _replay(base, prefix, lost, set()),
                    )
        for i in names:
            op = prefix[i].op
            yield (
                f"prefix {k}, op {i} ({op.kind} {op.path}) not in its directory",
                _replay(base, prefix, {}, {i}),
            )
        if writes or names:
            every = {i: 0 for indexes in writes.values() for i in indexes}
            yield (
                f"prefix {k}, every unsynced change lost",
                _replay(base, prefix, every, set(names)),
            )


def _unsynced(steps: Sequence[_Step]) -> tuple[dict[int, list[int]], list[int]]:
    """Indexes of the writes and truncates after each file's last sync (by inode, in order),
    and of the name changes not yet made durable by a sync of every directory they changed."""
    file_ops: dict[int, list[int]] = {}
    waiting: dict[int, set[int]] = {}  # name op -> directories still to be synced
    for i, step in enumerate(steps):
        kind = step.op.kind
        if kind in ("write", "truncate"):
            file_ops.setdefault(step.ino, []).append(i)
        elif kind == "fsync":
            file_ops.pop(step.ino, None)
        elif kind == "dirsync":
            for j in list(waiting):
                waiting[j].discard(step.ino)
                if not waiting[j]:
                    del waiting[j]
        else:
            waiting[i] = {e[0] for e in (step.at, step.to) if e is not None}
    return file_ops, sorted(waiting)


def _replay(
    base: Disk | None, steps: Sequence[_Step], cut: dict[int, int], lost_names: set[int]
) -> Disk:
    """The disk after ``steps`` (on top of ``base``), with the writes in ``cut`` kept only to
    their length and the name changes in ``lost_names`` undone: a lost create leaves its
    file without a name, a lost rename keeps the old name, a lost unlink keeps the file. A
    file's data follows its inode whatever happens to its names."""
    tree = _Tree(base)
    contents = {i: bytearray(b) for i, b in base.inodes.items()} if base else {}
    for i, step in enumerate(steps):
        op = step.op
        if op.kind in ("write", "truncate"):
            keep = cut.get(i)
            if keep == 0 or (keep is not None and op.kind == "truncate"):
                continue
            _change(contents.setdefault(step.ino, bytearray()), op, keep)
        elif op.kind in ("fsync", "dirsync"):
            continue
        elif op.kind in ("create", "mkdir"):
            if op.kind == "create":
                contents.setdefault(step.ino, bytearray())
            else:
                tree.dirs.add(step.ino)
            if i not in lost_names and step.to is not None:
                tree.entries[step.to] = step.ino
        elif i in lost_names:
            continue
        elif op.kind in ("unlink", "rmdir"):
            if step.at is not None and tree.entries.get(step.at) == step.ino:
                del tree.entries[step.at]
        elif step.at is not None and step.to is not None:  # rename, link
            if op.kind == "rename" and tree.entries.get(step.at) == step.ino:
                del tree.entries[step.at]
            tree.entries[step.to] = step.ino
    return _view(tree, contents)


def _change(content: bytearray, op: FsOp, keep: int | None) -> None:
    if op.kind == "truncate":
        if len(content) > op.size:
            del content[op.size :]
        else:
            content.extend(bytes(op.size - len(content)))
        return
    data = op.data if keep is None else op.data[:keep]
    if len(content) < op.offset:
        content.extend(bytes(op.offset - len(content)))
    content[op.offset : op.offset + len(data)] = data


def _view(tree: _Tree, contents: dict[int, bytearray]) -> Disk:
    """What a walk from the root finds: directories and named files (an inode no entry
    reaches, like a file whose create was lost, is not part of it)."""
    disk = Disk(next_inode=tree.next)
    children: dict[int, list[tuple[str, int]]] = {}
    for (parent, name), ino in tree.entries.items():
        children.setdefault(parent, []).append((name, ino))
    todo = [(tree.root, "")]
    while todo:
        ino, path = todo.pop()
        for name, child in children.get(ino, ()):
            full = f"{path}/{name}" if path else name
            if child in tree.dirs:
                if full not in disk.dirs:
                    disk.dirs.add(full)
                    todo.append((child, full))
            else:
                disk.names[full] = child
                disk.inodes[child] = contents.setdefault(child, bytearray())
    return disk


def materialize(disk: Disk, root: str | os.PathLike[str]) -> None:
    """Write ``disk`` under the (empty or missing) directory ``root``."""
    base = os.fspath(root)
    for directory in sorted(disk.dirs, key=len):
        os.makedirs(os.path.join(base, directory), exist_ok=True)
    for name, content in disk.files().items():
        path = os.path.join(base, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(content)
