"""The server as a service: tokens, codecs, timeouts, draining on SIGTERM, restarts under load,
and the command's refusals. On the embedded log, whose locks let a test stall a write."""

from __future__ import annotations

import collections
import signal
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

import kafkakv
from kafkakv.cli.main import main
from kafkakv.errors import ConfigError
from kafkakv.serve.config import ServeConfig
from kafkakv.serve.server import serve_in_thread
from tests.locks import held
from tests.serve.conftest import ServerProcess, events, start_server
from tests.waiting import wait_for

TOKEN = "s3cret-token-0123456789"


@contextmanager
def _server(tmp_path: Path, **options: Any) -> Iterator[httpx.Client]:
    log = str(tmp_path / "log")
    db = kafkakv.connect(log, background_cleaner=False)
    try:
        config = ServeConfig(log, port=0, **options)
        with serve_in_thread(config, db) as url, httpx.Client(base_url=url, timeout=30) as http:
            yield http
    finally:
        db.close()


def test_a_drain_ends_an_idle_change_stream_at_once(tmp_path: Path) -> None:
    """The stream notices the drain when it starts, not at the end of the wait for the next
    change it was in (a second, when this test begins the drain just after a change)."""
    got_cursor, got_change = threading.Event(), threading.Event()
    ended: list[float] = []
    with _server(tmp_path) as http:
        http.put("/v1/maps/m", json={})
        url = str(http.base_url.join("/v1/maps/m/changes"))

        def follow() -> None:
            with httpx.stream("GET", url, timeout=30) as stream:
                lines = stream.iter_lines()
                events(lines, 1)
                got_cursor.set()
                events(lines, 1)
                got_change.set()
                for _ in lines:
                    pass
            ended.append(time.monotonic())

        follower = threading.Thread(target=follow)
        follower.start()
        assert got_cursor.wait(30), "no cursor event"
        http.put("/v1/maps/m/keys/a", json=1)
        assert got_change.wait(30), "no change event"
        draining = time.monotonic()  # leaving the block drains the server
    follower.join(30)
    assert ended, "the change stream did not end"
    assert ended[0] - draining < 0.5, (
        f"the stream ended {ended[0] - draining:.2f} s after the drain"
    )


