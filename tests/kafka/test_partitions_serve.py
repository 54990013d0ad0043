"""``kafkakv serve`` on a client host cut off from the Kafka cluster (issue 44): it answers
every request within its request timeout (plus the slack of tests/kafka/test_partitions.py)
with 503 ``unavailable`` or 504 ``timeout``, never with an old value for a linearizable read,
and serves again after the heal, without a restart."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

from kafkakv.dev import DevCluster
from kafkakv.dev.hosts import Hosts
from tests.kafka.test_partitions import RECOVERY_S, SLACK_S

pytestmark = pytest.mark.slow

REQUEST_TIMEOUT_S = 4.0
PORT = 18765
CUT_S = 6.0


def _request(method: str, path: str, body: Any = None) -> tuple[int, dict[str, Any], float]:
    """One HTTP request to the server on this host's loopback: status, JSON body, seconds."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{PORT}{path}", data, method=method)
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S + 30) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    took = time.monotonic() - started
    try:
        doc = json.loads(raw or b"{}")
    except ValueError:
        doc = {"raw": raw.decode(errors="replace")}
    return status, doc, took


def _code(doc: dict[str, Any]) -> str | None:
    """The error code of an error answer (``{"error": {"code", "message"}}``)."""
    error = doc.get("error")
    return error.get("code") if isinstance(error, dict) else None


class Server:
    """``kafkakv serve`` in host ``host``, and requests made from inside that host."""

    def __init__(self, hosts: Hosts, host: str, bootstrap: str, log: Path) -> None:
        self.hosts, self.host, self.log = hosts, host, log
        command = str(Path(sys.executable).with_name("kafkakv"))
        self.process = hosts.spawn(
            host,
            [
                command,
                "serve",
                "-p",
                f"kafka://{bootstrap}",
                "--bind",
                f"127.0.0.1:{PORT}",
                "--request-timeout",
                str(REQUEST_TIMEOUT_S),
            ],
            log,
        )

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, dict[str, Any], float]:
        return self.hosts.call(self.host, lambda: _request(method, path, body))

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"kafkakv serve exited: {self.log.read_text()[-2000:]}")
            try:
                if self.call("GET", "/v1/health")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        pytest.fail(f"kafkakv serve did not answer in {timeout} s: {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def test_serve_on_an_isolated_host_answers_503_or_504_in_time_and_serves_after_the_heal(
    hosts_cluster: DevCluster, host_network: Hosts, tmp_path: Path
) -> None:
    server = Server(host_network, "c1", hosts_cluster.bootstrap, tmp_path / "serve.log")
    name = f"serve-{uuid.uuid4().hex[:10]}"
    try:
        server.wait_ready()
        assert server.call("PUT", f"/v1/maps/{name}", {"partitions": 1})[0] == 201
        status, doc, _ = server.call("PUT", f"/v1/maps/{name}/keys/k", 1)
        assert status == 200, doc
        fault = host_network.isolate("c1")
        answers = []
        try:
            cut_at = time.monotonic()
            n = 1
            while time.monotonic() - cut_at < CUT_S:
                n += 1
                answers.append(("put", *server.call("PUT", f"/v1/maps/{name}/keys/k", n)))
                path = f"/v1/maps/{name}/keys/k?consistency=linearizable"
                answers.append(("get", *server.call("GET", path)))
        finally:
            fault.heal()
        healed = time.monotonic()
        after = None
        while time.monotonic() - healed < 3 * RECOVERY_S:
            status, doc, _ = server.call("PUT", f"/v1/maps/{name}/keys/k", -1)
            if status == 200:
                after = time.monotonic() - healed
                break
        read = server.call("GET", f"/v1/maps/{name}/keys/k?consistency=linearizable")
    finally:
        server.stop()
    seen = sorted({f"{op} {status} {_code(doc)}" for op, status, doc, _ in answers})
    served = "never" if after is None else f"{after:.1f} s after the heal"
    print(
        f"{len(answers)} requests while c1 was cut off: {', '.join(seen)}; longest "
        f"{max(took for *_, took in answers):.2f} s; first put served {served}"
    )
    late = [
        (op, status, took) for op, status, _, took in answers if took > REQUEST_TIMEOUT_S + SLACK_S
    ]
    assert not late, f"requests answered past the request timeout: {late}"
    wrong = [
        (op, status, doc)
        for op, status, doc, _ in answers
        if (status, _code(doc)) not in ((503, "unavailable"), (504, "timeout"))
    ]
    assert not wrong, f"requests on the cut-off host that did not answer 503/504: {wrong[:5]}"
    assert after is not None and after <= RECOVERY_S, f"no put served within {RECOVERY_S} s"
    assert read[0] == 200 and read[1]["value"] == -1, read
