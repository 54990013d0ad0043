"""Record the file-system effects of the embedded log, through its layer ``log/embedded/fs.py``.

>>> import tempfile
>>> from kafkakv.log.embedded.log import EmbeddedLog
>>> with tempfile.TemporaryDirectory() as root:
...     with Recorder(root) as rec:
...         EmbeddedLog(root).close()
>>> [(op.kind, op.data) for op in rec.ops[:2]]  # the log's marker file, written aside first
[('create', b''), ('write', b'{"format": 2}')]

While a :class:`Recorder` is entered, every name of :mod:`kafkakv.log.embedded.fs` is
rebound to a wrapper that does the real call and then notes it as a
:class:`~tests.log.crash_states.FsOp`, with its path relative to ``root``. Effects outside
``root`` are done and not noted. A lock makes the call and its note one step, so the
recording is in the order the effects reached the file system, whichever thread made them.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from kafkakv.log.embedded import fs
from tests.log.crash_states import FsOp

__all__ = ["Recorder"]


class Recorder:
    def __init__(self, root: str | os.PathLike[str]):
        self.root = os.path.realpath(root)
        self.ops: list[FsOp] = []
        self._fds: dict[int, tuple[str, bool, bool]] = {}  # fd -> (path, is a dir, O_APPEND)
        self._lock = threading.RLock()
        self._saved: dict[str, Callable[..., Any]] = {}

    def mark(self) -> int:
        """How many effects are recorded so far: a crash state with at least this many ops
        holds everything done before this call."""
        with self._lock:
            return len(self.ops)

    # -- installing -------------------------------------------------------------------
    def __enter__(self) -> Recorder:
        for name in ("open", "close", "dup", "pwrite", "pwritev", "write", "fsync", "fdatasync"):
            self._wrap(name)
        for name in ("ftruncate", "fallocate", "rename", "replace", "link", "unlink"):
            self._wrap(name)
        for name in ("makedirs", "rmtree"):
            self._wrap(name)
        return self

    def __exit__(self, *exc: object) -> None:
        for name, real in self._saved.items():
            setattr(fs, name, real)
        self._saved.clear()

    def _wrap(self, name: str) -> None:
        real = getattr(fs, name)
        self._saved[name] = real
        handler = getattr(self, f"_{name}")

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                return handler(real, *args, **kwargs)

        setattr(fs, name, wrapper)

    def _rel(self, path: str | os.PathLike[str]) -> str | None:
        """``path`` relative to the root with ``/``, or None outside it."""
        full = os.path.abspath(os.fspath(path))
        full = os.path.join(os.path.realpath(os.path.dirname(full)), os.path.basename(full))
        if full == self.root:
            return ""
        if not full.startswith(self.root + os.sep):
            return None
        return full[len(self.root) + 1 :]

    def _note(self, kind: str, path: str, **fields: Any) -> None:
        self.ops.append(FsOp(kind, path, **fields))

    # -- the effects --------------------------------------------------------------------
    def _open(self, real: Callable[..., int], path: str, flags: int, *args: Any) -> int:
        rel = self._rel(path)
        existed = os.path.lexists(path)
        fd = real(path, flags, *args)
        if rel is not None:
            is_dir = os.path.isdir(path)
            if not existed and flags & os.O_CREAT:
                self._note("create", rel)
            elif flags & os.O_TRUNC and not is_dir:
                self._note("truncate", rel, size=0)
            self._fds[fd] = (rel, is_dir, bool(flags & os.O_APPEND))
        return fd

    def _close(self, real: Callable[[int], None], fd: int) -> None:
        self._fds.pop(fd, None)
        real(fd)

    def _dup(self, real: Callable[[int], int], fd: int) -> int:
        new = real(fd)
        if fd in self._fds:
            self._fds[new] = self._fds[fd]
        return new

    def _pwrite(self, real: Callable[..., int], fd: int, data: bytes, offset: int) -> int:
        n = real(fd, data, offset)
        if fd in self._fds:
            self._note("write", self._fds[fd][0], offset=offset, data=bytes(data[:n]))
        return n

    def _pwritev(self, real: Callable[..., int], fd: int, buffers: list[bytes], offset: int) -> int:
        n = real(fd, buffers, offset)
        if fd in self._fds:  # one write of the buffers side by side, as the kernel makes it
            self._note("write", self._fds[fd][0], offset=offset, data=b"".join(buffers)[:n])
        return n

    def _write(self, real: Callable[..., int], fd: int, data: bytes) -> int:
        known = self._fds.get(fd)
        if known is None:
            return real(fd, data)
        offset = os.fstat(fd).st_size if known[2] else os.lseek(fd, 0, os.SEEK_CUR)
        n = real(fd, data)
        self._note("write", known[0], offset=offset, data=bytes(data[:n]))
        return n

    def _fsync(self, real: Callable[[int], None], fd: int) -> None:
        real(fd)
        if fd in self._fds:
            path, is_dir, _ = self._fds[fd]
            self._note("dirsync" if is_dir else "fsync", path)

    _fdatasync = _fsync  # the model treats them alike: the data, and the size it changed

    def _ftruncate(self, real: Callable[[int, int], None], fd: int, size: int) -> None:
        real(fd, size)
        if fd in self._fds:
            self._note("truncate", self._fds[fd][0], size=size)

    def _fallocate(self, real: Callable[[int, int, int], None], fd: int, at: int, n: int) -> None:
        """Noted as what it does to the file's content: a size that grows with zeros (a
        truncate upwards), durable at the next sync like any size change."""
        before = os.fstat(fd).st_size
        real(fd, at, n)
        if fd in self._fds and at + n > before:
            self._note("truncate", self._fds[fd][0], size=at + n)

    def _rename(self, real: Callable[..., None], src: str, dst: str) -> None:
        rel_src, rel_dst = self._rel(src), self._rel(dst)
        real(src, dst)
        if rel_src is not None and rel_dst is not None:
            self._note("rename", rel_src, dest=rel_dst)

    _replace = _rename

    def _link(self, real: Callable[..., None], src: str, dst: str) -> None:
        rel_src, rel_dst = self._rel(src), self._rel(dst)
        real(src, dst)
        if rel_src is not None and rel_dst is not None:
            self._note("link", rel_src, dest=rel_dst)

    def _unlink(self, real: Callable[[str], None], path: str) -> None:
        real(path)
        rel = self._rel(path)
        if rel is not None:
            self._note("unlink", rel)

    def _makedirs(self, real: Callable[..., None], path: str, *args: Any, **kwargs: Any) -> None:
        missing = []
        at = os.path.abspath(path)
        while not os.path.isdir(at):
            missing.append(at)
            at = os.path.dirname(at)
        real(path, *args, **kwargs)
        for made in reversed(missing):
            rel = self._rel(made)
            if rel is not None:
                self._note("mkdir", rel)

    def _rmtree(self, real: Callable[..., None], path: str, *args: Any, **kwargs: Any) -> None:
        gone: list[tuple[str, str]] = []
        for top, dirs, files in os.walk(path, topdown=False):
            gone += [("unlink", os.path.join(top, f)) for f in files]
            gone += [("rmdir", os.path.join(top, d)) for d in dirs]
        gone.append(("rmdir", path))
        real(path, *args, **kwargs)
        for kind, what in gone:
            rel = self._rel(what)
            if rel is not None and not os.path.lexists(what):
                self._note(kind, rel)
