"""Every change the embedded log makes to the file system goes through a name in this module.

The names are the :mod:`os` functions themselves, bound once at import: calling
``fs.pwrite`` costs what calling ``os.pwrite`` does, so production pays nothing for the
layer. Tests rebind them to recorders (``tests/log/fs_record.py``) and learn, in order, every
create, write, truncate (or preallocation), sync, rename and unlink a workload made; the crash-state explorer
(``tests/log/test_crash_explorer.py``) builds from that recording the disks a power loss may
leave behind.

One path makes its changes in C instead: the steady-state append
(:data:`kafkakv.log.embedded.frame.append_plain`), which writes the same bytes to the same
descriptors in the same order (the batch, an index entry when due, the head), with the same
``fdatasync`` and, when a write fails, ``ftruncate``. It runs only while ``fs.pwrite`` and
``fs.fdatasync`` are the :mod:`os` functions themselves: with a recorder in their place every
append takes the Python path, which goes through these names.

Reads are not effects and use :mod:`os` or :func:`open` directly. Descriptors a writer keeps
(a segment, its index, a head) come from :data:`open`, so a recorder can tell which file a
``pwrite`` or ``fdatasync`` on them touches. The helpers below are written in terms of the
names, never of :mod:`os`, so that what they do is recorded too.
"""

from __future__ import annotations

import os
import shutil

__all__ = [
    "close",
    "dup",
    "fallocate",
    "fdatasync",
    "fsync",
    "fsync_dir",
    "ftruncate",
    "link",
    "makedirs",
    "open",
    "pwrite",
    "pwritev",
    "rename",
    "replace",
    "replace_file",
    "rmtree",
    "unlink",
    "write",
    "write_all",
    "write_file",
]

open = os.open
close = os.close
dup = os.dup
pwrite = os.pwrite
pwritev = os.pwritev
write = os.write
fsync = os.fsync
fdatasync = os.fdatasync
fallocate = os.posix_fallocate
ftruncate = os.ftruncate
rename = os.rename
replace = os.replace
link = os.link
unlink = os.unlink
makedirs = os.makedirs
rmtree = shutil.rmtree

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
_WRITE_SIZE = 1 << 20


def write_all(fd: int, data: bytes | memoryview) -> None:
    """Write all of ``data`` at the descriptor's position (``write`` may write less)."""
    view = memoryview(data)
    while view:
        view = view[write(fd, view) :]


def write_file(path: str, chunks: list[bytes], mode: int, *, sync: bool) -> None:
    """Create (or truncate) ``path`` with ``mode`` (before the umask) holding ``chunks``;
    ``sync`` fsyncs it before closing."""
    fd = open(path, _CREATE, mode)
    try:
        pending: list[bytes] = []  # small chunks (one batch each) go out in 1 MiB writes
        size = 0
        for chunk in chunks:
            pending.append(chunk)
            size += len(chunk)
            if size >= _WRITE_SIZE:
                write_all(fd, b"".join(pending))
                pending, size = [], 0
        if pending:
            write_all(fd, b"".join(pending))
        if sync:
            fsync(fd)
    finally:
        close(fd)


def replace_file(path: str, data: bytes, mode: int, *, tmp: str) -> None:
    """Replace ``path`` atomically and durably with ``data``, written first to ``tmp`` (same
    directory): the content is synced before the rename and the directory after it, so after
    a power loss the name holds the old content or the new, whole."""
    write_file(tmp, [data], mode, sync=True)
    replace(tmp, path)
    fsync_dir(os.path.dirname(path) or ".")


def fsync_dir(directory: str) -> None:
    """Make the names in ``directory`` (creates, renames, unlinks) durable."""
    fd = open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fsync(fd)
    finally:
        close(fd)
