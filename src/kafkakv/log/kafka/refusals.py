"""Noticing at once that the brokers refuse a client, and waiting for them in slices.

librdkafka reports a refused client (SASL credentials, an untrusted certificate, TLS spoken to
a listener that does not speak it) through ``error_cb`` within a round trip, but its blocking
calls (metadata, offsets, a transaction's commit) keep retrying the connection until their own
timeout. Every client a :class:`~kafkakv.log.kafka.KafkaLog` makes has one :class:`Refusals`
as its ``error_cb``; every wait for the brokers takes a :meth:`Refusals.mark` when it starts
and calls :meth:`Refusals.check` between slices of its timeout, so it stops at the first such
report instead of at the end of the timeout.

:func:`is_refusal` and :func:`slices` are pure; :func:`speaks_tls` opens a socket.
"""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Iterator

from confluent_kafka import KafkaError

from kafkakv.errors import LogAuthenticationError
from kafkakv.log.kafka.errors import error_class, translate

__all__ = ["Refusals", "is_refusal", "slices", "speaks_tls"]

FIRST_SLICE_S = 0.25
"""The first slice of a wait; each next one is twice as long (see :func:`slices`)."""


def is_refusal(code: int, text: str) -> bool:
    """Whether a client error reported by librdkafka means the brokers refuse this client, which
    retrying cannot mend: a code :data:`.errors.TABLE` makes a
    :class:`~kafkakv.errors.LogAuthenticationError` (SASL authentication failed:
    ``_AUTHENTICATION``; a certificate not trusted: ``_SSL``), or a connection lost during
    the TLS handshake (``_TRANSPORT`` saying ``SSL handshake`` or naming the
    ``SSL_HANDSHAKE`` state: TLS spoken to a plaintext listener). A connection lost once up
    (a broker restarting) is no refusal.

    >>> is_refusal(KafkaError._SSL, "SSL handshake failed: certificate verify failed")
    True
    >>> is_refusal(KafkaError._TRANSPORT, "ssl://h:1/1: Disconnected (after 9ms in state UP)")
    False
    """
    if error_class(code) is LogAuthenticationError:
        return True
    return code == KafkaError._TRANSPORT and ("SSL handshake" in text or "SSL_HANDSHAKE" in text)


def slices(first: float = FIRST_SLICE_S) -> Iterator[float]:
    """Lengths of the successive slices of a wait: ``first``, then each twice the last.

    A blocking librdkafka call cut short is called again and sends its request again: slices
    that double make a slow answer (a loaded cluster) still arrive, while a refusal is noticed
    within about the time already waited.

    >>> from itertools import islice
    >>> list(islice(slices(0.25), 4))
    [0.25, 0.5, 1.0, 2.0]
    """
    wait = first
    while True:  # (a first slice of 0.1 s cut metadata lookups of new topics on a busy
        # machine often enough to make them fail in passing; see log._call_again)
        yield wait
        wait *= 2


class Refusals:
    """The ``error_cb`` of every client of one log: counts the reports that the brokers refuse
    it (:func:`is_refusal`) and keeps the last, and the last other connection error.

    Thread-safe: librdkafka calls it from whichever thread polls the client.
    """

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self._lock = threading.Lock()
        self._count = 0
        self._last: KafkaError | None = None
        self.last_transport: str | None = None
        """The text of the last connection error that was no refusal (``Connection refused``)."""
        self.all_down = False
        """Whether librdkafka reported that no broker is up (``_ALL_BROKERS_DOWN``)."""

    def __call__(self, err: KafkaError) -> None:
        code, text = err.code(), err.str()
        with self._lock:
            if is_refusal(code, text):
                self._count += 1
                self._last = err
            elif code == KafkaError._TRANSPORT:
                self.last_transport = text
            elif code == KafkaError._ALL_BROKERS_DOWN:
                self.all_down = True

    def mark(self) -> int:
        """The number of refusals reported so far: what a wait starting now compares with."""
        return self._count

    def check(self, mark: int) -> None:
        """Raise :class:`LogAuthenticationError` if a refusal was reported after ``mark``."""
        if self._count > mark:
            with self._lock:
                last = self._last
            what = f"the Kafka brokers at {self.bootstrap} refused this client"
            if last is None:
                raise LogAuthenticationError(f"{what}: no reason given")
            # a report to error_cb, not an exception: nothing to chain; the code is kept
            raise translate(what, last, LogAuthenticationError)


def speaks_tls(address: str, timeout: float) -> bool:
    """Whether the listener at ``host:port`` answers a TLS handshake (its certificate is not
    checked: this only tells TLS from plaintext). One connection, one round trip."""
    host, _, port = address.rpartition(":")
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with (
            socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as sock,
            context.wrap_socket(sock, server_hostname=host.strip("[]")),
        ):
            return True
    except (OSError, ValueError):  # ssl.SSLError is an OSError
        return False
