"""Simulated hosts (kafkakv.dev.hosts): namespaces made and always removed, no way in from this
namespace nor out of the hosts, and every fault seen to work and to be undone by its heal."""

from __future__ import annotations

import ipaddress
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from functools import partial

import pytest

from kafkakv.dev.errors import HostsError
from kafkakv.dev.hosts import DEFAULT_SUBNET, Hosts, HostsStatus, sweep

CONNECT_S = 0.5
"""How long a connection attempt is given: on the bridge an answer takes microseconds."""
PORT = 5000


def _namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return {line.split()[0] for line in out.stdout.splitlines() if line.strip()}


def _ip(hosts: Hosts, name: str, *args: str) -> str:
    done = subprocess.run(
        ["ip", "-n", hosts.namespace(name), *args], capture_output=True, text=True, check=True
    )
    return done.stdout


@pytest.fixture(scope="module")
def hosts() -> Iterator[Hosts]:
    """Three hosts, each with a TCP server on port 5000 and a UDP socket on port 5000."""
    try:
        network = Hosts(["a", "b", "c"]).start()
    except HostsError as exc:
        pytest.fail(f"the simulated hosts could not be made: {exc}", pytrace=False)
    with network:
        servers = []
        for name in network.names:
            address = (network.address(name), PORT)
            servers.append(network.call(name, partial(socket.create_server, address)))
        yield network
        for server in servers:
            server.close()


def _connects(hosts: Hosts, source: str, target: str) -> bool:
    """Whether a TCP connection from ``source`` to ``target``'s server opens in time."""
    address = (hosts.address(target), PORT)

    def attempt() -> bool:
        try:
            with socket.create_connection(address, timeout=CONNECT_S):
                return True
        except OSError:
            return False

    return hosts.call(source, attempt)


def _datagram_arrives(hosts: Hosts, source: str, target: str) -> bool:
    """Whether a UDP datagram from ``source`` reaches a socket in ``target`` in time."""
    receiver = hosts.call(
        target,
        lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM),
    )
    with receiver:
        receiver.bind((hosts.address(target), 0))
        receiver.settimeout(CONNECT_S)
        port = receiver.getsockname()[1]

        def send() -> None:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
                sender.sendto(b"hello", (hosts.address(target), port))

        hosts.call(source, send)
        try:
            return receiver.recv(16) == b"hello"
        except TimeoutError:
            return False


def test_each_host_has_its_own_namespace_address_and_loopback_and_no_default_route(
    hosts: Hosts,
) -> None:
    subnet = ipaddress.IPv4Network(DEFAULT_SUBNET)
    assert {hosts.namespace(n) for n in hosts.names} | {hosts.bridge_namespace} <= _namespaces()
    for name in hosts.names:
        assert ipaddress.IPv4Address(hosts.address(name)) in subnet
        assert f"inet {hosts.address(name)}/24" in _ip(hosts, name, "addr", "show", "eth0")
        assert "UP" in _ip(hosts, name, "-br", "link", "show", "lo")
        routes = _ip(hosts, name, "route", "show")
        assert "default" not in routes, routes
        assert routes.split() == [str(subnet), *routes.split()[1:]], routes  # the subnet only
    assert all(_connects(hosts, "a", t) for t in ("b", "c"))
    assert _connects(hosts, "b", "b")  # a host reaches its own address


