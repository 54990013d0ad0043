"""The files of one dev cluster in its state directory::

cluster.json          cluster id, layout, Kafka version, broker pids (see state.py)
.lock                 held while a process starts the cluster
log4j2.properties     broker logging: a file per node, nothing on the terminal
node-<i>/server.properties
node-<i>/data/        the node's log.dirs (formatted once, kept across restarts)
node-<i>/logs/server.log
node-<i>/stdout.log   the JVM's stdout and stderr (and the storage format tool's output)
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from importlib import resources
from pathlib import Path

from kafkakv.dev.errors import ClusterError
from kafkakv.dev.jars import KafkaJars
from kafkakv.dev.layout import (
    ClusterLayout,
    format_command,
    new_cluster_id,
    render_properties,
)
from kafkakv.dev.process import BrokerProcess, log_tail, spawn
from kafkakv.dev.state import ClusterState

__all__ = ["StateDir"]

_LOG4J = "log4j2.properties"
_FORMAT_TIMEOUT_S = 120.0


class StateDir:
    """Paths and file work for the cluster ``layout`` kept in ``path`` (no processes but the
    storage format tool)."""

    def __init__(self, path: Path, layout: ClusterLayout) -> None:
        self.path = path
        self.layout = layout

    @property
    def log4j_config(self) -> Path:
        """The log4j2 configuration every broker of this cluster reads."""
        return self.path / _LOG4J

    def node_dir(self, node_id: int) -> Path:
        """``node-<node_id>``."""
        return self.path / f"node-{node_id}"

    def config_path(self, node_id: int) -> Path:
        """The node's ``server.properties``."""
        return self.node_dir(node_id) / "server.properties"

    def logs_dir(self, node_id: int) -> Path:
        """The node's ``kafka.logs.dir``."""
        return self.node_dir(node_id) / "logs"

    def log_path(self, node_id: int) -> Path:
        """The node's log4j file, ``logs/server.log``."""
        return self.logs_dir(node_id) / "server.log"

    def output_path(self, node_id: int) -> Path:
        """The file receiving the node's JVM stdout and stderr."""
        return self.node_dir(node_id) / "stdout.log"

    def formatted(self, node_id: int) -> bool:
        """Whether the node's storage has been formatted (its ``meta.properties`` exists)."""
        return (self.node_dir(node_id) / "data" / "meta.properties").is_file()

    def make(self, path: Path | None = None) -> None:
        """Create ``path`` (default: the state directory) and its parents."""
        where = self.path if path is None else path
        try:
            where.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ClusterError(f"cannot create {where}: {exc}") from exc

    def claim(self, kafka_version: str) -> ClusterState:
        """The directory's state, made fresh (new cluster id) when there is none.

        Raises :class:`~kafkakv.dev.errors.ClusterError` when brokers recorded there still run,
        when it was formatted for another broker count, base port or Kafka version, or when
        it holds formatted storage without a state file.
        """
        state = ClusterState.load(self.path)
        if state is None:
            if any(self.formatted(i) for i in self.layout.node_ids):
                raise ClusterError(f"{self.path} holds formatted storage but no state file")
            state = ClusterState(
                new_cluster_id(), self.layout.brokers, self.layout.base_port, kafka_version
            )
        running = self.running_brokers(state)
        if running:
            raise ClusterError(
                f"a dev cluster from {self.path} is already running ({running}); stop it "
                f"first: kafkakv dev-cluster stop --dir {self.path}"
            )
        wanted = (self.layout.brokers, self.layout.base_port, kafka_version)
        if (state.brokers, state.base_port, state.kafka_version) != wanted:
            raise ClusterError(
                f"{self.path} holds a {state.brokers}-broker cluster on base port "
                f"{state.base_port} with Kafka {state.kafka_version}; start it with those "
                "settings, or use another directory (or delete this one)"
            )
        state.pids = {}
        state.save(self.path)
        return state

    def running_brokers(self, state: ClusterState) -> str:
        """``node i pid p, ...`` for the brokers recorded in ``state`` that still run."""
        alive = [
            f"node {node_id} pid {pid}"
            for node_id, pid in sorted(state.pids.items())
            if node_id in self.layout.node_ids
            and BrokerProcess(pid, self.config_path(node_id)).alive()
        ]
        return ", ".join(alive)

    def write_configs(self) -> None:
        """(Re)write the log4j2 configuration and every node's ``server.properties``."""
        try:
            logging = resources.files(__package__).joinpath(_LOG4J).read_bytes()
            self.log4j_config.write_bytes(logging)
            for node_id in self.layout.node_ids:
                self.make(self.logs_dir(node_id))
                data = str(self.node_dir(node_id) / "data")
                config = self.layout.broker_config(node_id, data)
                comment = f"kafkakv dev cluster node {node_id}; rewritten at every start"
                text = render_properties(config, comment)
                self.config_path(node_id).write_text(text, encoding="utf-8")
        except OSError as exc:
            raise ClusterError(f"cannot write the configuration in {self.path}: {exc}") from exc

    def format(
        self,
        java: str,
        jars: KafkaJars,
        cluster_id: str,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        """Format the storage of every node not formatted yet, all at once (a JVM each).

        Raises :class:`~kafkakv.dev.errors.ClusterError` with the tool's output when one fails or
        takes longer than two minutes.
        """
        pending = [i for i in self.layout.node_ids if not self.formatted(i)]
        if not pending:
            return
        if progress is not None:
            progress(f"formatting storage of node(s) {', '.join(map(str, pending))} ...")
        runs: dict[int, subprocess.Popen[bytes]] = {}
        try:
            for node_id in pending:
                command = format_command(
                    java,
                    jars.classpath,
                    str(self.config_path(node_id)),
                    cluster_id,
                    str(self.logs_dir(node_id)),
                    str(self.log4j_config),
                )
                runs[node_id] = spawn(command, self.output_path(node_id), die_with_parent=True)
            for node_id, run in runs.items():
                self._check_format(node_id, run)
        finally:
            for run in runs.values():
                if run.poll() is None:
                    run.kill()
                    run.wait()

    def _check_format(self, node_id: int, run: subprocess.Popen[bytes]) -> None:
        output = self.output_path(node_id)
        try:
            code = run.wait(_FORMAT_TIMEOUT_S)
        except subprocess.TimeoutExpired as exc:
            raise ClusterError(
                f"formatting node {node_id}'s storage took over {_FORMAT_TIMEOUT_S:.0f} s; "
                f"last lines of {output}:\n{log_tail(output)}"
            ) from exc
        if code != 0:
            raise ClusterError(
                f"formatting node {node_id}'s storage failed (exit {code}); last lines of "
                f"{output}:\n{log_tail(output)}"
            )
