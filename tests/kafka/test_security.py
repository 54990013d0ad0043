"""Security settings reach every client kafkakv makes, against real broker listeners:
``kafka_single`` takes SASL/PLAIN clients on its ``sasl_bootstrap`` port and TLS clients on its
``tls_bootstrap`` port. A client the brokers refuse fails with :class:`LogAuthenticationError`
saying why, as soon as librdkafka reports it: well within a 30 s timeout."""

from __future__ import annotations

import socket
import time
import uuid
from pathlib import Path
from urllib.parse import urlencode

import pytest

import kafkakv
from kafkakv.dev import Cluster
from kafkakv.dev.jars import find_java
from kafkakv.dev.tls import make_certificate
from kafkakv.errors import LogAuthenticationError, LogUnavailableError
from tests.conftest import KAFKA_TIMEOUT
from tests.kafka_cluster import SASL_PASSWORD, SASL_USER

REFUSED_WITHIN_S = 5.0
"""How soon a refused client fails with a 30 s timeout (librdkafka reports it in ~0.3 s)."""


def _connect_sasl(cluster: Cluster, password: str, timeout: float) -> kafkakv.Database:
    """Settings in the URL's query, the secret in ``config`` (as docs/kafka.md advises)."""
    if cluster.sasl_bootstrap is None:
        pytest.fail("this Kafka cluster has no SASL/PLAIN listener (an external one?)")
    settings = {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": SASL_USER,
    }
    url = f"kafka://{cluster.sasl_bootstrap}?{urlencode(settings)}"
    return kafkakv.connect(url, config={"sasl.password": password}, timeout=timeout)


def test_a_map_works_through_a_sasl_listener(kafka_single: Cluster) -> None:
    """Topic creation (admin), appends (producer), reads (consumer) and a flush (a
    transactional producer) all authenticate with the URL's settings."""
    name = f"sasl-{uuid.uuid4().hex[:10]}"
    with _connect_sasl(kafka_single, SASL_PASSWORD, KAFKA_TIMEOUT) as db:
        m = db.map(name)
        m["k"] = {"v": 1}
        assert m.put("k", {"v": 2}) == {"v": 1}
        m.flush()  # a transaction through the SASL listener
    with kafkakv.connect(f"kafka://{kafka_single.bootstrap}", timeout=KAFKA_TIMEOUT) as db:
        fresh = db.map(name)  # the same broker through its plaintext listener
        assert dict(fresh) == {"k": {"v": 2}}
        assert db.log.end_offset(name, 0) >= 2  # the flush wrote the key and its flush point


def test_a_wrong_password_fails_clearly_at_once(kafka_single: Cluster) -> None:
    started = time.monotonic()
    with pytest.raises(LogAuthenticationError, match="Invalid username or password"):
        _connect_sasl(kafka_single, "not-the-password", 30)
    assert time.monotonic() - started < REFUSED_WITHIN_S


def _tls_url(cluster: Cluster, ca_location: str | None) -> str:
    if cluster.tls_bootstrap is None:
        pytest.fail("this Kafka cluster has no TLS listener (an external one?)")
    settings = {"security.protocol": "SSL", "ssl.ca.location": ca_location}
    return f"kafka://{cluster.tls_bootstrap}?{urlencode(settings)}"


def test_a_map_works_through_a_tls_listener(kafka_single: Cluster) -> None:
    name = f"tls-{uuid.uuid4().hex[:10]}"
    url = _tls_url(kafka_single, kafka_single.tls_ca_location)
    with kafkakv.connect(url, timeout=KAFKA_TIMEOUT) as db:
        m = db.map(name)
        m["k"] = [1, 2]
        m.flush()
    with kafkakv.connect(url, timeout=KAFKA_TIMEOUT) as db:
        assert dict(db.map(name)) == {"k": [1, 2]}
        assert db.log.end_offset(name, 0) >= 2


def test_a_certificate_the_client_does_not_trust_fails_clearly(
    kafka_single: Cluster, tmp_path: Path
) -> None:
    other = make_certificate(find_java(), tmp_path)  # another self-signed certificate
    started = time.monotonic()
    with pytest.raises(LogAuthenticationError, match="certificate verify failed"):
        kafkakv.connect(_tls_url(kafka_single, str(other.ca_location)), timeout=30)
    assert time.monotonic() - started < REFUSED_WITHIN_S


def test_tls_spoken_to_a_plaintext_listener_is_named(kafka_single: Cluster) -> None:
    # librdkafka words it "SSL handshake failed: ... PLAINTEXT broker listener?" or
    # "Disconnected: SSL connection closed by peer (... SSL_HANDSHAKE)", depending on timing
    started = time.monotonic()
    with pytest.raises(LogAuthenticationError, match="SSL"):
        kafkakv.connect(f"kafka://{kafka_single.bootstrap}?security.protocol=SSL", timeout=30)
    assert time.monotonic() - started < REFUSED_WITHIN_S


@pytest.mark.parametrize(
    ("protocol", "hint"),
    [("PLAINTEXT", "security.protocol=SSL"), ("SASL_PLAINTEXT", "security.protocol=SASL_SSL")],
)
def test_plaintext_spoken_to_a_tls_listener_gets_a_hint(
    kafka_single: Cluster, protocol: str, hint: str
) -> None:
    """librdkafka only says that every broker is down: the listener closes the connection
    without a word. kafkakv then tries a TLS handshake itself, and says what to set."""
    if kafka_single.tls_bootstrap is None:
        pytest.fail("this Kafka cluster has no TLS listener (an external one?)")
    settings = {"security.protocol": protocol}
    if protocol == "SASL_PLAINTEXT":
        settings |= {"sasl.mechanism": "PLAIN", "sasl.username": SASL_USER}
    url = f"kafka://{kafka_single.tls_bootstrap}?{urlencode(settings)}"
    started = time.monotonic()
    with pytest.raises(LogAuthenticationError, match=f"the port speaks TLS: add {hint}"):
        config = {"sasl.password": SASL_PASSWORD} if protocol == "SASL_PLAINTEXT" else {}
        kafkakv.connect(url, config=config, timeout=30)
    assert time.monotonic() - started < REFUSED_WITHIN_S


def test_a_refusal_stops_a_wait_of_an_open_log(kafka_single: Cluster, tmp_path: Path) -> None:
    """Not only the connect: a wait on an open log (here a new transactional writer's, whose
    producer reads a CA file that no longer holds the brokers' certificate) stops at the first
    report of a refusal, not at the end of its timeout."""
    ca = tmp_path / "ca.pem"
    ca.write_bytes(Path(str(kafka_single.tls_ca_location)).read_bytes())
    name = f"refused-{uuid.uuid4().hex[:10]}"
    with kafkakv.connect(_tls_url(kafka_single, str(ca)), timeout=30) as db:
        db.log.create_topic(name)
        db.log.append(name, 0, [kafkakv.Record(b"k", b"v")])
        # A new client (a transactional writer) of the same log reads the CA file afresh.
        other = make_certificate(find_java(), tmp_path / "other")
        ca.write_bytes(other.ca_location.read_bytes())
        started = time.monotonic()
        with pytest.raises(LogAuthenticationError, match="certificate verify failed"):
            db.log.writer(f"w-{name}").append({(name, 0): [kafkakv.Record(b"k", b"w")]})
        assert time.monotonic() - started < REFUSED_WITHIN_S


def test_a_refused_connection_says_so() -> None:
    with socket.socket() as sock:  # a port nobody listens on once closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(LogUnavailableError, match="Connection refused"):
        kafkakv.connect(f"kafka://127.0.0.1:{port}", timeout=2)
