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


def _parent(path: str) -> str:
    return path.rsplit("/", 1)[0] if "/" in path else ""


def _apply(disk: Disk, op: FsOp, keep: int | None = None) -> None:
    """Apply ``op`` to ``disk``; for a write, ``keep`` bytes of it only."""
    if op.kind == "mkdir":
        disk.dirs.add(op.path)
    elif op.kind == "rmdir":
        disk.dirs.discard(op.path)
    elif op.kind == "create":
        if op.path not in disk.names:
            disk.names[op.path] = disk.next_inode
            disk.inodes[disk.next_inode] = bytearray()
            disk.next_inode += 1
    elif op.kind == "write":
        data = op.data if keep is None else op.data[:keep]
        content = disk.inodes[disk.names[op.path]]
        end = op.offset + len(data)
        if len(content) < op.offset:
            content.extend(bytes(op.offset - len(content)))
        content[op.offset : end] = data
    elif op.kind == "truncate":
        content = disk.inodes[disk.names[op.path]]
        if len(content) > op.size:
            del content[op.size :]
        else:
            content.extend(bytes(op.size - len(content)))
    elif op.kind == "rename" and op.path in disk.dirs:
        _rename_dir(disk.dirs, disk.names, op.path, op.dest)
    elif op.kind == "rename":
        disk.names[op.dest] = disk.names.pop(op.path)
    elif op.kind == "link":
        disk.names[op.dest] = disk.names[op.path]
    elif op.kind == "unlink":
        disk.names.pop(op.path, None)
    elif op.kind not in ("fsync", "dirsync"):
        raise ValueError(f"unknown file-system op {op.kind!r}")


def _rename_dir(dirs: set[str], names: dict[str, int], old: str, new: str) -> None:
    """Move the directory ``old`` (with everything under it) to ``new``."""
    for d in [d for d in dirs if d == old or d.startswith(old + "/")]:
        dirs.discard(d)
        dirs.add(new + d[len(old) :])
    for n in [n for n in names if n.startswith(old + "/")]:
        names[new + n[len(old) :]] = names.pop(n)


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
    for k in range(len(ops) + 1):
        prefix = ops[:k]
        yield f"prefix {k}", _replay(base, prefix, {}, set())
        writes, names = _unsynced(base, prefix)
        for indexes in writes.values():
            for i in indexes:
                op = prefix[i]
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
            op = prefix[i]
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


def _unsynced(base: Disk | None, prefix: Sequence[FsOp]) -> tuple[dict[int, list[int]], list[int]]:
    """Indexes of the writes and truncates after each file's last sync (by inode, in order),
    and of the name changes after their directory's last sync."""
    file_ops: dict[int, list[int]] = {}
    names: list[int] = []
    dirs = set(base.dirs) if base else {""}
    inode_of = dict(base.names) if base else {}  # each name's file, as the ops go
    fresh = base.next_inode if base else 0
    for i, op in enumerate(prefix):
        if op.kind in ("write", "truncate"):
            if op.path in inode_of:
                file_ops.setdefault(inode_of[op.path], []).append(i)
        elif op.kind == "fsync":
            file_ops.pop(inode_of.get(op.path, -1), None)
        elif op.kind == "dirsync":
            names = [j for j in names if not _in_dir(prefix[j], op.path)]
        elif op.kind in ("create", "mkdir", "rmdir", "rename", "link", "unlink"):
            names.append(i)
            if op.kind == "create" and op.path not in inode_of:
                inode_of[op.path] = fresh
                fresh += 1
            elif op.kind == "mkdir":
                dirs.add(op.path)
            elif op.kind == "rename" and op.path in dirs:
                _rename_dir(dirs, inode_of, op.path, op.dest)
            elif op.kind == "rename" and op.path in inode_of:
                inode_of[op.dest] = inode_of.pop(op.path)
            elif op.kind == "link" and op.path in inode_of:
                inode_of[op.dest] = inode_of[op.path]
            elif op.kind == "unlink":
                inode_of.pop(op.path, None)
    return file_ops, names


def _in_dir(op: FsOp, directory: str) -> bool:
    """Whether a directory sync of ``directory`` makes ``op``'s name change durable."""
    parents = {_parent(op.path)} | ({_parent(op.dest)} if op.kind == "rename" else set())
    return parents <= {directory}


def _replay(
    base: Disk | None, prefix: Sequence[FsOp], cut: dict[int, int], lost_names: set[int]
) -> Disk:
    """The disk after ``prefix`` (on top of ``base``), with the writes in ``cut`` kept only to
    their length and the name changes in ``lost_names`` undone (a lost create leaves no file;
    a lost rename keeps the old name; a lost unlink keeps the file). An op on a name that is
    not there (its create, or its directory's, was lost) does nothing."""
    disk = base.copy() if base else Disk()
    for i, op in enumerate(prefix):
        if i in lost_names or _parent(op.path) not in disk.dirs:
            continue
        if op.kind in ("rename", "link") and _parent(op.dest) not in disk.dirs:
            continue
        if i in cut:
            if op.kind == "write" and cut[i] > 0 and op.path in disk.names:
                _apply(disk, op, keep=cut[i])
            continue
        exists = op.path in disk.names or (op.kind == "rename" and op.path in disk.dirs)
        if not exists and op.kind in ("write", "truncate", "rename", "link"):
            continue
        _apply(disk, op)
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
