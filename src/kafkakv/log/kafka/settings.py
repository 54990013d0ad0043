"""Client settings for the Kafka backend: what kafkakv requires, what it picks, what you add.

Your librdkafka settings (TLS, SASL, ``client.id``, timeouts...) pass through to every client
kafkakv makes. A few settings carry the guarantees the replicated map is built on; kafkakv sets
them and refuses a value that would break them:

=========================  ==============  ===============================================
``acks``                   ``all``         a write is acknowledged once every in-sync
                                           replica has it (seed 003: what survives what)
``enable.idempotence``     ``true``        retries never duplicate or reorder records
``isolation.level``        read_committed  readers never see a flush that was not committed
=========================  ==============  ===============================================

A few more are kafkakv's defaults, which you may override: librdkafka's own suit a client that
may wait a minute, not calls with timeouts of seconds (measured on the dev cluster with its
brokers on simulated hosts, ``tests/kafka/test_partitions.py``):

======================================  =====  ================================================
``socket.timeout.ms``                   3000   a request unanswered this long fails, and its
                                               connection is closed and made again (librdkafka:
                                               60 s). A leader cut off from the client held
                                               every produce and fetch for that long: no call
                                               succeeded during a 20 s isolation, though Kafka
                                               elected a new leader after 4 s; now the first
                                               call succeeds 1 to 4 s after the election
``reconnect.backoff.max.ms``            1000   a broker that was unreachable is tried again at
                                               least every second (librdkafka: 10 s), so a
                                               healed link is used at once
``socket.connection.setup.timeout.ms``  5000   a connection that does not open in 5 s is given
                                               up (librdkafka: 30 s)
======================================  =====  ================================================
"""

from __future__ import annotations

import logging
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from confluent_kafka import KafkaError, KafkaException

from kafkakv.errors import ConfigError
from kafkakv.log.kafka.errors import error_of, translate

_LIBRDKAFKA_LOG = logging.getLogger("kafkakv.librdkafka")
# librdkafka reports every refused connection while a broker restarts; kafkakv raises what
# matters itself. Its lines reach the application's handlers only if it configured logging.
_LIBRDKAFKA_LOG.addHandler(logging.NullHandler())

__all__ = ["ClientConfig", "ClientSettings", "open_client", "parse_kafka_url"]

ClientConfig = dict[str, Any]
"""A librdkafka configuration as confluent-kafka's clients take it."""

ErrorCallback = Callable[[KafkaError], None]
_Client = TypeVar("_Client")

_REQUIRED: dict[str, tuple[str, set[str]]] = {
    # name: (value kafkakv uses, spellings of it that a caller may also give)
    "acks": ("all", {"all", "-1"}),
    "enable.idempotence": ("true", {"true"}),
    "isolation.level": ("read_committed", {"read_committed"}),
}
# Setting-name prefixes that mean something to one kind of client only; librdkafka warns when
# another kind gets them.
_PRODUCER_ONLY = (
    "acks",
    "linger.",
    "message.",
    "queue.buffering",
    "batch.",
    "partitioner",
    "compression",
    "transaction",
)
_CONSUMER_ONLY = ("fetch.", "isolation.", "auto.offset", "queued.")
_OWNED = {"group.id", "enable.auto.commit", "enable.partition.eof", "transactional.id"}

_PROMPT: ClientConfig = {
    "socket.timeout.ms": "3000",
    "reconnect.backoff.max.ms": "1000",
    "socket.connection.setup.timeout.ms": "5000",
}


def parse_kafka_url(url: str) -> tuple[str, dict[str, str]]:
    """``kafka://host:port[,host:port...][?name=value&...]`` → (bootstrap servers, settings).

    >>> parse_kafka_url("kafka://127.0.0.1:19092,127.0.0.1:29092?client.id=app")
    ('127.0.0.1:19092,127.0.0.1:29092', {'client.id': 'app'})
    """
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "kafka":
        raise ConfigError(f"a Kafka target starts with kafka://, not {url!r}")
    servers = parts.netloc
    hosts = [h for h in servers.split(",") if h]
    if not hosts or any(":" not in h or not h.rsplit(":", 1)[1].isdigit() for h in hosts):
        raise ConfigError(f"{url!r}: give the bootstrap servers as host:port[,host:port...]")
    if parts.path not in ("", "/"):
        raise ConfigError(f"{url!r}: a Kafka target has no path")
    settings = dict(
        urllib.parse.parse_qsl(parts.query, keep_blank_values=True, strict_parsing=False)
    )
    return ",".join(hosts), settings


