"""What a program that exits without closing leaves behind: every update it handed to
kafkakv is delivered, and the interpreter's exit neither hangs nor crashes in librdkafka."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

import kafkakv
from kafkakv.dev import Cluster
from kafkakv.log.kafka import KafkaLog
from tests.conftest import KAFKA_TIMEOUT

pytestmark = pytest.mark.kafka
ROOT = Path(__file__).resolve().parents[2]

_SEND_AND_EXIT = """
import sys
from kafkakv.log import Record
from kafkakv.log.kafka import KafkaLog
log = KafkaLog(sys.argv[1], timeout=20)
log.create_topic(sys.argv[2], 1)
log.send(sys.argv[2], 0, [Record(b"k%d" % i, b"v%d" % i) for i in range(2000)])
print("sent", flush=True)
"""

_PUT_AND_EXIT = """
import sys
import kafkakv
db = kafkakv.connect(sys.argv[1])
m = db.map(sys.argv[2], value_codec="bytes")
futures = [m.put_async("k%d" % i, b"v%d" % i) for i in range(500)]
print("put", flush=True)
"""


def _run(script: str, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "PYTHONFAULTHANDLER": "1"}
    done = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_records_sent_by_a_program_that_never_closes_its_log_are_delivered(
    kafka_cluster: Cluster,
) -> None:
    """``send`` returns before the brokers have the records; the program then exits without
    close(). The log is closed at exit, its producer flushed while the interpreter is whole
    (before, the producer was destroyed during the finalization, which delivered them too:
    this guards the exit hook and its order, it did not fail before)."""
    topic = f"t-{uuid.uuid4().hex[:10]}"
    assert _run(_SEND_AND_EXIT, kafka_cluster.bootstrap, topic) == "sent\n"
    with KafkaLog(kafka_cluster.bootstrap, timeout=KAFKA_TIMEOUT) as log:
        assert log.end_offset(topic, 0) == 2000
        assert [r.value for r in log.read(topic, 0, 1995)] == [
            b"v%d" % i for i in range(1995, 2000)
        ]


@pytest.mark.parametrize("backend", ["embedded", "kafka"])
def test_updates_of_a_database_never_closed_are_applied(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """``put_async`` hands updates over; the program exits without waiting or closing. The
    database drains them at exit, and only then are the log's clients closed (the Kafka
    backend is imported after the database, so its exit hook, registered later, would run
    first with plain ``atexit``)."""
    if backend == "kafka":
        target = f"kafka://{request.getfixturevalue('kafka_cluster').bootstrap}"
    else:
        target = str(tmp_path / "db")
    name = f"m{uuid.uuid4().hex[:8]}"
    assert _run(_PUT_AND_EXIT, target, name) == "put\n"
    with kafkakv.connect(target) as db:
        m = db.map(name, value_codec="bytes")
        assert len(m) == 500
        assert m["k499"] == b"v499" and m["k0"] == b"v0"
