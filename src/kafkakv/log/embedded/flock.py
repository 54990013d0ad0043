"""File locks that give up: ``flock`` with a deadline, and who holds a lock.

Every lock of the embedded log (a partition's ``lock`` and ``clean.lock``, a transactional
id's lock) is taken with :func:`flock_until`. An uncontended lock costs one ``flock`` call with
``LOCK_NB``. A contended one is waited for in the kernel's queue: a helper thread opens the
lock file again and blocks in ``flock``, and the caller waits for that thread until its
deadline. The kernel wakes a blocked waiter the moment the lock is released; polling with ``LOCK_NB``
(what this module did before) found it free only when a poll fell in the microseconds between
a release and the holder's next take. Not fair all the same: the woken waiter still races a
holder that takes the lock again at once (docs/embedded-log.md has the figures). A wait that runs out leaves its thread blocked: when it gets the lock
later it releases it at once, on its own descriptor, touching nothing of the caller's.

So a contended wait ends holding the lock on a *new* descriptor of the same file, which
:func:`flock_until` returns; the caller releases the lock with :func:`unflock`, which closes
that descriptor too. A holder that is stopped (SIGSTOP, a debugger) or stuck costs its waiters
their timeout, never more.

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

__all__ = ["acquire_until", "flock_until", "lock_holder", "lock_timeout_error", "unflock"]

_GUARD = threading.Lock()  # a waiter's hand-over: got the lock, or nobody wants it any more


class _Waiter:
    """A thread blocked in ``flock`` on its own descriptor of a lock file."""

    def __init__(self, path: str):
        self.path = path
        self.done = threading.Event()
        self.fd: int | None = None  # the descriptor holding the lock, once it is held
        self.error: OSError | None = None
        self.abandoned = False
        threading.Thread(target=self._wait, name="kafkakv-flock-wait", daemon=True).start()

    def _wait(self) -> None:
        fd = -1
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as exc:
            if fd >= 0:
                os.close(fd)
            self.error = exc
            self.done.set()
            return
        with _GUARD:
            if not self.abandoned:
                self.fd = fd
                self.done.set()
                return
        unflock(fd, -1)  # the wait ran out before: release it at once


def flock_until(fd: int, path: str, deadline: float, what: str) -> int:
    """Take an exclusive ``flock`` on the lock file ``path`` (open as ``fd``) by ``deadline``.

    Returns the descriptor that holds the lock: ``fd`` when it was free, else a new one of
    ``path`` (see the module docstring). Release it with :func:`unflock`. ``deadline`` is a
    :func:`time.monotonic` value; one already past still tries once. Raises
    :class:`~kafkakv.errors.LockTimeoutError` naming ``what``, the path and the holder.
    """
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd
    except BlockingIOError:
        pass
    start = time.monotonic()
    if deadline - start <= 0:
        raise lock_timeout_error(what, path, 0.0)
    waiter = _Waiter(path)
    waiter.done.wait(min(deadline - start, threading.TIMEOUT_MAX))
    with _GUARD:
        if waiter.fd is not None:
            return waiter.fd
        waiter.abandoned = True
    if waiter.error is not None:
        raise waiter.error
    raise lock_timeout_error(what, path, time.monotonic() - start)


def unflock(held: int, fd: int) -> None:
    """Release a lock :func:`flock_until` returned as ``held`` for the descriptor ``fd``
    (closing ``held`` when it is a waiter's own).

    Always an explicit ``LOCK_UN``: closing a descriptor releases its ``flock`` only when no
    other descriptor shares the open file, and a child forked while the lock was held shares
    it. Closing alone left such a lock held for as long as the child lived, and the parent's
    next flush and the child's own waited on it forever."""
    fcntl.flock(held, fcntl.LOCK_UN)
    if held != fd:
        os.close(held)


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