def test_a_token_guards_everything_but_the_console_and_health(tmp_path: Path) -> None:
    with _server(tmp_path, token=TOKEN) as http:
        assert http.get("/v1/health").status_code == 200
        assert http.get("/").status_code == 200
        refused = http.get("/v1/maps")
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "unauthorized"
        assert refused.headers["www-authenticate"].startswith("Bearer")
        wrong = http.get("/v1/maps", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        right = {"Authorization": f"Bearer {TOKEN}"}
        assert http.put("/v1/maps/m", json={}, headers=right).status_code == 201
        assert http.put("/v1/maps/m/keys/a", json=1).status_code == 401
        assert http.put("/v1/maps/m/keys/a", json=1, headers=right).status_code == 200
        assert http.get("/v1/maps/m/keys/a", headers=right).json()["value"] == 1


def test_a_server_beyond_loopback_needs_a_token(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="needs a token"):
        ServeConfig(str(tmp_path), host="0.0.0.0").check()
    ServeConfig(str(tmp_path), host="0.0.0.0", token=TOKEN).check()
    result = CliRunner().invoke(main, ["serve", "-p", str(tmp_path), "--bind", "0.0.0.0:0"])
    assert result.exit_code == 2 and "needs a token" in result.output
    short = tmp_path / "token"
    short.write_text("short\n")
    result = CliRunner().invoke(
        main, ["serve", "-p", str(tmp_path), "--bind", "0.0.0.0:0", "--token-file", str(short)]
    )
    assert result.exit_code == 2 and "at least 16" in result.output
    result = CliRunner().invoke(main, ["serve", "-p", str(tmp_path), "--codec", "m=str:pickle"])
    assert result.exit_code == 2 and "NAME=KEY:VALUE" in result.output


def test_keys_and_values_of_other_codecs(tmp_path: Path) -> None:
    with _server(tmp_path, codecs={"ints": ("int", "bytes")}) as http:
        assert http.put("/v1/maps/ints", json={}).status_code == 201
        assert http.put("/v1/maps/ints/keys/7", json="AP8=").status_code == 200
        assert http.get("/v1/maps/ints/keys/7").json() == {"key": "7", "value": "AP8="}
        bad_key = http.get("/v1/maps/ints/keys/seven")
        assert bad_key.status_code == 400 and bad_key.json()["error"]["code"] == "invalid_key"
        bad_value = http.put("/v1/maps/ints/keys/8", json="not base64!")
        assert bad_value.status_code == 400
        assert bad_value.json()["error"]["code"] == "invalid_value"
        with kafkakv.connect(tmp_path / "log", background_cleaner=False) as db:
            m = db.map("ints", key_codec="int", value_codec="bytes", create=False)
            assert dict(m) == {7: b"\x00\xff"}


def test_a_write_the_log_cannot_take_in_time_answers_504(tmp_path: Path) -> None:
    with _server(tmp_path, request_timeout=1.0) as http:
        http.put("/v1/maps/m", json={})
        http.put("/v1/maps/m/keys/a", json=1)
        lock = tmp_path / "log" / "topics" / "m_ops" / "0" / "lock"
        with held(lock):
            started = time.monotonic()
            answer = http.put("/v1/maps/m/keys/a", json=2)
            elapsed = time.monotonic() - started
            assert answer.status_code == 504, answer.text
            assert answer.json()["error"]["code"] == "timeout"
            assert elapsed < 5
            assert http.get("/v1/maps/m/keys/a").json()["value"] == 1  # reads go on
        assert http.get("/v1/health").status_code == 200


def test_sigterm_drains_requests_in_flight_then_exits_0(tmp_path: Path) -> None:
    log = tmp_path / "log"
    server = start_server(str(log), "--drain-timeout", "20")
    try:
        http = httpx.Client(base_url=server.url, timeout=30)
        http.put("/v1/maps/m", json={})
        http.put("/v1/maps/m/keys/a", json=1)
        answers: list[httpx.Response] = []
        stream_ended = threading.Event()

        def follow() -> None:
            with httpx.stream("GET", f"{server.url}/v1/maps/m/changes", timeout=30) as stream:
                for _ in stream.iter_lines():
                    pass
            stream_ended.set()

        follower = threading.Thread(target=follow)
        follower.start()
        with held(log / "topics" / "m_ops" / "0" / "lock"):
            writer = threading.Thread(
                target=lambda: answers.append(http.put("/v1/maps/m/keys/a", json=2))
            )
            writer.start()
            time.sleep(0.5)  # the write is in flight, stalled on the lock
            server.proc.send_signal(signal.SIGTERM)
            wait_for(stream_ended.is_set, 10, "the change stream to end")
            refused = httpx.get(f"{server.url}/v1/health", timeout=5)
            assert refused.status_code == 503
            assert refused.json()["error"]["code"] == "draining"
            assert refused.headers["retry-after"] == "1"
            assert server.proc.poll() is None  # still draining the stalled write
        writer.join(30)
        follower.join(30)
        assert [a.status_code for a in answers] == [200]
        assert server.proc.wait(30) == 0
    finally:
        server.proc.kill()
    with kafkakv.connect(log, background_cleaner=False) as db:
        assert db.map("m", create=False)["a"] == 2


def test_a_restart_under_load_loses_no_acknowledged_write(tmp_path: Path) -> None:
    log = tmp_path / "log"
    server = start_server(str(log))
    port = int(server.url.rsplit(":", 1)[1])
    httpx.put(f"{server.url}/v1/maps/load", json={"partitions": 2}, timeout=30)
    acked: dict[str, int] = {}
    # One tally per writer: four threads adding to one dict's counts lose updates (a read,
    # then a write, of the same entry), which made the count of 200s short of the acks.
    statuses = [collections.Counter[int]() for _ in range(4)]
    bad: list[str] = []
    stop = threading.Event()

    def write(worker: int) -> None:
        with httpx.Client(base_url=server.url, timeout=10) as http:
            i = 0
            while not stop.is_set() and i < 100_000:
                key = f"w{worker}-{i}"
                try:
                    answer = http.put(f"/v1/maps/load/keys/{key}", json=i)
                except httpx.TransportError:
                    time.sleep(0.02)  # down: between the two servers
                    continue
                statuses[worker][answer.status_code] += 1
                if answer.status_code == 200:
                    acked[key] = i
                    i += 1
                elif answer.status_code == 503:
                    if answer.json()["error"]["code"] != "draining":
                        bad.append(answer.text)
                    time.sleep(0.02)
                else:
                    bad.append(f"{answer.status_code} {answer.text}")

    writers = [threading.Thread(target=write, args=(w,)) for w in range(4)]
    second: ServerProcess | None = None
    try:
        for t in writers:
            t.start()
        wait_for(lambda: len(acked) > 200, 30, "writes before the restart")
        before = len(acked)
        assert server.stop() == 0
        second = start_server(str(log), port=port)
        wait_for(lambda: len(acked) > before + 200, 30, "writes after the restart")
    finally:
        stop.set()
        for t in writers:
            t.join(30)
        server.proc.kill()
        if second is not None:
            assert second.stop() == 0
    assert bad == []
    assert sum(tally[200] for tally in statuses) == len(acked)
    with kafkakv.connect(log, background_cleaner=False) as db:
        m = db.map("load", create=False)
        missing = {k: v for k, v in acked.items() if m.get(k) != v}
        assert missing == {}, f"{len(missing)} acknowledged writes lost: {list(missing)[:5]}"


def test_the_serve_command_announces_its_address_and_serves_the_console(tmp_path: Path) -> None:
    server = start_server(str(tmp_path / "log"))
    try:
        page = httpx.get(server.url + "/", timeout=10)
        assert page.status_code == 200 and "text/html" in page.headers["content-type"]
        assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
        assert page.headers["x-content-type-options"] == "nosniff"
        script = httpx.get(server.url + "/static/console.js", timeout=10)
        assert script.status_code == 200 and script.headers["cache-control"] == "no-cache"
        assert "kafkakv" in page.text
        with httpx.stream("GET", f"{server.url}/v1/maps/none/changes", timeout=10) as s:
            assert s.status_code == 404
        http = httpx.Client(base_url=server.url, timeout=10)
        http.put("/v1/maps/m", json={})
        with httpx.stream("GET", f"{server.url}/v1/maps/m/changes", timeout=10) as stream:
            assert events(stream.iter_lines(), 1)[0]["event"] == "cursor"
    finally:
        assert server.stop() == 0


def test_tls_passes_through_to_the_listener(tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    log = str(tmp_path / "log")
    with kafkakv.connect(log, background_cleaner=False) as db:
        config = ServeConfig(log, port=0, tls_cert=str(cert), tls_key=str(key))
        with serve_in_thread(config, db) as url:
            assert url.startswith("https://")
            trusted = ssl.create_default_context(cafile=str(cert))
            assert httpx.get(f"{url}/v1/health", verify=trusted).json() == {"status": "ok"}
            with pytest.raises(httpx.ConnectError):
                httpx.get(f"{url}/v1/health")  # a certificate nobody vouches for
            plain = url.replace("https://", "http://")
            with pytest.raises(httpx.TransportError):
                httpx.get(f"{plain}/v1/health")


def _response(sock: Any) -> str:
    """One whole HTTP response read from ``sock``: its head, then as many bytes of body as its
    content-length says (a single recv may end with the head: the body came as a second
    segment once, and the check of its text failed)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            return data.decode()
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        chunk = sock.recv(4096)
        if not chunk:
            break
        body += chunk
    return (head + b"\r\n\r\n" + body).decode()


def test_a_body_that_trickles_in_is_cut_off_at_the_request_timeout(tmp_path: Path) -> None:
    import socket

    with _server(tmp_path, request_timeout=1.0) as http:
        http.put("/v1/maps/m", json={})
        host, port = str(http.base_url.host), int(http.base_url.port or 0)
        for path in ("/v1/maps/m/keys/k", "/v1/maps/m/keys/k/cas"):
            method = "PUT" if path.endswith("/k") else "POST"
            with socket.create_connection((host, port), timeout=10) as sock:
                head = f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n"
                sock.sendall(head.encode() + b'{"a"')  # then nothing more
                started = time.monotonic()
                answer = _response(sock)
                assert time.monotonic() - started < 5
            assert answer.startswith("HTTP/1.1 408"), answer
            assert '"body_timeout"' in answer
        assert http.get("/v1/maps/m/keys/k").status_code == 404


def test_a_body_declared_too_large_is_refused_before_it_arrives(tmp_path: Path) -> None:
    """413 on the headers alone, on the fast path (``PUT`` of a key of an open map) as on the
    routes (a compare-and-set): the server does not wait for a body it would refuse."""
    import socket

    with _server(tmp_path, request_timeout=30.0, max_body=1000) as http:
        http.put("/v1/maps/m", json={})
        assert http.put("/v1/maps/m/keys/a", json=1).status_code == 200  # m is open: fast path
        host, port = str(http.base_url.host), int(http.base_url.port or 0)
        for method, path in (("PUT", "/v1/maps/m/keys/k"), ("POST", "/v1/maps/m/keys/k/cas")):
            with socket.create_connection((host, port), timeout=5) as sock:
                head = f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 1001\r\n\r\n"
                sock.sendall(head.encode())  # and no body: a refusal must not wait for it
                try:
                    answer = _response(sock)
                except TimeoutError:
                    pytest.fail(f"{method} {path}: no answer within 5 s, waiting for the body")
            assert answer.startswith("HTTP/1.1 413"), answer
            assert '"body_too_large"' in answer
        assert http.get("/v1/maps/m/keys/k").status_code == 404


def test_fsync_always_is_the_embedded_logs_choice(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="embedded log"):
        ServeConfig("kafka://127.0.0.1:1", fsync="always").check()
    with pytest.raises(ConfigError, match="always, interval or never"):
        ServeConfig(str(tmp_path), fsync="sometimes").check()
    server = start_server(str(tmp_path / "log"), "--fsync", "always")
    try:
        http = httpx.Client(base_url=server.url, timeout=30)
        assert http.put("/v1/maps/m", json={}).status_code == 201
        assert http.put("/v1/maps/m/keys/a", json=1).status_code == 200
    finally:
        assert server.stop() == 0
    with kafkakv.connect(tmp_path / "log", background_cleaner=False) as db:
        assert db.map("m", create=False)["a"] == 1
