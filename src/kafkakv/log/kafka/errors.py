"""librdkafka's errors as kafkakv's: one table, one function, one context manager.

Every error of the Kafka log that comes from librdkafka goes through :func:`translate`, which
looks the error's code up in :data:`TABLE` (a code missing from it is a :data:`DEFAULT`,
a plain :class:`~kafkakv.errors.LogError`). The error it returns has the message ``"<what>:
<librdkafka's text>"``, followed by the table's hint for the code (:data:`HINTS`) if any, and
carries the code as ``code`` and its name as ``code_name``. :class:`translated` is the
boundary: a ``with`` block whose ``KafkaException`` leaves it as that error, raised ``from``
the original. What is not a ``KafkaException`` passes through it untouched.

>>> from confluent_kafka import KafkaError, KafkaException
>>> try:
...     with translated("creating topic 'prices'"):
...         raise KafkaException(KafkaError(KafkaError.TOPIC_ALREADY_EXISTS))
... except TopicExistsError as exc:
...     print(exc.code, exc.code_name, type(exc.__cause__).__name__)
36 TOPIC_ALREADY_EXISTS KafkaException

Pure: no I/O, no threads. Deciding whether to call again (:mod:`kafkakv.log.kafka.log`'s
``_call_again``) and noticing a refused client (:mod:`~kafkakv.log.kafka.refusals`) are not
translations; they stay where the waiting is done.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType

from confluent_kafka import KafkaError, KafkaException

from kafkakv.errors import (
    ConfigError,
    FencedError,
    InvalidRecordError,
    KafkaKVError,
    LogAuthenticationError,
    LogError,
    LogUnavailableError,
    OffsetOutOfRangeError,
    OperationTimeoutError,
    RecordTooLargeError,
    TopicExistsError,
    UnknownPartitionError,
    UnknownTopicError,
)

__all__ = [
    "DEFAULT",
    "HINTS",
    "TABLE",
    "error_class",
    "error_of",
    "kafka_exception",
    "translate",
    "translated",
]

TABLE: Mapping[int, type[KafkaKVError]] = {
    # topics
    KafkaError.TOPIC_ALREADY_EXISTS: TopicExistsError,
    KafkaError.INVALID_REPLICATION_FACTOR: ConfigError,
    KafkaError.INVALID_PARTITIONS: ConfigError,
    KafkaError.INVALID_CONFIG: ConfigError,
    KafkaError.POLICY_VIOLATION: ConfigError,
    KafkaError.UNKNOWN_TOPIC_OR_PART: UnknownTopicError,
    KafkaError._UNKNOWN_TOPIC: UnknownTopicError,
    KafkaError._UNKNOWN_PARTITION: UnknownPartitionError,
    # records
    KafkaError.MSG_SIZE_TOO_LARGE: RecordTooLargeError,
    KafkaError.RECORD_LIST_TOO_LARGE: RecordTooLargeError,
    KafkaError.INVALID_RECORD: InvalidRecordError,
    KafkaError.OFFSET_OUT_OF_RANGE: OffsetOutOfRangeError,
    KafkaError._AUTO_OFFSET_RESET: OffsetOutOfRangeError,
    # waits
    KafkaError._TIMED_OUT: OperationTimeoutError,
    KafkaError._TIMED_OUT_QUEUE: OperationTimeoutError,
    KafkaError._MSG_TIMED_OUT: OperationTimeoutError,
    # transactional writers
    KafkaError.PRODUCER_FENCED: FencedError,
    KafkaError._FENCED: FencedError,
    KafkaError.INVALID_PRODUCER_EPOCH: FencedError,
    KafkaError.INVALID_PRODUCER_ID_MAPPING: FencedError,
    # brokers down, leaders moving, too few in-sync replicas: worth retrying later
    KafkaError._ALL_BROKERS_DOWN: LogUnavailableError,
    KafkaError._TRANSPORT: LogUnavailableError,
    KafkaError._DESTROY_BROKER: LogUnavailableError,  # a request to a broker that went away
    KafkaError.BROKER_NOT_AVAILABLE: LogUnavailableError,
    KafkaError.LEADER_NOT_AVAILABLE: LogUnavailableError,
    KafkaError.NOT_LEADER_FOR_PARTITION: LogUnavailableError,
    KafkaError.OFFSET_NOT_AVAILABLE: LogUnavailableError,  # a leader just elected
    KafkaError.FENCED_LEADER_EPOCH: LogUnavailableError,
    KafkaError.UNKNOWN_LEADER_EPOCH: LogUnavailableError,
    KafkaError.NOT_ENOUGH_REPLICAS: LogUnavailableError,
    KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND: LogUnavailableError,
    # the brokers refuse this client: a setting to fix, not a wait
    KafkaError._AUTHENTICATION: LogAuthenticationError,
    KafkaError._SSL: LogAuthenticationError,
    KafkaError.SASL_AUTHENTICATION_FAILED: LogAuthenticationError,
}
"""librdkafka's error code (``KafkaError.code()``) -> the kafkakv error it raises as.

