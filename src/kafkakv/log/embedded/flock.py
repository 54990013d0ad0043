"""File locks that give up: ``flock`` with a deadline, and who holds a lock.

Every lock of the embedded log (a partition's ``lock`` and ``clean.lock``, a transactional
id's lock) is taken with :func:`flock_until`. An uncontended lock costs one ``flock`` call with
``LOCK_NB``, the same as a blocking one. A contended one is polled with ``LOCK_NB`` after sleeps
that double from 0.1 ms to 2 ms, so a holder that is stopped (SIGSTOP, a debugger) or stuck
costs its waiters their timeout, never more.

The holder is found in ``/proc/locks`` by the lock file's inode, and only when a wait runs out:
a side file holding the writer's pid would cost a write on every append, and a process killed
while holding the lock would leave it stale. ``/proc/locks`` is the kernel's own record, right
by construction; it shows the pid of the process that took the lock (a child that inherited
the descriptor holds it too, and is not named).
"""

from __future__ import annotations

import fcntl
import os
import threading
import time

from kafkakv.errors import LockTimeoutError

__all__ = ["acquire_until", "flock_until", "lock_holder", "lock_timeout_error"]

_FIRST_SLEEP = 0.0001
_MAX_SLEEP = 0.002


def flock_until(fd: int, path: str, deadline: float, what: str) -> None:
    """Take an exclusive ``flock`` on ``fd`` (the open file ``path``) by ``deadline``.

    ``deadline`` is a :func:`time.monotonic` value; one already past still tries once.
    Raises :class:`~kafkakv.errors.LockTimeoutError` naming ``what``, the path and the holder.
    """
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return
    except BlockingIOError:
        pass
    start = time.monotonic()
    sleep = _FIRST_SLEEP
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise lock_timeout_error(what, path, time.monotonic() - start)
        time.sleep(min(sleep, remaining))
        sleep = min(sleep * 2, _MAX_SLEEP)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            continue


def acquire_until(lock: threading.Lock | threading.RLock, deadline: float) -> bool:
    """Acquire a thread lock by ``deadline`` (a :func:`time.monotonic` value); False when it
    could not be. An infinite deadline waits without limit."""
    wait = deadline - time.monotonic()
    if wait > threading.TIMEOUT_MAX:
        return lock.acquire()
    return lock.acquire(timeout=max(0.0, wait))


def lock_timeout_error(
    what: str, path: str, waited: float, *, thread_lock: bool = False
) -> LockTimeoutError:
    """The error for a wait on ``path`` that ran out, naming the process that holds it.

    ``thread_lock``: the wait was for the thread lock in front of the file lock, so a thread
    of this process has it; the holder named is still the process holding the file lock
    when there is one (the thread may itself be waiting for that process)."""
    pid = lock_holder(path)
    if pid is None and thread_lock:
        pid = os.getpid()
    if pid is None:
        who = "another process (its pid is unknown)"
    elif pid == os.getpid():
        who = f"another thread of this process ({pid})"
    else:
        who = f"process {pid}"
    return LockTimeoutError(
        f"gave up after {waited:.3g} s waiting for {what}: {path} is held by {who}",
        path=path,
        pid=pid,
    )


def lock_holder(path: str) -> int | None:
    """The pid of the process holding an exclusive ``flock`` on ``path``, from /proc/locks.

    None when it cannot be told: no /proc, the lock released meanwhile, or a holder outside
    this pid namespace (the kernel shows those as pid 0). Matches the inode, and the device
    too when one line does; reads /proc/locks once (it lists every lock on the machine).
    """
    try:
        st = os.stat(path)
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    same_inode: list[tuple[int, bool]] = []
    for line in lines:
        # "1: FLOCK  ADVISORY  WRITE 5035 fe:00:9978225 0 EOF"; waiters have "->" after "1:"
        fields = line.split()
        if len(fields) < 6 or fields[1] != "FLOCK" or fields[3] != "WRITE":
            continue
        dev_ino = fields[5].split(":")
        if len(dev_ino) != 3 or not dev_ino[2].isdigit() or int(dev_ino[2]) != st.st_ino:
            continue
        try:
            pid = int(fields[4])
            same_dev = (int(dev_ino[0], 16), int(dev_ino[1], 16)) == (
                os.major(st.st_dev),
                os.minor(st.st_dev),
            )
        except ValueError:
            continue
        same_inode.append((pid, same_dev))
    exact = [pid for pid, same_dev in same_inode if same_dev]
    # Some filesystems (btrfs, overlayfs) report a device in stat() that /proc/locks does not
    # use: then an inode that only one lock line names is still taken as this file's.
    candidates = exact or ([same_inode[0][0]] if len(same_inode) == 1 else [])
    return candidates[0] if candidates and candidates[0] > 0 else None
