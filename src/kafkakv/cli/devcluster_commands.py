"""``kafkakv dev-cluster start|status|stop``: a local Apache Kafka cluster for development.

Every command parses its options and calls :class:`kafkakv.dev.DevCluster`, imported only
when a command runs (``kafkakv --help`` and the database's commands never load
:mod:`kafkakv.dev`): ``start`` runs it with ``die_with_parent`` off, so the brokers outlive
the command, and returns once all are ready; ``status`` and ``stop`` find the brokers
through the state file of ``--dir`` (:meth:`DevCluster.attach`). Progress goes to stderr;
``start`` prints only the bootstrap servers on stdout, so
``export KAFKA=$(kafkakv dev-cluster start)`` works.

Exit codes: 0 success (``stop`` also when nothing runs); 1 ``status`` of a cluster that is not
running and ready; 2 a usage error or an error kafkakv raised (``error: <message>``: a cluster
from that directory already runs, a port is taken, a broker failed to start, Maven failed).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from kafkakv.dev import DevCluster

__all__ = ["dev_cluster_group"]

EXIT_NOT_READY = 1


def _progress(message: str) -> None:
    click.echo(message, err=True)


_dir_option = click.option(
    "--dir",
    "state_dir",
    type=click.Path(file_okay=False, dir_okay=True, path_type=Path),
    default=None,
    help="State directory of the cluster (default: ${KAFKAKV_CACHE:-~/.cache/kafkakv}/dev-cluster).",
)


@click.group("dev-cluster")
def dev_cluster_group() -> None:
    """Run a local Apache Kafka cluster (KRaft, jars from Maven Central) on 127.0.0.1."""


@dev_cluster_group.command("start")
@click.option("--brokers", type=click.IntRange(min=1), default=3, show_default=True)
@click.option(
    "--base-port",
    type=click.IntRange(1024, 65535),
    default=19092,
    show_default=True,
    help="Node i serves clients on BASE_PORT + (i-1)*10000, its controller one port above.",
)
@_dir_option
@click.option(
    "--kafka-version",
    default=None,
    show_default="the release kafkakv.dev pins",
    help="Apache Kafka release whose jars to run.",
)
@click.option(
    "--timeout", type=click.FloatRange(min=1), default=90.0, show_default=True, help="Seconds."
)
@click.option(
    "--sasl-user",
    "sasl_users",
    multiple=True,
    metavar="USER:PASSWORD",
    help="Add a SASL/PLAIN listener (client port + 2) that accepts this user; repeatable.",
)
@click.option(
    "--tls",
    is_flag=True,
    help="Add a TLS listener (client port + 3) with a self-signed certificate for 127.0.0.1.",
)
def start_command(
    brokers: int,
    base_port: int,
    state_dir: Path | None,
    kafka_version: str | None,
    timeout: float,
    sasl_users: tuple[str, ...],
    tls: bool,
) -> None:
    """Start the cluster and print its bootstrap servers once every broker is ready.

    Only the plaintext listeners' addresses go to stdout; those of the SASL and TLS
    listeners, with the client settings they need, go to stderr.
    """
    from kafkakv.dev import DEFAULT_KAFKA_VERSION, DevCluster

    users: dict[str, str] = {}
    for pair in sasl_users:
        user, colon, password = pair.partition(":")
        if not colon:
            raise click.BadParameter(f"{pair!r} is not USER:PASSWORD", param_hint="--sasl-user")
        users[user] = password
    cluster = DevCluster(
        brokers,
        base_port,
        _where(state_dir),
        kafka_version=kafka_version or DEFAULT_KAFKA_VERSION,
        die_with_parent=False,
        progress=_progress,
        sasl_users=users,
        tls=tls,
    )
    began = time.monotonic()
    cluster.start(timeout=timeout)
    _progress(
        f"ready in {time.monotonic() - began:.1f} s: {brokers} broker(s) from {cluster.state_dir}"
        f" (logs in node-*/logs/server.log); stop with: kafkakv dev-cluster stop"
        + (f" --dir {state_dir}" if state_dir else "")
    )
    if cluster.sasl_bootstrap is not None:
        _progress(
            f"SASL/PLAIN clients: {cluster.sasl_bootstrap} (security.protocol=SASL_PLAINTEXT, "
            f"sasl.mechanism=PLAIN, users {', '.join(sorted(users))})"
        )
    if cluster.tls_bootstrap is not None:
        _progress(
            f"TLS clients: {cluster.tls_bootstrap} (security.protocol=SSL, "
            f"ssl.ca.location={cluster.tls_ca_location})"
        )
    click.echo(cluster.bootstrap)


@dev_cluster_group.command("status")
@_dir_option
def status_command(state_dir: Path | None) -> None:
    """Show every node: pid, port, running or stopped, ready (answers and is registered)."""
    where = _where(state_dir)
    cluster = _attach(where)
    if cluster is None:
        click.echo(f"no dev cluster in {where}")
        raise click.exceptions.Exit(EXIT_NOT_READY)
    click.echo(
        f"dev cluster in {where}: {cluster.layout.brokers} broker(s), Kafka "
        f"{cluster.kafka_version}, cluster id {cluster.cluster_id}"
    )
    rows = cluster.node_status()
    for row in rows:
        pid = "-" if row.pid is None else str(row.pid)
        state = "running" if row.running else "stopped"
        ready = "ready" if row.ready else "not ready"
        click.echo(f"node {row.node_id}  pid {pid:>7}  127.0.0.1:{row.port}  {state}  {ready}")
    click.echo(f"bootstrap: {cluster.bootstrap}")
    if not all(row.ready for row in rows):
        raise click.exceptions.Exit(EXIT_NOT_READY)


@dev_cluster_group.command("stop")
@_dir_option
def stop_command(state_dir: Path | None) -> None:
    """Stop every broker of the cluster (SIGTERM, SIGKILL after a few seconds)."""
    where = _where(state_dir)
    cluster = _attach(where)
    if cluster is None:
        click.echo(f"no dev cluster running from {where}")
        return
    pids = [pid for pid in map(cluster.pid, cluster.node_ids) if pid is not None]
    if not pids:
        click.echo(f"no dev cluster running from {where}")
        return
    cluster.stop()
    click.echo(f"stopped {len(pids)} broker(s) (pids {', '.join(map(str, pids))})")


def _where(state_dir: Path | None) -> Path:
    from kafkakv.dev import default_state_dir

    return state_dir or default_state_dir()


def _attach(where: Path) -> DevCluster | None:
    """The cluster whose state file is in ``where``, or ``None`` when there is none."""
    from kafkakv.dev import DevCluster
    from kafkakv.dev.state import ClusterState

    return None if ClusterState.load(where) is None else DevCluster.attach(where)