def test_nothing_leaves_the_hosts_and_this_namespace_has_no_way_in(hosts: Hosts) -> None:
    # Out: from a host, an address outside the subnet has no route (no packet is sent).
    def outside() -> int:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            try:
                sock.sendto(b"x", ("192.0.2.1", 9))
            except OSError as exc:
                return exc.errno or 0
        return 0

    assert hosts.call("a", outside) == 101  # ENETUNREACH
    # In: no interface of this namespace has an address in the subnet, and no route of this
    # namespace names the subnet (what this namespace sends there takes its default route,
    # if any: away from the hosts, which only the bridge reaches).
    subnet = ipaddress.IPv4Network(DEFAULT_SUBNET)
    mine = subprocess.run(
        ["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, check=True
    ).stdout
    for line in mine.splitlines():
        interface = ipaddress.IPv4Interface(line.split()[3])
        assert interface.ip not in subnet, line
    routes = subprocess.run(["ip", "-4", "route", "show"], capture_output=True, text=True).stdout
    for line in routes.splitlines():
        destination = line.split()[0]
        if destination != "default":
            assert not ipaddress.IPv4Network(destination).overlaps(subnet), line
    bridge_links = subprocess.run(
        ["ip", "-n", hosts.bridge_namespace, "-o", "link", "show"], capture_output=True, text=True
    ).stdout
    assert "br0" in bridge_links and "p1@" in bridge_links
    here = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    assert "br0" not in here and "p1@" not in here


def test_namespaces_are_removed_on_close_with_what_runs_in_them() -> None:
    network = Hosts(["x", "y"]).start()
    made = {network.namespace("x"), network.namespace("y"), network.bridge_namespace}
    assert made <= _namespaces()
    sleeper = network.spawn("x", ["sleep", "600"])
    deadline = time.monotonic() + 10
    while sleeper.pid not in network.pids("x"):  # once `ip netns exec` has entered it
        assert time.monotonic() < deadline, "the program never ran in host x"
        time.sleep(0.01)
    network.close()
    network.close()  # idempotent
    assert sleeper.wait(10) == -signal.SIGKILL
    assert not made & _namespaces()
    assert network.status is HostsStatus.CLOSED
    with pytest.raises(HostsError, match="not running"):
        network.call("x", lambda: None)


def test_a_killed_run_leaves_namespaces_that_the_next_run_sweeps(hosts: Hosts) -> None:
    code = (
        "import os, signal, sys\n"
        "from kafkakv.dev.hosts import Hosts\n"
        "h = Hosts(['k1', 'k2']).start()\n"
        "print(h.tag, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == -signal.SIGKILL, done.stderr
    tag = done.stdout.strip()
    left = {s for s in _namespaces() if s.startswith(tag + "-")}
    assert left == {f"{tag}-net", f"{tag}-k1", f"{tag}-k2"}  # the kill left them
    removed = sweep()
    assert left <= set(removed)
    assert not left & _namespaces()
    # the live network of this process is left alone
    assert hosts.namespace("a") in _namespaces() and hosts.namespace("a") not in removed
    assert _connects(hosts, "a", "b")


def test_isolate_cuts_a_host_off_until_healed(hosts: Hosts) -> None:
    with hosts.isolate("c") as fault:
        assert not _connects(hosts, "a", "c")
        assert not _connects(hosts, "c", "b")
        assert _connects(hosts, "a", "b")  # the others still talk
    assert fault.healed
    assert _connects(hosts, "a", "c") and _connects(hosts, "c", "b")


def test_split_cuts_one_side_from_the_other_both_ways_until_healed(hosts: Hosts) -> None:
    fault = hosts.split(["a"], ["b", "c"])
    try:
        assert not _connects(hosts, "a", "b") and not _connects(hosts, "c", "a")
        assert not _datagram_arrives(hosts, "b", "a") and not _datagram_arrives(hosts, "a", "c")
        assert _connects(hosts, "b", "c")  # one side still talks within itself
    finally:
        fault.heal()
    assert _connects(hosts, "a", "b") and _connects(hosts, "c", "a")
    with pytest.raises(HostsError, match="both sides"):
        hosts.split(["a"], ["a", "b"])


def test_cut_drops_one_direction_only_until_healed(hosts: Hosts) -> None:
    with hosts.cut("a", "b"):
        assert not _datagram_arrives(hosts, "a", "b")
        assert _datagram_arrives(hosts, "b", "a")  # the other direction still works
        assert not _connects(hosts, "a", "b")  # TCP needs both ways
        assert _connects(hosts, "a", "c")
    assert _datagram_arrives(hosts, "a", "b")
    assert _connects(hosts, "a", "b")


def test_heal_undoes_every_fault_in_force(hosts: Hosts) -> None:
    hosts.isolate("a")
    hosts.cut("b", "c")
    assert not _connects(hosts, "b", "a") and not _datagram_arrives(hosts, "b", "c")
    hosts.heal()
    assert _connects(hosts, "b", "a") and _datagram_arrives(hosts, "b", "c")


def test_pause_stops_a_process_in_a_host_until_healed(hosts: Hosts) -> None:
    ticker = hosts.python(
        "a",
        [
            "-u",
            "-c",
            "import time\nwhile True:\n    print(time.monotonic(), flush=True)\n"
            "    time.sleep(0.02)",
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert ticker.stdout is not None
        ticker.stdout.readline()
        with hosts.pause(ticker.pid):
            stopped = _state(ticker.pid)
        assert stopped == "T"  # stopped by SIGSTOP
        ticker.stdout.readline()  # it runs again (blocks until it prints)
        assert _state(ticker.pid) in ("S", "R")
    finally:
        ticker.kill()
        ticker.wait()


def _state(pid: int) -> str:
    """The process state letter in /proc (R, S, T...), once it has settled."""
    deadline = time.monotonic() + 5
    while True:
        with open(f"/proc/{pid}/stat") as handle:
            state = handle.read().rsplit(")", 1)[1].split()[0]
        if state != "R" or time.monotonic() > deadline:
            return state
        time.sleep(0.01)


def test_calls_and_programs_run_inside_the_host(hosts: Hosts) -> None:
    def where() -> str:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect((hosts.address("b"), 9))
            return str(sock.getsockname()[0])

    assert hosts.call("a", where) == hosts.address("a")
    child = hosts.python(
        "c",
        [
            "-c",
            "import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
            f"s.connect(({hosts.address('b')!r}, 9)); print(s.getsockname()[0])",
        ],
        stdout=subprocess.PIPE,
    )
    out, _ = child.communicate(timeout=30)
    assert out.decode().strip() == hosts.address("c")
    assert child.returncode == 0


def test_bad_names_and_unknown_hosts_are_refused(hosts: Hosts) -> None:
    for names in (["A"], ["a", "a"], [], ["x" * 11], ["1a"]):
        with pytest.raises(HostsError):
            Hosts(names)
    with pytest.raises(HostsError, match="no host 'z'"):
        hosts.address("z")
    assert os.geteuid() == 0  # (the module needs root; this machine's tests run as root)