Not in the table, on purpose: the transaction coordinator's codes (``NOT_COORDINATOR``,
``CONCURRENT_TRANSACTIONS``...), which the log calls again through while its timeout lasts and
which are a plain :class:`~kafkakv.errors.LogError` after (a map's flush decides again once on
a LogError, not on a LogUnavailableError); ``_INVALID_ARG``, a setting only when a client is
made (:func:`kafkakv.log.kafka.settings.open_client` says so there)."""

DEFAULT: type[KafkaKVError] = LogError
"""The class of a code missing from :data:`TABLE`, and of a ``KafkaException`` without a
``KafkaError`` in it."""

HINTS: Mapping[int, str] = {
    KafkaError.MSG_SIZE_TOO_LARGE: "see the topic's max.message.bytes",
    KafkaError.RECORD_LIST_TOO_LARGE: "see the topic's max.message.bytes",
    KafkaError.OFFSET_OUT_OF_RANGE: "retention removed the records asked for",
    KafkaError._AUTO_OFFSET_RESET: "retention removed the records asked for",
    KafkaError._TIMED_OUT: "no answer within the log's timeout",
    KafkaError._TIMED_OUT_QUEUE: "no answer within the log's timeout",
    KafkaError._MSG_TIMED_OUT: "not acknowledged within the log's timeout: are enough brokers "
    "up for the topic's min.insync.replicas?",
    KafkaError.PRODUCER_FENCED: "fenced by a newer writer with the same transactional id",
    KafkaError._FENCED: "fenced by a newer writer with the same transactional id",
    KafkaError.INVALID_PRODUCER_EPOCH: "fenced by a newer writer with the same transactional id",
    KafkaError.INVALID_PRODUCER_ID_MAPPING: "fenced: the brokers forgot this writer's id",
    KafkaError.INVALID_REPLICATION_FACTOR: "the cluster refused the topic's settings",
    KafkaError.INVALID_PARTITIONS: "the cluster refused the topic's settings",
    KafkaError.INVALID_CONFIG: "the cluster refused the topic's settings",
    KafkaError.POLICY_VIOLATION: "the cluster refused the topic's settings",
}
"""What a message adds to librdkafka's text for a code: why it is that class, or what to check.
Added only when the class is the table's (not a caller's ``cls``)."""


def error_class(code: int) -> type[KafkaKVError]:
    """The class :data:`TABLE` gives ``code``, or :data:`DEFAULT`.

    >>> error_class(KafkaError.NOT_ENOUGH_REPLICAS).__name__
    'LogUnavailableError'
    >>> error_class(KafkaError.NOT_COORDINATOR).__name__
    'LogError'
    """
    return TABLE.get(code, DEFAULT)


def error_of(exc: BaseException) -> KafkaError | None:
    """The ``KafkaError`` a ``KafkaException`` holds (its first argument), or None.

    >>> error_of(KafkaException(KafkaError(KafkaError._TRANSPORT))).name()
    '_TRANSPORT'
    >>> error_of(KafkaException("no KafkaError in here")) is None
    True
    """
    err = exc.args[0] if exc.args else None
    return err if isinstance(err, KafkaError) else None


def kafka_exception(exc: BaseException) -> KafkaException | None:
    """The ``KafkaException`` that ``exc`` stands for: itself, or the one a ``SystemError``
    has as its cause; None for anything else.

    confluent-kafka runs some of kafkakv's callbacks (``error_cb``, delivery reports) while its
    own exception is already set, as a fenced producer's fatal error: the callback's first
    checked call then raises a ``SystemError`` ("returned a result with an exception set")
    chained to that exception, and the client's call raises the ``SystemError``.

    >>> fenced = KafkaException(KafkaError(KafkaError._FENCED))
    >>> kafka_exception(fenced) is fenced
    True
    >>> try:
    ...     raise SystemError("returned a result with an exception set") from fenced
    ... except SystemError as exc:
    ...     kafka_exception(exc) is fenced
    True
    >>> kafka_exception(SystemError("other")) is None
    True
    """
    if isinstance(exc, KafkaException):
        return exc
    if isinstance(exc, SystemError) and isinstance(exc.__cause__, KafkaException):
        return exc.__cause__
    return None


def translate(
    what: str,
    error: KafkaException | KafkaError,
    cls: type[KafkaKVError] | None = None,
) -> KafkaKVError:
    """The kafkakv error for ``error`` (not raised: the caller raises it ``from`` the original).

    ``what`` says what was being done (``"creating topic 'x'"``); the message is ``what``,
    librdkafka's text and the table's hint. ``cls``: the class to use whatever the code, for
    a caller that knows more than the code says (the first contact with brokers that did not
    answer is a :class:`~kafkakv.errors.LogUnavailableError`, whichever way it failed).

    >>> err = translate("append to t[0]", KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))
    >>> type(err).__name__, str(err)
    ('RecordTooLargeError', "append to t[0]: Broker: Message size too large (see the topic's max.message.bytes)")
    >>> err = translate("listing topics", KafkaError(KafkaError._TRANSPORT), LogUnavailableError)
    >>> type(err).__name__, err.code, err.code_name
    ('LogUnavailableError', -195, '_TRANSPORT')
    >>> err = translate("listing topics", KafkaException("odd"))
    >>> type(err).__name__, str(err), err.code
    ('LogError', 'listing topics: odd', None)
    """
    err = error if isinstance(error, KafkaError) else error_of(error)
    if err is None:
        return (cls or DEFAULT)(f"{what}: {error}")
    code = err.code()
    table = error_class(code)
    hint = HINTS.get(code) if cls is None or cls is table else None
    message = f"{what}: {err.str()}" + (f" ({hint})" if hint else "")
    return (cls or table)(message, code=code, code_name=err.name())


class translated:  # lowercase: used as a function is, like contextlib.suppress
    """The error boundary: a ``KafkaException`` raised in the ``with`` block (or a
    ``SystemError`` standing for one: :func:`kafka_exception`) leaves it as :func:`translate`
    makes it, ``raise ... from`` the original (kept as ``__cause__``).
    Anything else, kafkakv's own errors included, passes through untouched.

    >>> with translated("reading t[0]"):
    ...     raise KeyError("not a Kafka error")
    Traceback (most recent call last):
    KeyError: 'not a Kafka error'

    Costs one object and a ``try`` per block; nothing per record.
    """

    __slots__ = ("what",)

    def __init__(self, what: str) -> None:
        self.what = what

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        kafka = None if exc is None else kafka_exception(exc)
        if kafka is not None:
            raise translate(self.what, kafka) from exc
