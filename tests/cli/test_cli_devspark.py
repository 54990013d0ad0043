"""``kafkakv dev-spark start|stop`` as a person runs it, in separate processes: the cluster
outlives the command that started it, and ``stop`` ends it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from kafkakv.dev.process import live_args
from kafkakv.dev.spark import stop_spark_cluster

pytestmark = pytest.mark.spark


def _dev_spark(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kafkakv", "dev-spark", *args],
        capture_output=True,
        text=True,
        timeout=240,  # two JVM starts on a loaded 2-core machine
        check=False,
    )


def _runs_spark(pid: int) -> bool:
    args = live_args(pid)
    return args is not None and any(a.startswith(b"org.apache.spark.deploy.") for a in args)


@pytest.mark.timeout(600)
def test_start_prints_the_master_url_and_stop_ends_the_cluster(tmp_path: Path) -> None:
    where = str(tmp_path / "spark")
    try:
        started = _dev_spark("start", "--workers", "1", "--dir", where)
        assert started.returncode == 0, started.stderr
        url = started.stdout.strip()
        assert re.fullmatch(r"spark://127\.0\.0\.1:\d+", url), started.stdout
        status_url = re.search(r"status (http://\S+/json/)", started.stderr)
        assert status_url, started.stderr
        with urllib.request.urlopen(status_url[1], timeout=10) as response:
            status = json.load(response)
        # The master it printed runs after the command ended, with its worker registered.
        assert status["url"] == url and status["aliveworkers"] == 1, status
        pids = json.loads((Path(where) / "spark-cluster.json").read_text())["pids"]
        assert len(pids) == 2 and all(_runs_spark(pid) for pid in pids)

        stopped = _dev_spark("stop", "--dir", where)
        assert stopped.returncode == 0, stopped.stderr
        # The worker first, then the master.
        assert stopped.stdout.strip() == (
            f"stopped 2 Spark process(es) (pids {pids[1]}, {pids[0]})"
        )
        assert not any(_runs_spark(pid) for pid in pids)

        again = _dev_spark("stop", "--dir", where)
        assert again.returncode == 0 and "no Spark cluster running" in again.stdout
    finally:
        stop_spark_cluster(where)  # whatever failed above, no JVM outlives the test
