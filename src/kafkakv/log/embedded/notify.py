"""Wake-ups when a partition gets new records.

Appends of other open logs (other processes, mostly) arrive through inotify: after every
publish a log rings its bell in the partition's ``bells`` directory (see
:mod:`~kafkakv.log.embedded.bell`), and a notifier watches that directory for new bells and
every bell in it but its own log's. Appends of the notifier's own log wake its waiters in the
process (:meth:`ChangeNotifier.poke`), except waiters deaf to the append's origin: a replica's
follower is not woken by the updates its writers apply themselves. So no process is woken by
the kernel for its own appends. Where a partition's bells cannot be made or watched, its head
file is watched instead, as before bells: every publish to it wakes, its own included.

:meth:`ChangeNotifier.wait_for_any` sleeps until an event arrives (then re-checks the caller's
condition) or the timeout passes. There is no thread of its own: of the threads waiting at a
time, one reads the inotify descriptor itself (it sleeps in ``poll``), counts the events and
wakes the others, which sleep on a condition; when it leaves, the next one takes over. So a
lone waiter, such as a replica's follower, is woken by the kernel directly, with no hand-off
between threads. Bursts are coalesced; see docs/embedded-log.md. Where inotify is unavailable
(not Linux, or the per-user instance limit is reached) waiting falls back to polling every
millisecond.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import math
import os
import select
import struct
import threading
import time
from collections.abc import Callable, Sequence

from kafkakv.log.embedded.bell import BELLS

__all__ = ["ChangeNotifier"]

_IN_MODIFY = 0x00000002
_IN_MOVED_TO = 0x00000080
_IN_CREATE = 0x00000100
_IN_Q_OVERFLOW = 0x00004000
_IN_IGNORED = 0x00008000
_IN_ONLYDIR = 0x01000000
_ONE_MODIFY = _IN_MODIFY.to_bytes(4, "little")  # the mask of a lone bell's ring, as read
_IN_NONBLOCK = 0o4000
_IN_CLOEXEC = 0o2000000
_CLOSE_LOOK_S = 0.1
"""How often ``close()`` looks whether the reading waiter left, should its wake-up be lost."""
_EVENT = struct.Struct("iIII")
_POLL_S = 0.001
_COALESCE_S = 0.0005  # events closer together than this are delivered together
_SLICE_S = 1.0  # a waiter re-checks its condition at least this often


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """The C library, once per process: ``find_library`` runs ``ldconfig`` (a fork and exec,
    which took 2-9 ms of every log's open, more in a large process such as a Spark worker)."""
    name = ctypes.util.find_library("c")
    try:
        lib = ctypes.CDLL(name or "libc.so.6", use_errno=True)
        lib.inotify_init1.argtypes = [ctypes.c_int]
        lib.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        return lib
    except (OSError, AttributeError):
        return None


class ChangeNotifier:
    """Per-log watcher of partitions: of other logs' bells, and of its own log's appends.

    ``token`` names this log's own bells (never watched); ``dir_mode`` is the mode of a
    ``bells`` directory this notifier creates."""

    def __init__(self, token: str = "", dir_mode: int = 0o755) -> None:
        # Held as the plain lock (a C-level ``with``) and waited on through the condition.
        self._mutex = threading.Lock()
        self._cond = threading.Condition(self._mutex)
        self._total = 0  # moves on every batch of events; what waiters compare
        self._reading = False  # a waiter is reading the descriptor (guarded by _mutex)
        self._sleepers = 0  # waiters asleep on _cond, whom a reader must wake (guarded too)
        self._poked = False  # a poke woke the reading waiter through the pipe (guarded too)
        self._last_event = 0.0  # monotonic time of the last batch of events
        self._token = token
        self._dir_mode = dir_mode
        # All guarded by _mutex: the head paths watched (through their bells, or themselves),
        # the watched bells directories (with their head path) and other logs' bells.
        self._watched: set[str] = set()
        self._dirs: dict[int, tuple[str, str]] = {}
        self._bells: dict[int, str] = {}
        self.waiting: dict[int, tuple[frozenset[str], object]] = {}
        """The waiters now: (head paths, origin they are deaf to) by id (guarded by _mutex).
        Empty when nobody waits: an append then skips :meth:`poke`."""
        self._fd = -1
        self._wake_r, self._wake_w = -1, -1
        self._poller: select.poll | None = None
        self._closed = False
        self._libc = _libc()
        if self._libc is not None:
            fd = self._libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
            if fd >= 0:
                self._fd = fd
                self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
                self._poller = select.poll()
                self._poller.register(fd, select.POLLIN)
                self._poller.register(self._wake_r, select.POLLIN)  # pokes and close()

    @property
    def uses_inotify(self) -> bool:
        return self._fd >= 0

    def watches(self) -> tuple[int, int]:
        """How many bells directories and other logs' bells are watched (for tests)."""
        with self._mutex:
            return len(self._dirs), len(self._bells)

    # -- watches (all with _mutex held) ---------------------------------------------------
    def _add(self, path: str, mask: int) -> int:
        assert self._libc is not None
        return int(self._libc.inotify_add_watch(self._fd, os.fsencode(path), mask))

    def _watch(self, head_path: str) -> bool:
        """Make sure the partition of ``head_path`` is watched; False when it cannot be (then
        poll)."""
        if self._fd < 0 or self._libc is None or self._closed:
            return False
        if head_path in self._watched:
            return True
        if not self._watch_bells(head_path) and self._add(head_path, _IN_MODIFY) < 0:
            return False
        self._watched.add(head_path)
        return True

    def _watch_bells(self, head_path: str) -> bool:
        """Watch the partition's bells directory (made if missing), then every bell in it: a
        bell made after the listing is reported by the directory's watch."""
        bells = os.path.join(os.path.dirname(head_path), BELLS)
        try:
            os.makedirs(bells, self._dir_mode, exist_ok=True)
        except OSError:
            return False  # no right to make it, say: watch the head
        wd = self._add(bells, _IN_CREATE | _IN_MOVED_TO | _IN_ONLYDIR)
        if wd < 0:
            return False
        self._dirs[wd] = (bells, head_path)
        return self._scan(bells, head_path)

    def _scan(self, bells: str, head_path: str) -> bool:
        try:
            names = os.listdir(bells)
        except OSError:
            return False
        for name in names:
            self._watch_bell(bells, name, head_path)
        return True

    def _watch_bell(self, bells: str, name: str, head_path: str) -> None:
        if name == self._token:
            return  # this log's own appends wake its waiters in the process (poke)
        wd = self._add(os.path.join(bells, name), _IN_MODIFY)
        if wd >= 0:
            self._bells[wd] = name
        elif ctypes.get_errno() != errno.ENOENT:
            # Out of watches, say: hear the partition through its head, own appends included.
            self._add(head_path, _IN_MODIFY)

    def _take(self, events: bytes) -> None:
        """Keep the watches in step with ``events``: watch new bells, forget removed ones, and
        look at every bells directory again when the kernel dropped events."""
        pos = 0
        while pos + _EVENT.size <= len(events):
            wd, mask, _cookie, size = _EVENT.unpack_from(events, pos)
            name = os.fsdecode(events[pos + _EVENT.size : pos + _EVENT.size + size].rstrip(b"\0"))
            pos += _EVENT.size + size
            if mask & _IN_Q_OVERFLOW:
                for bells, head_path in list(self._dirs.values()):
                    self._scan(bells, head_path)
            elif wd in self._dirs:
                bells, head_path = self._dirs[wd]
                if mask & _IN_IGNORED:  # the partition was deleted: watch anew if re-made
                    del self._dirs[wd]
                    self._watched.discard(head_path)
                elif name:
                    self._watch_bell(bells, name, head_path)
            elif mask & _IN_IGNORED:
                self._bells.pop(wd, None)

    # -- waiting ------------------------------------------------------------------------
    def wait_for(self, head_path: str, ready: Callable[[], bool], timeout: float | None) -> bool:
        """Return True once ``ready()`` holds, False when ``timeout`` seconds pass first."""
        return self.wait_for_any([head_path], ready, timeout)

    def wait_for_any(
        self,
        head_paths: Sequence[str],
        ready: Callable[[], bool],
        timeout: float | None,
        deaf_to: object = None,
    ) -> bool:
        """Like :meth:`wait_for`, woken by a publish to any of ``head_paths``; not by this log's
        appends made for ``deaf_to`` (when not None), which their maker applies itself: then
        ``ready()`` may hold a while before this returns, at the latest by ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        me = (frozenset(head_paths), deaf_to)
        with self._mutex:
            watching = all([self._watch(path) for path in head_paths])
            self.waiting[id(me)] = me  # before ready(): an append after it pokes
        try:
            while True:
                seen = self._total  # an int read whole under the GIL; compared under _mutex
                if ready():
                    return True
                remaining = _SLICE_S if deadline is None else deadline - time.monotonic()
                if remaining <= 0:
                    return False
                if not watching or self._closed:
                    time.sleep(min(_POLL_S, remaining))
                    continue
                with self._mutex:
                    if self._total != seen:
                        continue  # events came while ready() ran: look again
                    if self._reading or self._closed:
                        self._sleepers += 1
                        try:
                            self._cond.wait(min(remaining, _SLICE_S if self._reading else _POLL_S))
                        finally:
                            self._sleepers -= 1
                        continue
                    self._reading = True
                self._read_events(min(remaining, _SLICE_S))
        finally:
            with self._mutex:
                del self.waiting[id(me)]

    def poke(self, head_path: str, origin: object) -> None:
        """After this log published to ``head_path`` for ``origin`` (None: for no one in
        particular): wake its waiters on that partition, unless each is deaf to ``origin``."""
        with self._mutex:
            for paths, deaf_to in self.waiting.values():
                if head_path in paths and (origin is None or deaf_to is not origin):
                    break
            else:
                return
            self._total += 1
            if self._sleepers:
                self._cond.notify_all()
            if self._reading and not self._poked and not self._closed:
                self._poked = True
                os.write(self._wake_w, b"p")  # the pipe is empty: _poked was False

    def _read_events(self, timeout: float) -> None:
        """As the reading waiter: sleep in ``poll`` until events arrive or ``timeout`` passes,
        count them, and wake the other waiters (one of them reads next)."""
        arrived = False
        try:
            # In a stream of events, let them gather: waiters wake about 2,000 times a second
            # at most, rather than once per append. The first event after a quiet spell is
            # not delayed.
            pause = self._last_event + _COALESCE_S - time.monotonic()
            if pause > 0:
                time.sleep(min(pause, timeout))
            assert self._poller is not None
            if self._poller.poll(math.ceil(timeout * 1000)) and not self._closed:
                try:
                    events = os.read(self._fd, 65536)
                except BlockingIOError:  # a poke, or another reader took them (no contextlib)
                    events = b""
                if events:
                    arrived = True
                    # A ring of one bell is one bare event: nothing to keep in step.
                    if len(events) != _EVENT.size or events[4:8] != _ONE_MODIFY:
                        with self._mutex:
                            self._take(events)
        finally:
            # The path of every wake-up: kept to the fewest calls (a lone waiter, such as a
            # replica's follower, wakes no one).
            with self._mutex:
                self._reading = False
                if self._poked:
                    self._poked = False
                    os.read(self._wake_r, 16)  # the one byte poke() wrote
                    arrived = True
                if arrived:
                    self._total += 1
                    self._last_event = time.monotonic()
                if self._sleepers:
                    self._cond.notify_all()

    def close(self) -> None:
        """Wake every waiter and release the descriptors (once the reading waiter left)."""
        with self._mutex:
            if self._closed:
                return
            self._closed = True
            if self._wake_w >= 0:
                os.write(self._wake_w, b"x")  # interrupts the reading waiter's poll
            self._cond.notify_all()
            deadline = time.monotonic() + 2
            self._sleepers += 1  # the reading waiter wakes this one as it leaves
            while self._reading and time.monotonic() < deadline:
                self._cond.wait(_CLOSE_LOOK_S)
            self._sleepers -= 1
            self._dirs.clear()
            self._bells.clear()
            self._watched.clear()
        for fd in (self._fd, self._wake_r, self._wake_w):
            if fd >= 0:
                os.close(fd)
        self._fd = self._wake_r = self._wake_w = -1
