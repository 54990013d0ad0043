"""Security settings reach every client kafkakv makes, against real broker listeners:
``kafka_single`` takes SASL/PLAIN clients on its ``sasl_bootstrap`` port and TLS clients on its
``tls_bootstrap`` port. A client the brokers refuse fails with :class:`LogAuthenticationError`
saying why, within its timeout."""

from __future__ import annotations

import socket
import time
import uuid
from pathlib import Path
from urllib.parse import urlencode

import pytest

import kafkakv
from kafkakv.devcluster import Cluster
from kafkakv.devcluster.jars import find_java
from kafkakv.devcluster.tls import make_certificate
from kafkakv.errors import LogAuthenticationError, LogUnavailableError
from tests.conftest import KAFKA_TIMEOUT
from tests.kafka_cluster import SASL_PASSWORD, SASL_USER


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


def test_a_wrong_password_fails_clearly_within_the_timeout(kafka_single: Cluster) -> None:
    started = time.monotonic()
    with pytest.raises(LogAuthenticationError, match="Invalid username or password"):
        _connect_sasl(kafka_single, "not-the-password", 3)
    assert time.monotonic() - started < 10


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
    with pytest.raises(LogAuthenticationError, match="certificate verify failed"):
        kafkakv.connect(_tls_url(kafka_single, str(other.ca_location)), timeout=3)


def test_tls_spoken_to_a_plaintext_listener_is_named(kafka_single: Cluster) -> None:
    # librdkafka words it "SSL handshake failed: ... PLAINTEXT broker listener?" or
    # "Disconnected: SSL connection closed by peer (... SSL_HANDSHAKE)", depending on timing
    with pytest.raises(LogAuthenticationError, match="SSL"):
        kafkakv.connect(f"kafka://{kafka_single.bootstrap}?security.protocol=SSL", timeout=3)


def test_a_refused_connection_says_so() -> None:
    with socket.socket() as sock:  # a port nobody listens on once closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(LogUnavailableError, match="Connection refused"):
        kafkakv.connect(f"kafka://127.0.0.1:{port}", timeout=2)
