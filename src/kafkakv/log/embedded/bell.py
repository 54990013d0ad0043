"""Bells: how an append wakes the waiters of other open logs, and not those of its own.

A publish is a ``pwrite`` of the partition's head file, and inotify reports it to every
watcher of that file, the appending process's own included: a replica whose writer applies its
own updates was woken by each of them for nothing, and on a machine with few cores that
wake-up delays the processes that do need one. So waiters do not watch the head. Each open
log has a token (:func:`new_token`); the first time it publishes to a partition it creates
``bells/<token>`` in the partition's directory, and after every publish it writes one byte to
that file. A :class:`~kafkakv.log.embedded.notify.ChangeNotifier` watches the ``bells``
directory for new bells and every bell in it but its own log's; waiters of the appending log
are woken in the process (``ChangeNotifier.poke``). The head stays the one source of truth:
a bell only says "look again".

While its log has it open a bell is held with a shared ``flock``, which the system drops
when the process dies. Whoever creates a bell first removes the bells nobody holds any more
(:func:`sweep`). Creating and sweeping both happen under the partition lock, so a sweep never
sees a bell between its creation and its lock.

Bells are not the log's data: they are made with :mod:`os` directly, not through
:mod:`~kafkakv.log.embedded.fs`, whose recorders build the disks a crash may leave.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import uuid

__all__ = ["BELLS", "Bell", "new_token", "sweep"]

log = logging.getLogger("kafkakv.log")

BELLS = "bells"  #: the directory of bells in each partition's directory
_RING = b"\1"


def new_token() -> str:
    """A name for one open log's bells, unique across processes and time."""
    return f"{os.getpid()}-{uuid.uuid4().hex[:16]}"


def sweep(bells_dir: str, keep: str) -> list[str]:
    """Remove the bells in ``bells_dir`` that no open log holds (their process died without
    closing), except ``keep``; return their names. The caller holds the partition lock."""
    removed = []
    for name in os.listdir(bells_dir):
        if name == keep:
            continue
        path = os.path.join(bells_dir, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue  # gone already, or not ours to judge
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # held: its log is open
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            removed.append(name)
        finally:
            os.close(fd)
    return removed


class Bell:
    """One open log's bell in one partition: made on the first publish, rung after each."""

    def __init__(self, partition_dir: str, token: str, file_mode: int, dir_mode: int) -> None:
        self.dir = os.path.join(partition_dir, BELLS)
        self.path = os.path.join(self.dir, token)
        self.fd = -1
        self._token = token
        self._modes = file_mode, dir_mode
        self._pid = 0  # the process that made it: a forked child never removes it
        self._failed = False

    def make_locked(self) -> None:
        """Create the bell if it is not there yet (the partition lock held). When it cannot be
        made, say so once: waiters elsewhere then learn of this log's appends only when they
        look again on their own (within a second), not at once."""
        if self.fd >= 0 or self._failed:
            return
        file_mode, dir_mode = self._modes
        fd = -1
        try:
            os.makedirs(self.dir, dir_mode, exist_ok=True)
            sweep(self.dir, self._token)
            fd = os.open(
                self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, file_mode
            )
            fcntl.flock(fd, fcntl.LOCK_SH)
        except OSError as exc:
            if fd >= 0:
                os.close(fd)
            self._failed = True
            log.warning(
                "cannot make %s (%s): other processes will see this log's appends late",
                self.path,
                exc,
            )
            return
        self.fd, self._pid = fd, os.getpid()

    def ring(self) -> None:
        """Tell every other log watching the partition to look at its head again."""
        if self.fd >= 0:
            try:  # noqa: SIM105 (contextlib.suppress costs three calls on every append)
                os.pwrite(self.fd, _RING, 0)
            except OSError:  # a missed ring is a late wake-up, not a loss
                pass

    def close(self) -> None:
        if self.fd < 0:
            return
        if self._pid == os.getpid():
            with contextlib.suppress(OSError):
                os.unlink(self.path)
        os.close(self.fd)
        self.fd = -1
