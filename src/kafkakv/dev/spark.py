"""A Spark standalone cluster on 127.0.0.1 for tests and developers: one master and workers,
each a JVM of its own, from the PySpark installation's jars.

Each worker offers one core and a small memory budget and starts its own executor JVMs, whose
Python workers run on the executors' interpreter (``spark.pyspark.python``, which
:func:`kafkakv.pipeline.spark_session` sets): the driver, the executors and their Python
workers share nothing but the log, as on a real cluster. The processes inherit this process's
environment (``PYTHONPATH`` among it: the executors import the same kafkakv).

Started with ``die_with_parent`` (the default), the kernel kills the master and the workers
when this process ends, however it ends (:func:`kafkakv.dev.process.dies_with_parent`); the
executors die with their worker. Costs: three JVM starts (seconds each), then one HTTP request
per poll of the master's JSON status until every worker has registered.

Example (not run as a doctest: it starts JVMs)::

    with SparkCluster(tmp_dir) as cluster:
        spark = spark_session(master=cluster.master_url, config=cluster.app_config())
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from kafkakv.dev.errors import ClusterError
from kafkakv.dev.jars import find_java
from kafkakv.dev.process import BrokerProcess, live_args, log_tail, spawn
from kafkakv.lifecycle import Closeable

__all__ = [
    "LIGHT_JVM_OPTIONS",
    "SparkCluster",
    "light_jvm_config",
    "pyspark_home",
    "stop_spark_cluster",
]

HOST = "127.0.0.1"

LIGHT_JVM_OPTIONS: tuple[str, ...] = (
    "-XX:TieredStopAtLevel=1",
    "-XX:+UseSerialGC",
    "-XX:-UsePerfData",
)
"""JVM flags of this cluster's master, workers and executors, and of the sessions tests start
(:func:`light_jvm_config`): no C2 compiler and one GC thread. A test's job is short and small,
so a JVM spends more CPU compiling and collecting in parallel than running it; on two cores
shared with three Kafka brokers that CPU is the suite's time. As the dev Kafka cluster's
brokers (:data:`kafkakv.dev.layout.DEFAULT_JVM_OPTIONS`). Not for benchmarks: a user's Spark
runs with its defaults."""


def light_jvm_config() -> dict[str, str]:
    """Spark settings that start a session's driver and executors with
    :data:`LIGHT_JVM_OPTIONS` (the driver's take effect where the session starts its JVM)."""
    flags = " ".join(LIGHT_JVM_OPTIONS)
    return {"spark.driver.extraJavaOptions": flags, "spark.executor.extraJavaOptions": flags}


_POLL_S = 0.2
_STATE = "spark-cluster.json"


def pyspark_home() -> Path:
    """The PySpark installation: its ``jars`` run the cluster, and it is the cluster's
    ``SPARK_HOME`` (the workers build their executors' class path from it). Raises
    :class:`~kafkakv.dev.errors.ClusterError` without PySpark."""
    try:
        import pyspark
    except ImportError as exc:
        raise ClusterError("a Spark cluster needs PySpark: pip install 'kafkakv[spark]'") from exc
    return Path(pyspark.__file__).parent


class SparkCluster(Closeable):
    """A master and ``workers`` workers (``cores`` cores and ``memory`` each), their logs and
    work directories under ``state_dir``. :meth:`start` starts them and waits until every
    worker has registered; :meth:`close` kills them. Raises
    :class:`~kafkakv.dev.errors.ClusterError` when one cannot start or the workers do not
    register within ``timeout`` seconds."""

    def __init__(
        self,
        state_dir: str | os.PathLike[str],
        *,
        workers: int = 2,
        cores: int = 1,
        memory: str = "1g",
        timeout: float = 180.0,
        die_with_parent: bool = True,
    ) -> None:
        if workers < 1 or cores < 1:
            raise ClusterError(
                f"a Spark cluster needs workers >= 1 and cores >= 1: {workers}, {cores}"
            )
        self.state_dir = Path(state_dir)
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.timeout = timeout
        self.die_with_parent = die_with_parent
        self.port = 0
        self.webui_port = 0
        self._processes: list[BrokerProcess] = []
        self._outputs: list[Path] = []

    @property
    def master_url(self) -> str:
        """``spark://127.0.0.1:<port>``: the ``master`` of a session on this cluster."""
        return f"spark://{HOST}:{self.port}"

    @property
    def status_url(self) -> str:
        """The master's status as JSON (workers, applications, cores used)."""
        return f"http://{HOST}:{self.webui_port}/json/"

    def app_config(self) -> dict[str, str]:
        """Settings for a session that uses every worker: one single-core executor each, in
        the workers' memory budget."""
        return {
            "spark.executor.cores": str(self.cores),
            "spark.cores.max": str(self.cores * self.workers),
            "spark.executor.memory": "512m",
            **light_jvm_config(),
        }

    def start(self) -> str:
        """Start the master and the workers, wait until every worker is alive; return
        :attr:`master_url`."""
        if self._processes:
            raise ClusterError("the Spark cluster is already started")
        self.state_dir.mkdir(parents=True, exist_ok=True)
        home = pyspark_home()
        java = find_java()
        classpath = str(home / "jars" / "*")
        self.port, self.webui_port = _free_port(), _free_port()
        deploy = "org.apache.spark.deploy"
        # env(1) adds to the inherited environment: the workers build their executors'
        # class path from SPARK_HOME's jars, and need the Scala version said (else they look
        # for a source build's directories).
        env = [
            "env",
            f"SPARK_HOME={home}",
            f"SPARK_SCALA_VERSION={_scala_version(home)}",
            f"SPARK_LOCAL_IP={HOST}",
        ]
        try:
            self._spawn(
                "master",
                [
                    java,
                    "-Xmx512m",
                    *LIGHT_JVM_OPTIONS,
                    "-cp",
                    classpath,
                    f"{deploy}.master.Master",
                    "--host",
                    HOST,
                    "--port",
                    str(self.port),
                    "--webui-port",
                    str(self.webui_port),
                ],
                env,
            )
            for i in range(self.workers):
                work = self.state_dir / f"worker-{i}"
                work.mkdir(exist_ok=True)
                self._spawn(
                    f"worker-{i}",
                    [
                        java,
                        "-Xmx256m",
                        *LIGHT_JVM_OPTIONS,
                        "-cp",
                        classpath,
                        f"{deploy}.worker.Worker",
                        self.master_url,
                        "--host",
                        HOST,
                        "--cores",
                        str(self.cores),
                        "--memory",
                        self.memory,
                        "--webui-port",
                        "0",
                        "--work-dir",
                        str(work),
                    ],
                    env,
                )
            self._wait_for_workers()
            state = {
                "master_url": self.master_url,
                "status_url": self.status_url,
                "pids": [p.pid for p in self._processes],
            }
            (self.state_dir / _STATE).write_text(json.dumps(state), encoding="utf-8")
        except BaseException:
            self.close()
            raise
        return self.master_url

    def _spawn(self, name: str, argv: list[str], env: list[str]) -> None:
        output = self.state_dir / f"{name}.log"
        popen = spawn([*env, *argv], output, die_with_parent=self.die_with_parent)
        self._processes.append(BrokerProcess(popen.pid, output, popen))
        self._outputs.append(output)

    def status(self) -> dict[str, Any]:
        """The master's JSON status (one HTTP request). Raises ClusterError when it does not
        answer."""
        try:
            with urllib.request.urlopen(self.status_url, timeout=5) as response:
                status: dict[str, Any] = json.load(response)
                return status
        except (OSError, ValueError) as exc:
            raise ClusterError(
                f"the Spark master at {self.status_url} does not answer: {exc}"
            ) from exc

    def _wait_for_workers(self) -> None:
        deadline = time.monotonic() + self.timeout
        while True:
            for process, output in zip(self._processes, self._outputs, strict=True):
                if not process.alive():
                    raise ClusterError(
                        f"a Spark process exited ({process.exit_code()}), {output}:\n"
                        f"{log_tail(output)}"
                    )
            try:
                alive = self.status().get("aliveworkers", 0)
            except ClusterError:
                alive = 0
            if alive >= self.workers:
                return
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"{alive} of {self.workers} Spark workers registered in {self.timeout} s; "
                    f"logs in {self.state_dir}"
                )
            time.sleep(_POLL_S)

    def close(self) -> None:
        """Kill the workers, then the master (their executors die with the workers)."""
        for process in reversed(self._processes):
            process.terminate(grace=5.0)
        self._processes.clear()
        self._outputs.clear()
        with contextlib.suppress(FileNotFoundError):
            (self.state_dir / _STATE).unlink()


