"""``KafkaLog``: the :class:`~kafkakv.log.Log` interface on an Apache Kafka cluster.

Built on confluent-kafka (librdkafka). One idempotent producer (``acks=all``) serves every
plain append; a delivery thread completes them. Reads go through one consumer per thread
(:mod:`kafkakv.log.kafka.reader`), with ``read_committed`` isolation. Fenced writers are Kafka
transactions, one producer per ``transactional.id``: opening a second writer with the same id
fences the first (``init_transactions``), and a batch is visible all at once or never.
Topics are created and described with the admin client.

Where Kafka behaves differently from the embedded log:

- ``append`` of several records runs as a transaction, so that it stays atomic; :meth:`send`
  is the fast way to append many records that stand alone.
- ``compact`` raises :class:`~kafkakv.errors.UnsupportedOperationError`: the brokers' cleaner
  decides when to compact.
- Offsets of transaction markers and aborted records are never read; :meth:`read_batch`
  reports how far a reader may step over them.
- ``end_offset`` may come from a leader that was just deposed, so it is no read barrier
  (``end_offset_is_linearizable`` is False): maps append barrier records instead.

Errors: what librdkafka raises is translated where it is called, in a ``with
translated(...)`` block, and what a delivery report or a consumer event says, by
:func:`~kafkakv.log.kafka.errors.translate`: one table (:mod:`kafkakv.log.kafka.errors`)
decides the class, the error keeps librdkafka's code (``code``, ``code_name``) and, when
there was an exception, has it as ``__cause__``.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, TypeVar, cast

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

from kafkakv.errors import (
    ClosedError,
    ConfigError,
    FencedError,
    InvalidRecordError,
    KafkaKVError,
    LogAuthenticationError,
    LogError,
    LogUnavailableError,
    OperationTimeoutError,
    RecordTooLargeError,
    UnknownPartitionError,
    UnknownTopicError,
    UnsupportedOperationError,
)
from kafkakv.lifecycle import ExitStage, at_exit
from kafkakv.log.base import Batch, CleanResult, FailureCallback, Log, LogWriter, Problem, Record
from kafkakv.log.base import TopicPartition as TP
from kafkakv.log.config import parse_topic_config, validate_topic_name
from kafkakv.log.kafka.errors import (
    error_class,
    error_of,
    kafka_exception,
    translate,
    translated,
)
from kafkakv.log.kafka.nudge import Nudge
from kafkakv.log.kafka.reader import Reader
from kafkakv.log.kafka.refusals import Refusals, slices, speaks_tls
from kafkakv.log.kafka.settings import ClientSettings, open_client
from kafkakv.log.records import CheckedRecord, check_batch

__all__ = ["KafkaLog", "KafkaLogWriter"]

log = logging.getLogger("kafkakv.log.kafka")

_PROPAGATION_S = 2.0
"""How long a topic another client just created may stay unknown to the broker asked (metadata
spreads asynchronously): lookups ask again for this long before saying there is no topic."""

_Headers = list[tuple[str, str | bytes | None]] | None  # built once, not per record
_T = TypeVar("_T")

READ_PATIENCE_S = 2.0
"""The longest a read (``read``, ``read_batch``, the positioning of ``wait_any``) waits for an
answer from the cluster that does not come (a partition's bounds from its leader, records this
process knows are stored, the end-of-partition report) before it raises
:class:`~kafkakv.errors.OperationTimeoutError`, when the log's ``timeout`` is longer. Reads take
no timeout, and a map reads with its replica lock held: with the log's whole timeout there, a
leader cut off from this host kept every call of the replica waiting for it, far past their
own timeouts (issue 44: a put of 5 s took 13). Callers that follow a partition try again; a
healthy cluster answers in milliseconds."""

_WAIT_SLICE_S = 0.1
"""How often a wait on a delivery or a flush looks for a refusal report (see .refusals)."""
_TLS_PROBE_S = 1.0
"""The longest the TLS check of a silent plaintext listener waits (see _check_reachable)."""

DEFAULT_TRANSACTION_TIMEOUT_MS = 8_000
"""How long the brokers let a writer's transaction stay open before aborting it
(``transaction.timeout.ms``). A writer that crashed mid-transaction holds back the
``read_committed`` readers of its partitions this long, plus up to the brokers'
``transaction.abort.timed.out.transaction.cleanup.interval.ms`` (0.5 s on the dev cluster;
Kafka's default is 10 s), plus the abort markers' write: at most 10 s on the dev cluster (see
docs/kafka.md for what production brokers need)."""

# Which error a code raises is .errors.TABLE's; the sets here decide what the log does.
# A transaction's error with one of these codes was a record not stored: its typed error.
_RECORD_FAILURES = {
    KafkaError.MSG_SIZE_TOO_LARGE,
    KafkaError.RECORD_LIST_TOO_LARGE,
    KafkaError._MSG_TIMED_OUT,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError._UNKNOWN_TOPIC,
    KafkaError.INVALID_RECORD,
}
_TIMED_OUT = {KafkaError._TIMED_OUT, KafkaError._TIMED_OUT_QUEUE}
# A blocking call cut short at the end of its slice fails with one of these (list_topics says
# _TRANSPORT): called again while the wait's timeout lasts (see KafkaLog._patiently).
_SLICE_EXPIRED = {KafkaError._TIMED_OUT, KafkaError._TIMED_OUT_QUEUE, KafkaError._TRANSPORT}
# A request lost with its connection (a broker closed it, or a loaded client timed it out)
# fails at once with _TRANSPORT: no broker answered it, so it is sent again like a cut one.
_CONNECTION_LOST = KafkaError._TRANSPORT
# The transaction coordinator moving or loading: librdkafka retries these itself while a
# transactional call waits; a call cut short may return them instead (see _call_again).
_COORDINATOR = {
    KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError.CONCURRENT_TRANSACTIONS,
}
# What a metadata lookup sees in passing while a topic is created or a leader moves (a broker
# that left the cluster's metadata has its handle destroyed, failing the requests queued on it).
# A leader just elected answers an offsets query with OFFSET_NOT_AVAILABLE until its high
# watermark has caught up, and brokers whose view of the leader's epoch differs from the
# client's with the two epoch errors: each is gone once the election has settled.
_IN_PASSING = {
    KafkaError._DESTROY_BROKER,
    KafkaError._UNKNOWN_PARTITION,
    KafkaError._UNKNOWN_TOPIC,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError._ALL_BROKERS_DOWN,
    KafkaError.OFFSET_NOT_AVAILABLE,
    KafkaError.FENCED_LEADER_EPOCH,
    KafkaError.UNKNOWN_LEADER_EPOCH,
}


_RECORD_FIELDS = 36
"""A record's own fields besides key, value and headers at their longest varints (length,
attributes, timestamp and offset deltas, key and value lengths, header count): what
librdkafka adds to a record before it compares it with its ``message.max.bytes``."""

_FRAMING = 61 + _RECORD_FIELDS
"""A record's bytes on the wire besides its key, value and headers when it is alone in a
record batch, which the brokers' ``max.message.bytes`` bounds as a whole: the batch header (61
bytes, format v2) and the record's fields. librdkafka packs a batch of several records up to
that limit too, so a record that fits alone is never refused."""

_PRODUCER_MAX = 1_000_000  # librdkafka's message.max.bytes unless the config sets it


@dataclass(frozen=True)
class _TopicInfo:
    partitions: int
    compact: bool
    max_message_bytes: int


class _Delivery:
    """Counts the delivery reports of one call's records; the waiter sleeps on ``done``."""

    __slots__ = ("_lock", "done", "error", "firsts", "remaining")

    def __init__(self, count: int) -> None:
        self.remaining = count
        self.firsts: dict[TP, int] = {}
        self.error: KafkaError | None = None
        self.done = threading.Event()
        self._lock = threading.Lock()  # reports come from the poll thread, discounts not

    def __call__(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            if self.error is None:
                self.error = err
        else:
            tp = (cast(str, msg.topic()), cast(int, msg.partition()))
            offset = cast(int, msg.offset())
            first = self.firsts.get(tp)
            if first is None or offset < first:
                self.firsts[tp] = offset
        self._settled(1)

    def discount(self, count: int) -> None:
        """Expect ``count`` reports fewer: rows refused when queued get none."""
        self._settled(count)

    def _settled(self, count: int) -> None:
        with self._lock:
            self.remaining -= count
            if self.remaining <= 0:
                self.done.set()


class _Failures:
    """The delivery callback of a pipelined :meth:`KafkaLog.send`: called for failed records
    only; hands each, with its error translated, to the caller's ``on_failure``."""

    __slots__ = ("_log", "_on_failure")

    def __init__(self, owner: KafkaLog, on_failure: FailureCallback) -> None:
        self._log = owner
        self._on_failure = on_failure

    def __call__(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            topic, partition = cast(str, msg.topic()), cast(int, msg.partition())
            self.report(topic, partition, msg.key(), msg.value(), err)

    def report(
        self, topic: str, partition: int, key: bytes | None, value: bytes | None, err: KafkaError
    ) -> None:
        """Hand one failed record (not delivered, or refused when queued) to ``on_failure``."""
        record = Record(key, value, partition=partition)
        try:
            self._on_failure(record, self._log._append_failure(topic, partition, err))
        except Exception:  # raised here, it would be lost in librdkafka's poll or fail others
            log.exception("on_failure of a send to %s[%d] raised", topic, partition)


_BATCH_MIN = 8  # plain rows at least this many are queued with one produce_batch call
# ...and at most this many: produce_batch holds the GIL throughout (a 300,000-row flush would
# stall every other thread of the process for half a second)
_BATCH_MAX = 10_000
_QUEUE_FULL = KafkaError._QUEUE_FULL
_PLAIN = (None, None)  # the headers and timestamp of a plain row
_meta = itemgetter(2, 3)  # a checked row's (headers, timestamp): headers are a list, unhashable


def _unreachable(
    bootstrap: str, timeout: float, exc: KafkaException, last_transport: str | None
) -> KafkaKVError:
    """The error for brokers that did not answer a first request within ``timeout``, with the
    last reason librdkafka gave for a failed connection: a
    :class:`~kafkakv.errors.LogUnavailableError` whatever the code (a timeout, a transport
    error: the brokers are not there)."""
    what = f"no Kafka broker answered at {bootstrap} within {timeout} s"
    if last_transport is not None:
        what += f" (last connection error: {last_transport})"
    return translate(what, exc, LogUnavailableError)


def _call_again(err: KafkaError | None, ran_out: bool, again: bool, resumable: bool) -> bool:
    """Whether :meth:`KafkaLog._patiently` calls again after ``err`` ended a slice early
    (``ran_out`` False) or at its end: a slice that ran out with a timeout or transport error,
    or a request its connection lost (a transport error, however quick).
    A call made ``again`` (an earlier slice was cut short) may fail fast with what its cut
    attempt saw in passing (a partition not known yet, a leader moving), which one uncut call
    would have waited through: such errors are called again too. So is, for a ``resumable``
    call, any retriable error or a coordinator moving. Never a fatal error or one that
    requires aborting the transaction.

    >>> _call_again(KafkaError(KafkaError._TIMED_OUT), True, again=False, resumable=False)
    True
    >>> _call_again(KafkaError(KafkaError._TIMED_OUT), False, again=False, resumable=False)
    False
    >>> _call_again(KafkaError(KafkaError._TRANSPORT), False, again=False, resumable=False)
    True
    >>> _call_again(KafkaError(KafkaError._UNKNOWN_PARTITION), False, True, resumable=False)
    True
    >>> _call_again(KafkaError(KafkaError.OFFSET_NOT_AVAILABLE), False, True, resumable=False)
    True
    >>> _call_again(KafkaError(KafkaError.NOT_COORDINATOR), False, False, resumable=True)
    True
    """
    if err is None or err.fatal() or err.txn_requires_abort():
        return False
    code = err.code()
    if code in _SLICE_EXPIRED and (ran_out or again or resumable or code == _CONNECTION_LOST):
        return True
    if again and code in _IN_PASSING:
        return True
    return resumable and (err.retriable() or code in _COORDINATOR)


DeliveryCallback = Callable[[KafkaError | None, Message], None]
Refused = list[tuple[CheckedRecord, KafkaError]]
"""Rows librdkafka would not queue (a fatal producer, a record over its message.max.bytes, an
unknown partition...), each with its error, in batch order."""


def _produce(
    producer: Producer,
    topic: str,
    p: int,
    rows: list[CheckedRecord],
    cb: DeliveryCallback | None,
    first: DeliveryCallback | None = None,
) -> Refused:
    """Queue every row for ``topic[p]``, in order, with ``cb`` as its delivery callback (the
    first row with ``first`` when given; None: no callback, no Python call per record); while
    the local queue is full, let deliveries drain it and go on. Returns the rows refused
    outright (they get no callback), the others being queued whatever became of those.

    A batch of plain rows (no headers, no timestamp) is queued by ``produce_batch``, one call
    into librdkafka per ``_BATCH_MAX`` rows; others record by record. When the queue fills in
    the middle of a ``produce_batch``, librdkafka refuses every row from there on, so retrying
    that tail keeps the order."""
    refused: Refused = []
    callback: dict[str, DeliveryCallback] = {} if cb is None else {"on_delivery": cb}
    if len(rows) >= _BATCH_MIN and all(meta == _PLAIN for meta in map(_meta, rows)):
        for i in range(0, len(rows), _BATCH_MAX):
            messages: list[dict[str, Any]] = [
                {"key": k, "value": v} for k, v, _, _ in rows[i : i + _BATCH_MAX]
            ]
            if i == 0 and first is not None:
                messages[0]["callback"] = first
            while messages:
                if producer.produce_batch(topic, messages, partition=p, **callback) == len(
                    messages
                ):
                    break
                tail: list[dict[str, Any]] = []
                for m in messages:
                    err = m.pop("_error", None)
                    if err is None:
                        continue
                    if err.code() == _QUEUE_FULL:  # this one and every one after it
                        tail.append(m)
                    else:
                        refused.append(((m["key"], m["value"], None, None), err))
                messages = tail
                if tail:
                    producer.poll(0.01)
        return refused
    for i, row in enumerate(rows):
        key, value, headers, ts = row
        extra = {"on_delivery": first} if i == 0 and first is not None else callback
        while True:
            try:
                producer.produce(
                    topic,
                    value,
                    key,
                    p,
                    timestamp=ts or 0,
                    headers=cast(_Headers, headers),
                    **extra,
                )
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                producer.poll(0.01)
            except KafkaException as exc:
                err = error_of(exc)
                if err is None:  # no code to refuse the row with: the caller translates it
                    raise
                refused.append((row, err))
                break
    return refused


class KafkaLog(Log):
    """A :class:`~kafkakv.log.Log` on a Kafka cluster.

    ``bootstrap``: ``host:port[,host:port...]``. ``config``: librdkafka settings for every
    client (TLS, SASL, ``client.id``...); see :mod:`kafkakv.log.kafka.settings` for the few
    kafkakv fixes. ``timeout``: the longest any call waits for the cluster (seconds); an
    append not acknowledged by then raises :class:`~kafkakv.errors.OperationTimeoutError`.
    ``replication_factor``: for topics this log creates (``-1``: the brokers' default).
    ``transaction_timeout_ms``: see :data:`DEFAULT_TRANSACTION_TIMEOUT_MS`.
    """

    end_offset_is_linearizable = False
    stores_on_send = False  # the producer pipelines: a send returns before the brokers store
    # a transaction's records go in several produce requests: others' may land between them
    appends_contiguously = False
    clock_is_local = False  # the producer or the leader broker stamps (Log.clock_is_local)

    def __init__(
        self,
        bootstrap: str,
        *,
        config: Mapping[str, Any] | None = None,
        timeout: float = 30.0,
        replication_factor: int = -1,
        transaction_timeout_ms: int = DEFAULT_TRANSACTION_TIMEOUT_MS,
    ) -> None:
        self._refusals = Refusals(bootstrap)
        self.settings = ClientSettings(bootstrap, config, timeout, error_cb=self._refusals)
        self.timeout = self.settings.timeout
        self._replication = replication_factor
        self.transaction_timeout_ms = transaction_timeout_ms
        # None once closed. close() drops these references rather than closing the clients
        # under calls of other threads (see _close_clients).
        self._admin: AdminClient | None = open_client(AdminClient, self.settings.admin())
        producer = self.settings.producer()
        self._producer: Producer | None = open_client(Producer, producer)
        self._nudge = Nudge()  # the producer's questions when an append stalls (.nudge)
        self._producer_max = int(producer.get("message.max.bytes", _PRODUCER_MAX))
        self._meta = open_client(
            Consumer, self.settings.consumer(f"kafkakv-meta-{uuid.uuid4().hex}")
        )
        self._meta_lock = threading.Lock()
        self._topics: dict[str, _TopicInfo] = {}
        self._created: dict[str, float] = {}  # see topics()
        self._local = threading.local()
        self._readers: weakref.WeakSet[Reader] = weakref.WeakSet()
        self._readers_lock = threading.Lock()
        self._batch_writer: KafkaLogWriter | None = None
        self._bulk: Producer | None = None  # for send() with on_failure: made on first use
        self._reached: dict[TP, int] = {}  # see _saw_end
        self._bulk_poller: threading.Thread | None = None
        self._batch_lock = threading.Lock()
        self._closed = False
        self._check_reachable()
        self._poller = threading.Thread(
            target=self._poll_loop, name="kafkakv-kafka-deliveries", daemon=True
        )
        self._poller.start()
        self._pid = os.getpid()
        _open_logs.add(self)

    def __repr__(self) -> str:
        return f"KafkaLog({self.settings.bootstrap!r})"

    def _check_reachable(self) -> None:
        """One metadata request, waited for in slices (:meth:`_patiently`) that serve the
        admin client's error reports: refused credentials or TLS raise
        :class:`~kafkakv.errors.LogAuthenticationError` as soon as librdkafka reports them
        (a round trip or two), not at the end of the timeout. A plaintext client whose brokers
        are all down checks, once, whether the first address speaks TLS (one handshake,
        :func:`~.refusals.speaks_tls`), and says so: such a listener closes the connection
        without a word librdkafka would pass on."""
        protocol = str(self.settings.common.get("security.protocol", "plaintext")).lower()
        probed = protocol not in ("plaintext", "sasl_plaintext")
        address = self.settings.bootstrap.split(",")[0]

        admin = self._admin_client()

        def serve() -> None:
            nonlocal probed
            admin.poll(0)  # runs error_cb: nothing else polls this client yet
            if not probed and self._refusals.all_down:
                probed = True
                if speaks_tls(address, _TLS_PROBE_S):
                    wanted = "SASL_SSL" if protocol == "sasl_plaintext" else "SSL"
                    raise LogAuthenticationError(
                        f"the Kafka broker at {address} closed the connection: the port speaks "
                        f"TLS: add security.protocol={wanted} (and ssl.ca.location)"
                    )

        try:
            self._patiently(
                f"connecting to {self.settings.bootstrap}",
                lambda wait: admin.list_topics(timeout=wait),
                serve,
            )
        except KafkaException as exc:
            self._close_clients()
            admin.poll(0)
            self._refusals.check(0)
            raise _unreachable(
                self.settings.bootstrap, self.timeout, exc, self._refusals.last_transport
            ) from exc
        except LogError:
            self._close_clients()
            raise

    def _patiently(
        self,
        what: str,
        call: Callable[[float], _T],
        serve: Callable[[], object] | None = None,
        *,
        resumable: bool = False,
        known: bool = False,
        deadline: float | None = None,
    ) -> _T:
        """``call(seconds)``, a blocking librdkafka call, within the log's ``timeout``, cut in
        slices (:func:`~.refusals.slices`: 0.25 s, then each twice the last) so that a refusal
        any client of this log reports meanwhile raises
        :class:`~kafkakv.errors.LogAuthenticationError` at the end of the slice. ``serve``
        runs between slices (to poll a client nothing else polls).

        A slice that ran out (the call waited all of it and failed with a timeout or a
        transport error; a future's ``TimeoutError``) is called again, which sends its request
        again, and so is a quick failure it waits through (see :func:`_call_again`) until the
        deadline, not only the slice; any other error, and the last one when the time is up,
        propagate as the call raised them (a timeout as
        :class:`~kafkakv.errors.OperationTimeoutError`). An answer in
        the first slice costs nothing more than the call. ``resumable``: a transactional call
        (``init_transactions``, ``commit_transaction``) that goes on in the background once
        cut short; the next call may report what went wrong meanwhile, so it is called again
        after any retriable error too (see :func:`_call_again`). ``known``: the call is about
        a partition the cluster's metadata already lists, so a broker that answers it does
        not know that partition is only behind (a topic just created, a leader just moved):
        such errors are called again as if the call had been cut short. ``deadline``: when
        the caller's time runs out (``time.monotonic``), if it started before this call."""
        if deadline is None:
            deadline = time.monotonic() + self.timeout
        left = round(max(0.0, deadline - time.monotonic()), 2)
        limit = f"{left} s" if left else "0 s: the caller's time had run out before it"
        mark = self._refusals.mark()
        again = False
        for length in slices():
            started = time.monotonic()
            remaining = deadline - started
            final = length >= remaining
            wait = max(remaining, 0.001) if final else length
            try:
                return call(wait)
            except concurrent.futures.TimeoutError as exc:
                if final:
                    raise OperationTimeoutError(f"{what}: no answer within {limit}") from exc
            except (KafkaException, SystemError) as raised:
                kafka = kafka_exception(raised)
                try:
                    if kafka is None:
                        raise
                    ran_out = time.monotonic() - started >= 0.9 * wait
                    err = error_of(kafka)
                    waits_through = _call_again(err, ran_out, again or known, resumable)
                    # A quick failure it calls again through (a leader just elected) in the
                    # last slice leaves time: the call goes on until the deadline, not the slice.
                    out_of_time = final and (ran_out or deadline - time.monotonic() < _WAIT_SLICE_S)
                    if waits_through and not out_of_time:
                        if not ran_out:  # a quick retriable failure: do not spin
                            time.sleep(min(_WAIT_SLICE_S, max(0.0, deadline - time.monotonic())))
                    elif final and not resumable and err is not None and err.code() in _TIMED_OUT:
                        raise OperationTimeoutError(  # the time it had, not the log's timeout
                            f"{what}: {err.str()} (no answer within {limit})",
                            code=err.code(),
                            code_name=err.name(),
                        ) from kafka
                    elif kafka is raised:  # as the last error, which the table gives its
                        raise  # class (leader moving: LogUnavailableError), not a plain LogError
                    else:  # a SystemError standing for it: the caller handles the real one
                        raise kafka from raised
                finally:
                    del kafka  # its traceback holds this frame: no cycle left
            again = True
            if serve is not None:
                serve()
            self._refusals.check(mark)
        raise AssertionError("slices() never ends")

    def _poll_loop(self, producer: Producer | None = None) -> None:
        """Serve ``producer``'s callbacks (deliveries, error reports) until closed; the main
        loop (no ``producer``) also serves the error reports of the admin and metadata
        clients, so that a refusal reaches :class:`Refusals` while a call waits in them."""
        main = producer is None
        admin = self._admin
        if producer is None:  # (not `or`: a Producer with nothing queued is falsy)
            producer = self._producer
        if producer is None or admin is None:  # closed before this thread started
            return
        while not self._closed:
            try:
                producer.poll(0.1)
                if main:
                    admin.poll(0)
                    if self._meta_lock.acquire(blocking=False):  # never wait behind a call
                        try:
                            self._meta.poll(0)  # nothing assigned: error reports only
                        finally:
                            self._meta_lock.release()
            except (KafkaException, SystemError, RuntimeError) as exc:  # a fatal producer error
                if self._closed:  # (RuntimeError: a client closed under the loop)
                    return
                log.error("the producer of %s failed: %s", self.settings.bootstrap, exc)
                time.sleep(0.1)

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("this KafkaLog is closed")

    def _admin_client(self) -> AdminClient:
        admin = self._admin
        if admin is None:
            raise ClosedError("this KafkaLog is closed")
        return admin

    # -- topics ---------------------------------------------------------------------------
    def create_topic(
        self, name: str, partitions: int = 1, config: Mapping[str, object] | None = None
    ) -> None:
        """Create ``name`` on the cluster and return once every partition has a leader."""
        self._check_open()
        validate_topic_name(name)
        if type(partitions) is not int or not 1 <= partitions <= 100_000:
            raise ConfigError(f"partitions must be an int from 1 to 100000, not {partitions!r}")
        parsed = parse_topic_config(config).to_kafka()
        wanted = {k: parsed[k] for k in (config or {})}
        topic = NewTopic(
            name,
            num_partitions=partitions,
            replication_factor=self._replication,
            config=wanted,
        )
        futures = self._admin_client().create_topics(
            [topic], operation_timeout=self.timeout, request_timeout=self.timeout
        )
        # TopicExistsError, or ConfigError for settings the brokers refuse (see .errors.TABLE)
        with translated(f"creating topic {name!r}"):
            self._patiently(f"creating topic {name!r}", futures[name].result)
        self._created[name] = time.monotonic()
        self._await_leaders(name, partitions)

    def _await_leaders(self, name: str, partitions: int) -> None:
        deadline = time.monotonic() + self.timeout
        while True:
            with translated(f"looking up topic {name!r}"):
                meta = self._metadata(name)
            topic = meta.topics.get(name)
            if (
                topic is not None
                and topic.error is None
                and len(topic.partitions) == partitions
                and all(p.leader >= 0 for p in topic.partitions.values())
            ):
                return
            if time.monotonic() > deadline:
                raise OperationTimeoutError(f"topic {name!r} has no leader for every partition")
            time.sleep(0.05)

    def new_topic_replication(self) -> int:
        """``replication_factor``, or the brokers' ``default.replication.factor``."""
        if self._replication > 0:
            return self._replication
        self._check_open()
        what = "reading the brokers' defaults"
        with translated(what):
            meta = self._metadata()
            if not meta.brokers:
                raise LogUnavailableError(f"{what}: the cluster's metadata names no broker")
            broker = ConfigResource(ResourceType.BROKER, str(next(iter(meta.brokers))))
            entries = self._patiently(
                what,
                self._admin_client()
                .describe_configs([broker], request_timeout=self.timeout)[broker]
                .result,
            )
        entry = entries.get("default.replication.factor")
        self._replication = int(entry.value) if entry is not None and entry.value else 1
        return self._replication

    def topics(self) -> list[str]:
        """Every topic except Kafka's internal ones (``__consumer_offsets``...), sorted.

        A listing includes the topics this log created: the broker asked may not have heard of
        one yet (metadata spreads asynchronously), so within ``_PROPAGATION_S`` of a creation
        a listing without it asks again (within the log's timeout)."""
        return sorted(self._listing())

    def topic_partitions(self) -> dict[str, int]:
        """Every topic of :meth:`topics` with its number of partitions, from one metadata
        answer (a topic being deleted, which the answer gives with an error, is left out)."""
        return {
            name: len(topic.partitions)
            for name, topic in sorted(self._listing().items())
            if topic.error is None
        }

    def _listing(self) -> dict[str, Any]:
        """The cluster's topics but Kafka's internal ones, by name (``TopicMetadata``), once
        the topics this log created are among them (see :meth:`topics`)."""
        self._check_open()
        deadline = time.monotonic() + self.timeout
        while True:
            with translated("listing topics"):
                meta = self._metadata()
            now = time.monotonic()
            for name, created in list(self._created.items()):
                if now - created > _PROPAGATION_S:  # every broker has heard of it by now
                    self._created.pop(name, None)
            if self._created.keys() <= meta.topics.keys() or now > deadline:
                return {n: t for n, t in meta.topics.items() if not n.startswith("__")}
            time.sleep(0.05)  # the next broker asked may lag too: the names stay watched

    def partitions(self, topic: str) -> int:
        return self._info(topic).partitions

    def topic_config(self, topic: str) -> dict[str, str]:
        """Every config entry of ``topic`` as the brokers report it (fresh, not cached)."""
        return self._load(topic)[1]

    def _info(self, topic: str) -> _TopicInfo:
        """Partition count and the settings appends check, cached per topic."""
        self._check_open()
        info = self._topics.get(topic)
        return info if info is not None else self._load(topic)[0]

    def _load(self, topic: str) -> tuple[_TopicInfo, dict[str, str]]:
        """Ask the cluster for ``topic``'s metadata and config; cache what appends check."""
        self._check_open()
        if not isinstance(topic, str):
            raise UnknownTopicError(f"no topic {topic!r}")
        deadline = time.monotonic() + _PROPAGATION_S
        while True:
            with translated(f"looking up topic {topic!r}"):
                meta = self._metadata(topic)
            found = meta.topics.get(topic)
            if found is not None and found.error is None:
                break
            if time.monotonic() > deadline:  # see _PROPAGATION_S
                raise UnknownTopicError(f"no topic {topic!r} on {self.settings.bootstrap}")
            time.sleep(0.05)
        config = self._describe(topic)
        info = _TopicInfo(
            partitions=len(found.partitions),
            compact="compact" in config.get("cleanup.policy", ""),
            max_message_bytes=int(config.get("max.message.bytes", "1048588")),
        )
        self._topics[topic] = info
        return info, config

    def _describe(self, topic: str) -> dict[str, str]:
        resource = ConfigResource(ResourceType.TOPIC, topic)
        deadline = time.monotonic() + _PROPAGATION_S
        while True:
            try:
                with translated(f"describing topic {topic!r}"):
                    entries = self._patiently(
                        f"describing topic {topic!r}",
                        self._admin_client()
                        .describe_configs([resource], request_timeout=self.timeout)[resource]
                        .result,
                    )
                return {
                    name: "" if e.value is None else str(e.value) for name, e in entries.items()
                }
            except UnknownTopicError:  # see _PROPAGATION_S
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def _metadata(self, topic: str | None = None) -> Any:
        """Fresh cluster metadata, of one topic or all (a ``ClusterMetadata``); raises
        ``KafkaException`` as ``list_topics`` does, or a refusal (:meth:`_patiently`)."""
        admin = self._admin_client()
        if topic is None:
            return self._patiently("listing topics", lambda t: admin.list_topics(timeout=t))
        return self._patiently(
            f"looking up topic {topic!r}",
            lambda t: admin.list_topics(topic=topic, timeout=t),
        )

    def _partition(self, topic: str, partition: int) -> _TopicInfo:
        info = self._info(topic)
        if type(partition) is not int or not 0 <= partition < info.partitions:
            raise UnknownPartitionError(
                f"topic {topic!r} has no partition {partition} "
                f"(it has {info.partitions}: 0..{info.partitions - 1})"
            )
        return info

    # -- records --------------------------------------------------------------------------
    def _checked(
        self, topic: str, partition: int, records: Sequence[Record]
    ) -> list[CheckedRecord]:
        info = self._partition(topic, partition)
        return check_batch(
            records,
            max_message_bytes=info.max_message_bytes,
            null_keys=not info.compact,
            overhead=_FRAMING,
        )

    def record_room(self, topic: str) -> int:
        """See :meth:`Log.record_room`: the topic's ``max.message.bytes`` less a record
        batch's framing of one record, or the producer's ``message.max.bytes`` less a record's
        fields if that is less (librdkafka refuses larger records as it queues them)."""
        topic_room = self._info(topic).max_message_bytes - _FRAMING
        return min(topic_room, self._producer_max - _RECORD_FIELDS)

    def append(
        self,
        topic: str,
        partition: int,
        records: Sequence[Record],
        *,
        timeout: float | None = None,
    ) -> int:
        """One record: an idempotent produce. Several: one transaction, so all or none.

        ``timeout`` shortens the wait for the acknowledgement of one record (librdkafka keeps
        trying until the log's ``timeout``, so a record not acknowledged in time may still be
        stored); a transaction is bounded by the log's own timeouts."""
        rows = self._checked(topic, partition, records)
        if len(rows) > 1:
            writer = self._writer_for_batches()
            return writer.append_checked({(topic, partition): rows})[(topic, partition)]
        return self._deliver(topic, partition, rows, timeout)

    def send(
        self,
        topic: str,
        partition: int,
        records: Sequence[Record],
        on_failure: FailureCallback | None = None,
        *,
        timeout: float | None = None,
    ) -> None:
        """Produce every record (in order, idempotently). Without ``on_failure``, wait for all
        acknowledgements (``timeout`` as for :meth:`append`); with it, return once librdkafka
        has queued them.

        The pipelined form uses a second producer that reports failed records only
        (``delivery.report.only.error``), so a record that is stored costs no Python call at
        all; a failed one is passed to ``on_failure`` from that producer's poll thread.
        """
        rows = self._checked(topic, partition, records)
        if on_failure is None:
            self._deliver(topic, partition, rows, timeout)
            return
        failures = _Failures(self, on_failure)
        with translated(f"append to {topic}[{partition}]"):
            refused = _produce(self._bulk_producer(), topic, partition, rows, failures)
        for (key, value, _, _), err in refused:
            failures.report(topic, partition, key, value, err)

    def _bulk_producer(self) -> Producer:
        with self._batch_lock:
            self._check_open()
            if self._bulk is None:
                config = self.settings.producer()
                config["delivery.report.only.error"] = True
                self._bulk = open_client(Producer, config)
                self._bulk_poller = threading.Thread(
                    target=self._poll_loop,
                    args=(self._bulk,),
                    name="kafkakv-kafka-send-failures",
                    daemon=True,
                )
                self._bulk_poller.start()
            return self._bulk

    def _deliver(
        self, topic: str, partition: int, rows: list[CheckedRecord], timeout: float | None = None
    ) -> int:
        delivery = _Delivery(len(rows))
        producer = self._producer
        if producer is None:
            raise ClosedError("this KafkaLog is closed")
        with translated(f"append to {topic}[{partition}]"):
            refused = _produce(producer, topic, partition, rows, delivery)
        # Rows refused outright fail the call, but only once the others it queued are settled
        # (stored or failed): a caller that sees the error must not see them land later.
        delivery.discount(len(refused))
        # librdkafka gives up at message.timeout.ms (= timeout); the margin is for the report.
        # Waited in slices, for a refusal the poll thread serves meanwhile (see .refusals).
        # A caller's shorter timeout cuts the wait; otherwise librdkafka's own report (at
        # message.timeout.ms = the log's timeout) comes first, with its reason.
        limit = self.timeout + 5
        if timeout is not None and timeout < self.timeout:
            limit = max(timeout, 0.0)
        began = time.monotonic()
        deadline = began + limit
        mark = self._refusals.mark()
        while not delivery.done.wait(_WAIT_SLICE_S):
            self._refusals.check(mark)
            self._nudge.stalled(producer, topic, began)  # see .nudge
            if time.monotonic() > deadline:
                raise OperationTimeoutError(
                    f"append to {topic}[{partition}] not acknowledged in time ({limit:g} s); "
                    "librdkafka may still store it"
                )
        error = refused[0][1] if refused else delivery.error
        if error is not None:
            raise self._append_failure(topic, partition, error)
        first = delivery.firsts[(topic, partition)]
        self._saw_end(topic, partition, first + len(rows))
        return first

    def _saw_end(self, topic: str, partition: int, end: int) -> None:
        """Note that ``topic[partition]`` is known to reach ``end``: this process's own records
        were stored up to there, or a broker reported that end (``end_offset``). Its readers
        then wait for the records below it rather than report the end of the partition before
        (a consumer may not have fetched them yet): reads never go back behind what this log
        already said, to one thread or another."""
        key = (topic, partition)
        if self._reached.get(key, -1) < end:  # racing callers: a lower end is harmless
            self._reached[key] = end

    def _append_failure(self, topic: str, partition: int, err: KafkaError) -> KafkaKVError:
        return self._record_failure(f"append to {topic}[{partition}]", err, topic)

    def _record_failure(
        self, where: str, err: KafkaError, topic: str | None = None
    ) -> KafkaKVError:
        """The error for records the brokers or librdkafka did not store (translated; no
        exception to chain: a delivery report or a refusal gives a bare ``KafkaError``).
        A record too large or a topic unknown forgets ``topic``'s looked-up settings, or
        every topic's without one (a transaction's failure)."""
        error = translate(where, err)
        if isinstance(error, RecordTooLargeError | UnknownTopicError):
            if topic is None:  # its max.message.bytes may have changed, or it is gone
                self._topics.clear()
            else:
                self._topics.pop(topic, None)
        return error

    def _writer_for_batches(self) -> KafkaLogWriter:
        with self._batch_lock:
            if self._batch_writer is None:
                self._batch_writer = KafkaLogWriter(self, f"kafkakv-append-{uuid.uuid4().hex}")
            return self._batch_writer

    def _reader(self) -> Reader:
        self._check_open()
        reader: Reader | None = getattr(self._local, "reader", None)
        if reader is None or reader.closed:
            patience = min(self.timeout, READ_PATIENCE_S)
            reader = Reader(
                self.settings.consumer(f"kafkakv-reader-{uuid.uuid4().hex}"),
                patience,
                self._bounds,
                self._reached,
                self._refusals,
            )
            self._local.reader = reader
            with self._readers_lock:
                self._readers.add(reader)
        return reader

    def read(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_records: int = 500,
        max_bytes: int = 1 << 20,
    ) -> list[Record]:
        return self.read_batch(
            topic, partition, offset, max_records=max_records, max_bytes=max_bytes
        ).records

    def read_batch(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_records: int = 500,
        max_bytes: int = 1 << 20,
    ) -> Batch:
        self._partition(topic, partition)
        with translated(f"reading {topic}[{partition}] at offset {offset}"):
            return self._reader().read(topic, partition, offset, max_records, max_bytes)

    def read_within(
        self,
        topic: str,
        partition: int,
        offset: int,
        timeout: float,
        *,
        max_records: int = 500,
        max_bytes: int = 1 << 20,
    ) -> Batch:
        self._partition(topic, partition)
        with translated(f"reading {topic}[{partition}] at offset {offset}"):
            reader = self._reader()
            patience = max(0.001, min(timeout, reader.timeout))
            return reader.read(topic, partition, offset, max_records, max_bytes, patience)

    def _bounds(self, topic: str, partition: int, timeout: float | None = None) -> tuple[int, int]:
        """The partition's low and high watermarks, asked of its leader, within ``timeout``
        (None: the log's): the wait for the metadata client (one request at a time) counts
        towards it.

        The metadata client is assigned nothing, so librdkafka learns a new leader for it only
        when asked: between slices of the wait its view of the topic is fetched again, else a
        killed leader would keep the query waiting on it until the periodic refresh, minutes
        later."""
        limit = self.timeout if timeout is None else max(0.0, timeout)
        deadline = time.monotonic() + limit
        tp = TopicPartition(topic, partition)
        what = f"asking the offsets of {topic}[{partition}]"

        def between_slices() -> None:
            self._meta.poll(0)  # the poll thread cannot while this holds the lock
            left = deadline - time.monotonic()
            if left > 0:
                with contextlib.suppress(KafkaException):  # the next slice says what is wrong
                    self._meta.list_topics(topic, timeout=min(left, _WAIT_SLICE_S * 10))

        if not self._meta_lock.acquire(timeout=limit):
            raise OperationTimeoutError(
                f"{what}: no answer within {limit} s (queued behind other requests of "
                "this log's metadata client)"
            )
        try:
            with translated(what):
                low, high = self._patiently(
                    what,
                    lambda t: self._meta.get_watermark_offsets(tp, timeout=t, cached=False),
                    between_slices,
                    known=True,  # the callers checked the partition against the metadata
                    deadline=deadline,
                )
        finally:
            self._meta_lock.release()
        self._saw_end(topic, partition, int(high))
        return int(low), int(high)

    def start_offset(self, topic: str, partition: int) -> int:
        self._partition(topic, partition)
        return self._bounds(topic, partition)[0]

    def end_offset(self, topic: str, partition: int, *, timeout: float | None = None) -> int:
        """The last stable offset: one past the last record a ``read_committed`` reader may
        see now (the high watermark, unless a transaction is open on the partition)."""
        self._partition(topic, partition)
        return self._bounds(topic, partition, timeout)[1]

    def wait(self, topic: str, partition: int, offset: int, timeout: float | None) -> bool:
        return bool(self.wait_any({(topic, partition): offset}, timeout))

    def wait_any(self, positions: Mapping[TP, int], timeout: float | None) -> set[TP]:
        for topic, partition in positions:
            self._partition(topic, partition)
        with translated(f"waiting for records of {len(positions)} partition(s)"):
            ready = self._reader().wait_any(dict(positions), timeout)
        self._check_open()
        return ready

    def writer(self, transactional_id: str, *, timeout: float | None = None) -> LogWriter:
        """A transactional writer; ``timeout`` is not used: opening one is bounded by the log's
        own ``timeout`` (``init_transactions``)."""
        self._check_open()
        if not isinstance(transactional_id, str) or not transactional_id:
            raise ConfigError("a transactional id is a non-empty str")
        return KafkaLogWriter(self, transactional_id)

    # -- maintenance ----------------------------------------------------------------------
    def compact(self, topic: str, partition: int | None = None) -> list[CleanResult]:
        raise UnsupportedOperationError(
            "Kafka's brokers compact on their own schedule (min.cleanable.dirty.ratio, "
            "segment.ms); kafkakv cannot start their cleaner"
        )

    def check(self) -> list[Problem]:
        """Partitions without a leader, or with fewer in-sync replicas than replicas."""
        self._check_open()
        with translated("listing topics"):
            meta = self._metadata()
        problems = []
        for name, topic in sorted(meta.topics.items()):
            if topic.error is not None:
                problems.append(Problem(name, None, "metadata", str(topic.error)))
                continue
            for p, part in sorted(topic.partitions.items()):
                if part.leader < 0:
                    problems.append(Problem(name, p, "leader", "the partition has no leader"))
                elif len(part.isrs) < len(part.replicas):
                    problems.append(
                        Problem(
                            name,
                            p,
                            "replicas",
                            f"{len(part.isrs)} of {len(part.replicas)} replicas in sync",
                        )
                    )
        return problems

    # -- lifecycle ------------------------------------------------------------------------
    def close(self) -> None:
        """Close every client: readers, writers kafkakv made, the producer (after up to
        ``timeout`` for records in flight) and the admin client. Idempotent."""
        if self._closed:
            return
        self._closed = True
        _open_logs.discard(self)
        self._poller.join(timeout=1)
        if self._bulk_poller is not None:
            self._bulk_poller.join(timeout=1)
        self._close_clients()

    def _close_clients(self) -> None:
        """Close the readers and writers, flush the producers, and drop this log's references
        to its producers and admin client. librdkafka frees a client in its ``close()`` even
        while another thread's call runs in it (confluent-kafka-python issue 1797: a
        segfault); dropped, a client is destroyed by whichever thread lets go of it last: here
        at once, or at the end of a call still in flight, never under one. Kept instead, a
        closed log's clients went on running (threads, connections retried to a stopped
        cluster) until the garbage collector, or the interpreter's exit, destroyed them."""
        with self._readers_lock:
            readers = list(self._readers)
        for reader in readers:
            reader.close()
        if self._batch_writer is not None:
            self._batch_writer.close()
        with self._batch_lock:
            producers = [p for p in (self._producer, self._bulk) if p is not None]
            self._producer = self._bulk = None
        while producers:  # (popped: no name keeps the last one alive)
            remaining = producers.pop().flush(min(self.timeout, 5.0))
            if remaining:
                log.warning("closing with %d records not acknowledged", remaining)
        self._admin = None
        with self._meta_lock:
            self._meta.close()


_open_logs: weakref.WeakSet[KafkaLog] = weakref.WeakSet()


def _close_at_exit() -> None:
    """Close the logs the program left open (flushing what they still hold, as
    :meth:`KafkaLog.close` does) while the interpreter is whole: a client destroyed during
    its finalization could call back into a half-torn-down interpreter (the admin client's
    results arrive on a librdkafka thread). A log inherited through fork is left alone: its
    clients' threads stayed in the parent."""
    for kafka_log in list(_open_logs):
        if kafka_log._pid == os.getpid():
            try:
                kafka_log.close()
            except Exception as exc:
                log.warning("closing %r at exit failed: %s", kafka_log, exc)


at_exit(ExitStage.RELEASE, _close_at_exit)


class KafkaLogWriter(LogWriter):
    """A Kafka transactional producer: one transaction per :meth:`append`."""

    def __init__(self, owner: KafkaLog, transactional_id: str) -> None:
        self._log = owner
        self._id = transactional_id
        self._lock = threading.Lock()
        self._fenced: FencedError | None = None
        self._closed = False
        self._producer = self._open()

    def _open(self) -> Producer:
        owner = self._log
        producer = open_client(
            Producer, owner.settings.transactional(self._id, owner.transaction_timeout_ms)
        )
        what = f"opening transactional writer {self._id!r}"
        with translated(what):  # fences every earlier producer with this id; aborts its open
            # transaction (called again after a slice that timed out: librdkafka goes on)
            owner._patiently(
                what, producer.init_transactions, lambda: producer.poll(0), resumable=True
            )
        return producer

    @property
    def transactional_id(self) -> str:
        return self._id

    def append(
        self, batches: Mapping[TP, Sequence[Record]], *, timeout: float | None = None
    ) -> dict[TP, int]:
        """One transaction; bounded by the log's ``timeout`` and the transaction timeout, not
        by ``timeout`` (an abandoned commit would leave readers held, see docs/kafka.md)."""
        if self._closed:  # before the records are checked, as on every log
            raise ClosedError(f"writer {self._id!r} is closed")
        checked = {
            (topic, p): self._log._checked(topic, p, records)
            for (topic, p), records in batches.items()
        }
        if not checked:
            raise InvalidRecordError("a writer append needs at least one partition")
        return self.append_checked(checked)

    def append_checked(self, batches: Mapping[TP, list[CheckedRecord]]) -> dict[TP, int]:
        with self._lock:
            if self._closed:
                raise ClosedError(f"writer {self._id!r} is closed")
            if self._fenced is not None:
                first = self._fenced
                raise FencedError(
                    f"writer {self._id!r} was fenced: {first}",
                    code=first.code,
                    code_name=first.code_name,
                ) from first
            try:
                return self._transaction(batches)
            except (KafkaException, SystemError) as raised:
                # (confluent-kafka runs the delivery callbacks of a fenced producer with its
                # fatal error still set: a SystemError standing for it, see kafka_exception).
                # No local holds the exception: its traceback holds this frame, which would
                # keep the writer alive until a cyclic collection.
                if kafka_exception(raised) is None:
                    raise
                raise self._transaction_failure(
                    cast(KafkaException, kafka_exception(raised))
                ) from kafka_exception(raised)

    def _transaction(self, batches: Mapping[TP, list[CheckedRecord]]) -> dict[TP, int]:
        """One transaction. Only the first record of each partition has a delivery callback
        (it gives the offset ``append`` returns): a callback per record costs a Python call
        each, a third of a flush's time. The others' fate comes from the transaction: if one
        is not stored, librdkafka will not commit and raises the record's error instead."""
        producer = self._producer
        firsts = _Delivery(len(batches))
        producer.begin_transaction()
        # A read_committed reader of a partition stops at the first record of a transaction
        # still open there. The last partition's records are produced only once the others
        # are stored, so its readers wait for one round trip and the commit, not for the
        # whole transaction (the map's flush: many data records, then one FLUSHED mark on
        # the ops partition that every replica is reading).
        items = list(batches.items())
        for phase in (items[:-1], items[-1:]):
            for (topic, p), rows in phase:
                refused = _produce(producer, topic, p, rows, None, first=firsts)
                if refused:
                    err = refused[0][1]
                    if err.fatal() or error_class(err.code()) is FencedError:
                        raise KafkaException(err)  # for _transaction_failure: fenced or broken
                    self._abort()
                    raise self._log._append_failure(topic, p, err)
            if phase:
                self._flush(producer)  # every record of the phase stored, or failed
            if firsts.error is not None:
                break  # the commit raises the transaction's error (the first failed record's)
        try:  # (called again after a slice that timed out: the commit goes on meanwhile)
            self._log._patiently(
                f"committing a transaction of writer {self._id!r}",
                producer.commit_transaction,
                lambda: producer.poll(0),
                resumable=True,
            )
        except KafkaException as exc:  # the first record's fate, should the commit's hide it
            raise self._transaction_failure(exc, firsts.error) from exc
        if firsts.error is not None:  # librdkafka committed after a failed record: cannot be
            raise translate(
                f"writer {self._id!r} committed although a record failed", firsts.error, LogError
            )
        offsets = {tp: firsts.firsts[tp] for tp in batches}
        for (topic, p), rows in batches.items():
            self._log._saw_end(topic, p, offsets[(topic, p)] + len(rows))
        self._await_visible({tp: offsets[tp] + len(rows) for tp, rows in batches.items()})
        return offsets

    def _flush(self, producer: Producer) -> None:
        """Wait until every queued record is stored or failed (up to the log's timeout), in
        slices: a flush serves the producer's callbacks, refusal reports included, and stops
        at the first (:class:`~kafkakv.errors.LogAuthenticationError`)."""
        refusals = self._log._refusals
        mark = refusals.mark()
        deadline = time.monotonic() + self._log.timeout
        while producer.flush(min(_WAIT_SLICE_S, max(0.0, deadline - time.monotonic()))):
            refusals.check(mark)
            if time.monotonic() >= deadline:
                return  # the commit reports the records not stored

    def _await_visible(self, ends: Mapping[TP, int]) -> None:
        """Return once every partition's last stable offset reaches ``ends``.

        ``commit_transaction`` returns when the coordinator has decided; the commit markers
        that make the records readable to ``read_committed`` readers are written after. The
        Log contract (and the embedded log) has a writer's records readable when its append
        returns, so wait for them: a few milliseconds, once per transaction.
        """
        deadline = time.monotonic() + self._log.timeout
        for (topic, p), end in ends.items():
            while self._log._bounds(topic, p)[1] < end:
                if time.monotonic() > deadline:
                    raise OperationTimeoutError(
                        f"writer {self._id!r} committed, but {topic}[{p}] did not become "
                        f"readable within {self._log.timeout} s"
                    )
                time.sleep(0.002)

    def _transaction_failure(
        self, exc: KafkaException, cause: KafkaError | None = None
    ) -> KafkaKVError:
        """The error to raise (``from exc``) for a failed transaction, aborted here when it
        must be. A fatal error is a :class:`~kafkakv.errors.FencedError` whatever its code:
        the producer cannot go on, and this writer fails every later append. ``cause``: what
        a record's delivery report said, when the commit's error may hide it."""
        where = f"transaction of writer {self._id!r}"
        err = error_of(exc)
        fatal = err is not None and err.fatal()
        error = translate(where, exc, FencedError if fatal else None)
        if isinstance(error, FencedError):
            # Kept as a copy never raised: the error raised gets a traceback whose frames hold
            # this writer, and the writer holding it would keep itself (and its producer's
            # threads and sockets) alive after its owner let go, until a cyclic collection.
            self._fenced = FencedError(str(error), code=error.code, code_name=error.code_name)
            return error
        if err is not None and err.txn_requires_abort():
            self._abort()
            if err.code() not in _RECORD_FAILURES and cause is not None:
                err = cause  # e.g. "skipped sequence numbers" after the record that failed
            if err.code() in _RECORD_FAILURES:  # a record was refused or never acknowledged
                self._renew()
                return self._log._record_failure(where, err)
        return error

    def _renew(self) -> None:
        """Replace the producer after a transaction lost a record. Its abort is not always
        enough: librdkafka may fail the next transaction too ("skipped sequence numbers");
        a new producer with the same id starts clean (and fences the old one)."""
        try:
            fresh = self._open()
        except LogError as exc:  # the next append reports what is wrong
            log.warning("could not renew writer %s: %s", self._id, exc)
            return
        old, self._producer = self._producer, fresh
        self._discard(old, 0)  # fenced by the new one: its errors are expected

    def _abort(self) -> None:
        try:
            self._producer.abort_transaction(self._log.timeout)
        except (KafkaException, SystemError) as raised:  # (no local holds it: see above)
            if kafka_exception(raised) is None:
                raise
            log.warning("aborting a transaction of %s failed: %s", self._id, _text(raised))

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._discard(self._producer, min(self._log.timeout, 5.0))
            # Every use holds this lock and checks _closed first: the last reference goes
            # (the client is destroyed now, unless a kept error's frames still hold it).
            del self._producer

    def _discard(self, producer: Producer, wait: float) -> None:
        """Flush ``producer`` for up to ``wait`` seconds and give up what is left: the caller
        then lets go of it. Not ``Producer.close()``: that aborts an open transaction and
        flushes with no time limit of its own, against a cluster that may be gone."""
        try:
            if producer.flush(wait):
                producer.purge()
        except (KafkaException, SystemError) as raised:  # a fenced one reports its error again
            if kafka_exception(raised) is None:
                raise
            log.debug("closing a producer of writer %s: %s", self._id, _text(raised))


def _text(exc: BaseException) -> str:
    err = error_of(kafka_exception(exc) or exc)
    return err.str() if err is not None else str(exc)
