"""The 3-broker KRaft cluster with each broker on a simulated host of its own: it serves maps to
client processes on other hosts, and a broker killed with SIGKILL comes back on its host."""

from __future__ import annotations

import json
import subprocess
import time
import uuid

from kafkakv.dev import DevCluster
from kafkakv.dev.hosts import Hosts
from tests.kafka_cluster import broker_host, create_topic, unique_topic

CLIENT_S = 90.0
"""The longest a client process may take (start, connect, work, close) on a loaded machine."""


def _run_client(hosts: Hosts, name: str, code: str) -> object:
    """Run ``code`` with Python in host ``name``; what it printed last, as JSON."""
    child = hosts.python(name, ["-c", code], stdout=subprocess.PIPE)
    out, _ = child.communicate(timeout=CLIENT_S)
    text = out.decode()
    assert child.returncode == 0, f"the client in {name} failed:\n{text}"
    return json.loads(text.strip().splitlines()[-1])


def test_each_broker_runs_in_its_own_host_and_listens_on_its_address(
    hosts_cluster: DevCluster, host_network: Hosts
) -> None:
    for node in hosts_cluster.node_ids:
        pid = hosts_cluster.pid(node)
        assert pid is not None and pid in host_network.pids(broker_host(node))
        assert hosts_cluster.layout.host(node) == host_network.address(broker_host(node))
    assert hosts_cluster.bootstrap == ",".join(
        f"{host_network.address(broker_host(i))}:{p}"
        for i, p in ((1, 11092), (2, 21092), (3, 31092))
    )
    assert all(status.ready for status in hosts_cluster.node_status())


def test_clients_on_two_hosts_share_a_map_through_the_brokers_on_theirs(
    hosts_cluster: DevCluster, host_network: Hosts
) -> None:
    url = "kafka://" + hosts_cluster.bootstrap
    name = f"hosts-{uuid.uuid4().hex[:10]}"
    writer = (
        "import json, kafkakv\n"
        f"with kafkakv.connect({url!r}, timeout=20) as db:\n"
        f"    m = db.map({name!r}, value_codec='json')\n"
        "    m['greeting'] = {'from': 'c1'}\n"
        "    print(json.dumps(m['greeting']))\n"
    )
    assert _run_client(host_network, "c1", writer) == {"from": "c1"}
    reader = (
        "import json, kafkakv\n"
        f"with kafkakv.connect({url!r}, timeout=20) as db:\n"
        f"    m = db.map({name!r}, value_codec='json')\n"
        "    m.sync()\n"
        "    print(json.dumps(m.get('greeting')))\n"
    )
    assert _run_client(host_network, "c2", reader) == {"from": "c1"}


def test_a_broker_killed_on_its_host_restarts_there(
    hosts_cluster: DevCluster, host_network: Hosts
) -> None:
    topic = unique_topic("hosts-kill")
    create_topic(hosts_cluster, topic)
    leader = hosts_cluster.leader(topic, 0)
    old_pid = hosts_cluster.pid(leader)
    hosts_cluster.kill(leader)
    assert not hosts_cluster.is_running(leader)
    assert old_pid not in host_network.pids(broker_host(leader))
    started = time.monotonic()
    assert hosts_cluster.wait_leader(topic, 0, exclude=[leader], timeout=30) != leader
    print(f"a new leader after {time.monotonic() - started:.1f} s")
    hosts_cluster.start_node(leader)
    pid = hosts_cluster.pid(leader)
    assert pid is not None and pid in host_network.pids(broker_host(leader))
    hosts_cluster.wait_in_sync(topic, timeout=60)