def stop_spark_cluster(state_dir: str | os.PathLike[str]) -> list[int]:
    """Kill the processes of the cluster that :meth:`SparkCluster.start` noted in
    ``state_dir`` (one started by another process, ``kafkakv dev-spark start``); return their
    pids (empty when none runs). A pid counts only while its command line still runs Spark's
    master or worker on the cluster's port (a recycled pid is left alone)."""
    path = Path(state_dir) / _STATE
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
        port = state["master_url"].rsplit(":", 1)[1].encode()
        pids = [int(pid) for pid in state["pids"]]
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return []
    stopped = [pid for pid in reversed(pids) if _runs_spark(pid, port)]
    for pid in stopped:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10.0
    while any(_runs_spark(pid, port) for pid in stopped) and time.monotonic() < deadline:
        time.sleep(_POLL_S)
    for pid in stopped:
        if _runs_spark(pid, port):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    path.unlink(missing_ok=True)
    return stopped


def _runs_spark(pid: int, port: bytes) -> bool:
    """Whether ``pid`` is a live Spark master or worker of the cluster on ``port``."""
    args = live_args(pid)
    if args is None:
        return False
    deploy = any(a.startswith(b"org.apache.spark.deploy.") for a in args)
    return deploy and any(a == port or a.endswith(b":" + port) for a in args)


def _scala_version(home: Path) -> str:
    """The Scala version of the installation's Spark, from its ``spark-core_<v>-*.jar``."""
    for jar in (home / "jars").glob("spark-core_*.jar"):
        return jar.name.removeprefix("spark-core_").split("-", 1)[0]
    raise ClusterError(f"no spark-core jar in {home / 'jars'}: is PySpark complete?")


def _free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port