class ClientSettings:
    """The settings of each kind of client a :class:`~kafkakv.log.kafka.KafkaLog` makes."""

    def __init__(
        self,
        bootstrap: str,
        config: Mapping[str, Any] | None,
        timeout: float,
        error_cb: ErrorCallback | None = None,
    ) -> None:
        common: ClientConfig = {
            "bootstrap.servers": bootstrap,
            "client.id": "kafkakv",
            **_PROMPT,
        }
        for name, value in (config or {}).items():
            text = _as_text(name, value)
            if name in _OWNED:
                raise ConfigError(f"{name} is set by kafkakv itself and cannot be given")
            if name in _REQUIRED:
                wanted, accepted = _REQUIRED[name]
                if text.lower() not in accepted:
                    raise ConfigError(
                        f"{name}={text} would break kafkakv's guarantees; it needs {wanted}"
                    )
                continue
            common[name] = text
        if timeout <= 0:
            raise ConfigError(f"timeout must be positive, not {timeout}")
        self.bootstrap = bootstrap
        self.timeout = float(timeout)
        self.common = common
        self.error_cb = error_cb
        """Given to every client as librdkafka's ``error_cb`` (see :mod:`.refusals`)."""

    def _only(self, prefixes: tuple[str, ...]) -> ClientConfig:
        # Settings meant for one client kind only would make librdkafka warn on the others.
        out: ClientConfig = {k: v for k, v in self.common.items() if not k.startswith(prefixes)}
        out["logger"] = _LIBRDKAFKA_LOG  # librdkafka's messages go to logging, not stderr
        if self.error_cb is not None:
            out["error_cb"] = self.error_cb
        return out

    def producer(self) -> ClientConfig:
        """The shared producer: idempotent, acks from every in-sync replica, Java's partitioner."""
        out: ClientConfig = {
            "acks": "all",
            "enable.idempotence": "true",
            "partitioner": "murmur2_random",  # the Java client's default for keyed records
            "linger.ms": "1",
            "socket.nagle.disable": "true",
            "message.timeout.ms": str(int(self.timeout * 1000)),
            "queue.buffering.max.messages": "500000",
        }
        out.update(self._only(_CONSUMER_ONLY))
        return out

    def transactional(self, transactional_id: str, transaction_timeout_ms: int) -> ClientConfig:
        """A fenced writer: the producer's settings plus its id and transaction timeout."""
        out = self.producer()
        out["transactional.id"] = transactional_id
        out.setdefault("transaction.timeout.ms", str(transaction_timeout_ms))
        # librdkafka insists that a record gives up no later than its transaction does.
        limit = int(out["transaction.timeout.ms"])
        out["message.timeout.ms"] = str(min(int(out["message.timeout.ms"]), limit))
        return out

    def consumer(self, group: str) -> ClientConfig:
        """A reader: assigned partitions only (no group membership), committed records only."""
        out: ClientConfig = {
            "group.id": group,  # required by librdkafka; never joined, nothing committed
            "enable.auto.commit": "false",
            "enable.auto.offset.store": "false",
            "enable.partition.eof": "true",
            "isolation.level": "read_committed",
            "auto.offset.reset": "error",
            "fetch.wait.max.ms": "100",
            "fetch.error.backoff.ms": "50",
            "fetch.queue.backoff.ms": "10",
            "queued.max.messages.kbytes": "16384",
            "socket.nagle.disable": "true",
        }
        out.update(self._only(_PRODUCER_ONLY))
        return out

    def admin(self) -> ClientConfig:
        """The admin client: topic creation and configs may take a loaded controller
        longer than a data request, so its requests wait up to the log's timeout unless
        ``socket.timeout.ms`` was given (3 s failed a CreateTopics on a loaded machine)."""
        out = self._only(_PRODUCER_ONLY + _CONSUMER_ONLY)
        if out.get("socket.timeout.ms") == _PROMPT["socket.timeout.ms"]:
            out["socket.timeout.ms"] = str(max(3000, int(self.timeout * 1000)))
        return out


def open_client(kind: Callable[[ClientConfig], _Client], config: ClientConfig) -> _Client:
    """``kind(config)``: a librdkafka client (``Producer``, ``Consumer``, ``AdminClient``).

    Creating one connects to nothing, but librdkafka checks every setting: an unknown name, a
    value it cannot parse or a file it cannot read (``ssl.ca.location``) raises
    :class:`~kafkakv.errors.ConfigError` with librdkafka's words, which name the setting
    (``_INVALID_ARG``, which only here surely means a setting). Any other failure is
    translated as :mod:`.errors` says.
    """
    try:
        return kind(config)
    except KafkaException as exc:
        err = error_of(exc)
        if err is not None and err.code() == KafkaError._INVALID_ARG:
            raise translate("librdkafka refused the Kafka settings", err, ConfigError) from exc
        raise translate(f"opening a Kafka {getattr(kind, '__name__', 'client')}", exc) from exc


def _as_text(name: str, value: Any) -> str:
    if not isinstance(name, str):
        raise ConfigError(f"Kafka setting names are str, not {type(name).__name__}")
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    raise ConfigError(f"Kafka setting {name} must be a str, int, float or bool, not {value!r}")
