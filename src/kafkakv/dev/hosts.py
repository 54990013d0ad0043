"""Simulated hosts on this machine: a network namespace each, joined by a bridge, and the
faults a network between hosts has (Linux, as root; ``ip`` from iproute2, ``iptables``).

One :class:`Hosts` is one private network::

    <tag>-net        the bridge's namespace: bridge br0 and one veth port per host (p1, p2...)
    <tag>-<host>     each host's namespace: lo, and eth0 with the host's address (10.213.0.11...)

``<tag>`` is ``kkv-<uid>-<pid>-<n>``: the owner, the process that made the network, and a
count. No namespace has a default route and nothing is added to this process's own
namespace, so nothing sent to a host's address leaves its namespaces, and this process reaches
the hosts only through :meth:`Hosts.call` (a thread that enters one) or :meth:`Hosts.spawn`
(a program started in one). :meth:`Hosts.close` removes the namespaces after killing what
still runs in them; it runs at interpreter exit too, and :meth:`Hosts.start` first removes the
networks that dead processes of the same owner left (:func:`sweep`).

Faults, each undone by the :class:`Fault` it returns (``fault.heal()``, or the end of a
``with`` block), or all at once by :meth:`Hosts.heal`:

- :meth:`Hosts.isolate`: the host's link to the bridge goes down (nothing in or out);
- :meth:`Hosts.split`: two sides drop every packet from the other (iptables in each host);
- :meth:`Hosts.cut`: one direction only: the target drops what the source sends it;
- :meth:`Hosts.pause`: SIGSTOP of a process, SIGCONT when healed.

A broker is killed and restarted by its cluster (:meth:`~kafkakv.dev.DevCluster.kill`,
:meth:`~kafkakv.dev.DevCluster.start_node`); :meth:`Hosts.placement` puts a
:class:`~kafkakv.dev.DevCluster`'s nodes on hosts.

Example (not run as a doctest: it needs root)::

    with Hosts(["b1", "b2", "b3", "c1"]) as hosts:
        placement = hosts.placement(["b1", "b2", "b3"], clients="c1")
        with DevCluster(3, 19092, state_dir, placement=placement) as cluster:
            worker = hosts.spawn("c1", [sys.executable, "-m", "app", cluster.bootstrap], log)
            with hosts.isolate("b2"):
                ...
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import enum
import ipaddress
import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self, TypeVar

from kafkakv.dev.errors import HostsError
from kafkakv.dev.process import dies_with_parent, launch

__all__ = [
    "DEFAULT_SUBNET",
    "Fault",
    "HostPlacement",
    "Hosts",
    "HostsStatus",
    "enter_namespace",
    "sweep",
]

DEFAULT_SUBNET = "10.213.0.0/24"
"""The addresses of a network's hosts: host ``i`` (from 1, in the order given) is ``.10 + i``.
Every network has its own bridge, so two networks with the same subnet never meet."""

_PREFIX = "kkv"
_NAME = re.compile(r"[a-z][a-z0-9]{0,9}")
_TAG = re.compile(rf"^{_PREFIX}-(\d+)-(\d+)-(\d+)-")
_NETNS_DIR = Path("/run/netns")
_CLONE_NEWNET = 0x40000000
_COMMAND_TIMEOUT_S = 30.0
_LINK_WAIT_S = 5.0
_T = TypeVar("_T")
_counter = itertools.count(1)


class HostsStatus(enum.Enum):
    """Where a :class:`Hosts` is in its life."""

    NEW = "new"
    RUNNING = "running"
    CLOSED = "closed"


class Fault:
    """One fault in force; :meth:`heal` undoes it (once; later calls do nothing). A context
    manager: the fault is healed at the end of the ``with`` block."""

    def __init__(self, what: str, undo: Callable[[], None]) -> None:
        self.what = what
        self._undo: Callable[[], None] | None = undo
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        state = "healed" if self.healed else "in force"
        return f"<Fault {self.what} ({state})>"

    @property
    def healed(self) -> bool:
        """Whether :meth:`heal` has run."""
        return self._undo is None

    def heal(self) -> None:
        """Undo the fault. Raises :class:`~kafkakv.dev.errors.HostsError` when a command that
        undoes it fails."""
        with self._lock:
            undo, self._undo = self._undo, None
        if undo is not None:
            undo()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.heal()


class Hosts:
    """A private network of simulated hosts named ``names`` (lower-case letters and digits,
    up to 10 characters, the first a letter), with addresses from ``subnet``.

    Nothing exists until :meth:`start` (or ``with Hosts(...) as hosts``); :meth:`close` removes
    it all. Needs root, ``ip`` and, for :meth:`split` and :meth:`cut`, ``iptables``: a missing
    one raises :class:`~kafkakv.dev.errors.HostsError` saying so.
    """

    def __init__(self, names: Iterable[str], *, subnet: str = DEFAULT_SUBNET) -> None:
        self.names: tuple[str, ...] = tuple(names)
        bad = [n for n in self.names if not _NAME.fullmatch(n)]
        if bad or not self.names or len(set(self.names)) != len(self.names):
            raise HostsError(
                f"host names must be distinct, lower-case letters and digits, at most 10 "
                f"characters, starting with a letter: {list(self.names)}"
            )
        network = ipaddress.IPv4Network(subnet)
        if network.num_addresses < len(self.names) + 12:
            raise HostsError(f"subnet {subnet} is too small for {len(self.names)} hosts")
        self.prefix_length = network.prefixlen
        self._addresses = {
            name: str(network.network_address + 10 + i) for i, name in enumerate(self.names, 1)
        }
        self.tag = f"{_PREFIX}-{os.getuid()}-{os.getpid()}-{next(_counter)}"
        self._made: list[str] = []  # namespaces made, in order (removed in reverse)
        self._faults: list[Fault] = []
        self._lock = threading.Lock()
        self._status = HostsStatus.NEW
        self._finalizer = weakref.finalize(self, _remove_namespaces, self._made)

    def __repr__(self) -> str:
        return f"Hosts({list(self.names)!r}, {self.tag}, {self._status.value})"

    # -- what it is -------------------------------------------------------------------------

    @property
    def status(self) -> HostsStatus:
        """NEW, RUNNING or CLOSED."""
        return self._status

    def address(self, name: str) -> str:
        """The IPv4 address of host ``name``."""
        return self._addresses[self._check(name)]

    def namespace(self, name: str) -> str:
        """The name of host ``name``'s network namespace (``ip netns exec <it> ...``)."""
        return f"{self.tag}-{self._check(name)}"

    @property
    def bridge_namespace(self) -> str:
        """The namespace that holds the bridge every host is plugged into."""
        return f"{self.tag}-net"

    def _port(self, name: str) -> str:
        return f"p{self.names.index(self._check(name)) + 1}"

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> Self:
        """Remove what dead runs of this owner left (:func:`sweep`), then make the bridge's
        namespace, every host's namespace and their links. About 0.1 s for a few hosts.

        Raises :class:`~kafkakv.dev.errors.HostsError` when not root, when ``ip`` is missing
        or a command fails; what this call made is removed before it raises.
        """
        if self._status is not HostsStatus.NEW:
            raise HostsError(f"{self!r} cannot start again")
        if os.geteuid() != 0:
            raise HostsError("simulated hosts need root (network namespaces, veth, a bridge)")
        _tool("ip")
        sweep()
        self._status = HostsStatus.RUNNING
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def _build(self) -> None:
        net = self.bridge_namespace
        spaces = [net, *(self.namespace(n) for n in self.names)]
        self._made.extend(spaces)  # before they exist: a half-made network is removed too
        commands = [f"netns add {space}" for space in spaces]
        commands += [
            f"link add {self._port(n)} netns {net} type veth peer name eth0 netns "
            f"{self.namespace(n)}"
            for n in self.names
        ]
        _ip_batch(commands)
        bridge = ["link set lo up", "link add br0 type bridge", "link set br0 up"]
        for n in self.names:
            bridge += [f"link set {self._port(n)} master br0", f"link set {self._port(n)} up"]
        _ip_batch(bridge, namespace=net)
        for n in self.names:
            _ip_batch(
                [
                    "link set lo up",
                    f"addr add {self.address(n)}/{self.prefix_length} dev eth0",
                    "link set eth0 up",
                ],
                namespace=self.namespace(n),
            )

    def close(self) -> None:
        """Heal every fault (so no paused process stays stopped), kill every process that
        runs in a host (SIGKILL) and remove every namespace. Idempotent; also runs at
        interpreter exit."""
        with self._lock:
            if self._status is HostsStatus.CLOSED:
                return
            self._status = HostsStatus.CLOSED
            faults, self._faults = self._faults, []
        for fault in faults:
            with contextlib.suppress(HostsError):
                fault.heal()
        self._finalizer()

    def __enter__(self) -> Self:
        if self._status is HostsStatus.NEW:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- running things in a host -----------------------------------------------------------

    def command(self, name: str, argv: Sequence[str]) -> list[str]:
        """``argv`` made to run in host ``name``: ``ip netns exec <namespace> argv...`` (which
        execs ``argv`` in the same process: its pid is the program's)."""
        return ["ip", "netns", "exec", self.namespace(name), *argv]

    def spawn(
        self,
        name: str,
        argv: Sequence[str],
        output: Path | None = None,
        *,
        env: Mapping[str, str] | None = None,
        stdout: int | None = None,
        stdin: int | None = subprocess.DEVNULL,
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` in host ``name``, its output appended to ``output`` (or to
        ``stdout``: e.g. ``subprocess.PIPE``; neither: this process's own), with ``env`` (or
        this process's environment), its input ``stdin`` (nothing; ``subprocess.PIPE`` to
        talk to it). The kernel kills it when this process ends (``PR_SET_PDEATHSIG``, see
        :func:`~kafkakv.dev.process.launch`), and :meth:`close` kills it anyway.

        Raises :class:`~kafkakv.dev.errors.HostsError` when the program cannot be started.
        """
        self._check_running()
        with contextlib.ExitStack() as stack:
            out = stdout
            if output is not None:
                out = stack.enter_context(open(output, "ab")).fileno()
            try:
                return launch(
                    self.command(name, dies_with_parent(argv)),
                    stdin=stdin,
                    stdout=out,
                    stderr=subprocess.STDOUT if out is not None else None,
                    env=None if env is None else dict(env),
                    close_fds=True,
                )
            except OSError as exc:
                raise HostsError(f"cannot start {argv[0]} in host {name}: {exc}") from exc

    def python(
        self,
        name: str,
        args: Sequence[str],
        output: Path | None = None,
        *,
        env: Mapping[str, str] | None = None,
        stdout: int | None = None,
        stdin: int | None = subprocess.DEVNULL,
    ) -> subprocess.Popen[bytes]:
        """This interpreter (``sys.executable``) run with ``args`` in host ``name`` (``["-c",
        code]``, ``["-m", module, ...]``); see :meth:`spawn`."""
        return self.spawn(
            name, [sys.executable, *args], output, env=env, stdout=stdout, stdin=stdin
        )

    def call(self, name: str, fn: Callable[[], _T], timeout: float | None = None) -> _T:
        """``fn()`` run by a new thread that entered host ``name``'s network namespace: the
        sockets it opens, and the threads it starts (librdkafka's among them), live there, and
        keep working when other threads use them. Returns what ``fn`` returns, raises what it
        raises; :class:`~kafkakv.dev.errors.HostsError` when ``timeout`` passes first."""
        self._check_running()
        path = _NETNS_DIR / self.namespace(name)
        future: concurrent.futures.Future[_T] = concurrent.futures.Future()

        def run() -> None:
            try:
                enter_namespace(path)
                future.set_result(fn())
            except BaseException as exc:  # handed to the caller
                future.set_exception(exc)

        threading.Thread(target=run, name=f"kafkakv-host-{name}", daemon=True).start()
        # (not future.result(timeout): its TimeoutError is the builtin one fn may raise)
        if concurrent.futures.wait([future], timeout).not_done:
            raise HostsError(f"a call in host {name} took more than {timeout} s")
        return future.result()

    def pids(self, name: str) -> list[int]:
        """The pids of every process that runs in host ``name``'s namespace."""
        return _netns_pids(self.namespace(name))

    def placement(self, brokers: Sequence[str], clients: str) -> HostPlacement:
        """Where a :class:`~kafkakv.dev.DevCluster` runs on these hosts: node ``i`` on host
        ``brokers[i - 1]``, its probes and admin client in host ``clients``."""
        for name in (*brokers, clients):
            self._check(name)
        return HostPlacement(self, tuple(brokers), clients)

    # -- faults -----------------------------------------------------------------------------

    def isolate(self, name: str) -> Fault:
        """Take host ``name``'s link to the bridge down: nothing reaches it, nothing it sends
        leaves it; connections stay open, unanswered (new ones fail once ARP gives up). Heal:
        the link comes up again, and every host forgets the link-layer addresses it could not
        resolve meanwhile. Both return once the kernel uses the link as it says (up to a
        second after the command: its link watch runs once a second)."""
        port, net, space = self._port(name), self.bridge_namespace, self.namespace(name)
        _ip_batch([f"link set {port} down"], namespace=net)
        _await_link(space, "eth0", up=False)

        def undo() -> None:
            _ip_batch([f"link set {port} up"], namespace=net)
            _await_link(space, "eth0", up=True)
            _await_link(net, port, up=True)
            # Addresses that went unresolved while cut off would wait for ARP's next retry
            # (up to a second): forget them, so the first packet after the heal asks at once.
            for other in self.names:
                _ip_batch(["neigh flush all"], namespace=self.namespace(other))

        return self._fault(f"isolate {name}", undo)

    def split(self, side: Collection[str], other: Collection[str]) -> Fault:
        """Cut the hosts of ``side`` from those of ``other``, both ways: each host drops every
        packet from the other side (iptables INPUT rules); hosts on one side still talk. Heal:
        the rules go."""
        if set(side) & set(other):
            raise HostsError(f"a host cannot be on both sides: {sorted(set(side) & set(other))}")
        rules = [(a, b) for a in side for b in other] + [(b, a) for a in side for b in other]
        return self._drop(f"split {sorted(side)} | {sorted(other)}", rules)

    def cut(self, source: str, target: str) -> Fault:
        """Cut one direction: host ``target`` drops every packet from ``source`` (an iptables
        rule in ``target``), while what ``target`` sends still reaches ``source``. TCP needs
        both ways, so connections between them stall either way; datagrams from ``target``
        arrive. Heal: the rule goes."""
        return self._drop(f"cut {source} -> {target}", [(source, target)])

    def pause(self, pid: int) -> Fault:
        """Stop process ``pid`` (SIGSTOP); heal: SIGCONT."""
        os.kill(pid, signal.SIGSTOP)

        def undo() -> None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

        return self._fault(f"pause pid {pid}", undo)

    def heal(self) -> None:
        """Heal every fault still in force, latest first."""
        with self._lock:
            faults, self._faults = self._faults, []
        for fault in reversed(faults):
            fault.heal()

    def _drop(self, what: str, pairs: list[tuple[str, str]]) -> Fault:
        """Rules ``target drops packets from source`` for each ``(source, target)``."""
        iptables = _tool("iptables")
        rules = [
            (self.namespace(target), ["INPUT", "-s", self.address(source), "-j", "DROP"])
            for source, target in pairs
        ]
        self._check_running()
        done: list[tuple[str, list[str]]] = []

        def undo() -> None:
            for space, rule in reversed(done):
                _run(["ip", "netns", "exec", space, iptables, "-w", "-D", *rule])

        try:
            for space, rule in rules:
                _run(["ip", "netns", "exec", space, iptables, "-w", "-A", *rule])
                done.append((space, rule))
        except BaseException:
            undo()
            raise
        return self._fault(what, undo)

    def _fault(self, what: str, undo: Callable[[], None]) -> Fault:
        fault = Fault(what, undo)
        with self._lock:
            self._faults.append(fault)
        return fault

    # -- small helpers ----------------------------------------------------------------------

    def _check(self, name: str) -> str:
        if name not in self._addresses:
            raise HostsError(f"no host {name!r}: the hosts are {list(self.names)}")
        return name

    def _check_running(self) -> None:
        if self._status is not HostsStatus.RUNNING:
            raise HostsError(f"{self!r} is not running")


class HostPlacement:
    """A :class:`~kafkakv.dev.cluster.Placement` on :class:`Hosts`: node ``i`` runs on host
    ``brokers[i - 1]``; the cluster's own probes and admin client run in host ``clients``."""

    def __init__(self, hosts: Hosts, brokers: tuple[str, ...], clients: str) -> None:
        self.hosts = hosts
        self.brokers = brokers
        self.clients = clients

    def host(self, node_id: int) -> str:
        """The host node ``node_id`` runs on."""
        return self.brokers[node_id - 1]

    def address(self, node_id: int) -> str:
        return self.hosts.address(self.host(node_id))

    def command(self, node_id: int, argv: list[str]) -> list[str]:
        return self.hosts.command(self.host(node_id), argv)

    def call(self, node_id: int | None, fn: Callable[[], _T]) -> _T:
        where = self.clients if node_id is None else self.host(node_id)
        return self.hosts.call(where, fn)


def enter_namespace(path: str | os.PathLike[str]) -> None:
    """Move the calling thread (only it) into the network namespace at ``path`` (such as
    ``/run/netns/<name>``). Raises ``OSError`` when the kernel refuses."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"setns({path}): {os.strerror(errno)}")
    finally:
        os.close(fd)


def sweep() -> list[str]:
    """Remove the namespaces of networks made by processes of this user that no longer run
    (a run killed before its :meth:`Hosts.close`), killing what still runs in them; the
    names removed. Namespaces of live processes, and of other users, are left alone."""
    uid = os.getuid()
    removed = []
    for space in _namespaces():
        found = _TAG.match(space)
        if found is None or int(found.group(1)) != uid or _alive(int(found.group(2))):
            continue
        removed.append(space)
    _remove_namespaces(list(removed))
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _namespaces() -> list[str]:
    try:
        return sorted(p.name for p in _NETNS_DIR.iterdir())
    except FileNotFoundError:
        return []


def _netns_pids(space: str) -> list[int]:
    done = subprocess.run(
        ["ip", "netns", "pids", space], capture_output=True, text=True, check=False
    )
    return [int(word) for word in done.stdout.split() if word.isdigit()]


def _remove_namespaces(spaces: list[str]) -> None:
    """Kill what runs in each namespace of ``spaces`` and delete it (hosts first, the bridge
    last); empties the list. Never raises: it runs at exit, and a namespace gone is fine."""
    present = set(_namespaces())
    for space in reversed(spaces):
        if space not in present:
            continue
        for pid in _netns_pids(space):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        subprocess.run(["ip", "netns", "del", space], capture_output=True, check=False)
    spaces.clear()


def _await_link(space: str, link: str, *, up: bool) -> None:
    """Wait until ``link`` in namespace ``space`` is (or is no longer) up as the kernel uses
    it: a carrier change takes effect when the kernel's link watch gets to it, which it does
    at most once a second. Raises :class:`~kafkakv.dev.errors.HostsError` after 5 s."""
    deadline = time.monotonic() + _LINK_WAIT_S
    while True:
        done = subprocess.run(
            ["ip", "-n", space, "-br", "link", "show", link],
            capture_output=True,
            text=True,
            check=False,
        )
        words = done.stdout.split()
        if len(words) > 1 and (words[1] == "UP") == up:
            return
        if time.monotonic() > deadline:
            raise HostsError(f"link {link} in {space} is not {'up' if up else 'down'}: {words}")
        time.sleep(0.02)


def _tool(name: str) -> str:
    path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")
    if path is None:
        package = "iproute2" if name == "ip" else name
        raise HostsError(
            f"simulated hosts need {name}, which is not installed: apt-get install {package}"
        )
    return path


def _run(argv: Sequence[str], stdin: str | None = None) -> None:
    try:
        done = subprocess.run(
            list(argv),
            input=stdin,
            capture_output=True,
            text=True,
            check=False,
            timeout=_COMMAND_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise HostsError(f"{' '.join(argv)}: {exc}") from exc
    if done.returncode != 0:
        shown = " ".join(argv) + (f" <<< {stdin.strip()!r}" if stdin else "")
        raise HostsError(f"{shown} failed (exit {done.returncode}): {done.stderr.strip()}")


def _ip_batch(commands: Sequence[str], namespace: str | None = None) -> None:
    """Run ``ip`` commands in one process (``ip -batch -``), in ``namespace`` if given."""
    where = [] if namespace is None else ["-n", namespace]
    _run([_tool("ip"), *where, "-batch", "-"], "\n".join(commands) + "\n")
