"""The Kafka log's error boundary (:mod:`kafkakv.log.kafka.errors`): each librdkafka code in the
table becomes its kafkakv class, with the code and the original error kept; what is not a
``KafkaException`` passes through. Needs no cluster: no ``kafka`` marker, no cluster fixture."""

from __future__ import annotations

import pickle

import pytest
from confluent_kafka import KafkaError, KafkaException

from kafkakv.errors import (
    ConfigError,
    FencedError,
    InvalidRecordError,
    KafkaKVError,
    LockTimeoutError,
    LogAuthenticationError,
    LogError,
    LogUnavailableError,
    OffsetOutOfRangeError,
    OperationTimeoutError,
    PartitionStalledError,
    RecordTooLargeError,
    TopicExistsError,
    UnknownPartitionError,
    UnknownTopicError,
)
from kafkakv.log.kafka import log as log_module
from kafkakv.log.kafka.errors import DEFAULT, HINTS, TABLE, error_class, translate, translated
from kafkakv.log.kafka.refusals import is_refusal

EXPECTED: dict[int, type[KafkaKVError]] = {
    KafkaError.TOPIC_ALREADY_EXISTS: TopicExistsError,
    KafkaError.INVALID_REPLICATION_FACTOR: ConfigError,
    KafkaError.INVALID_PARTITIONS: ConfigError,
    KafkaError.INVALID_CONFIG: ConfigError,
    KafkaError.POLICY_VIOLATION: ConfigError,
    KafkaError.UNKNOWN_TOPIC_OR_PART: UnknownTopicError,
    KafkaError._UNKNOWN_TOPIC: UnknownTopicError,
    KafkaError._UNKNOWN_PARTITION: UnknownPartitionError,
    KafkaError.MSG_SIZE_TOO_LARGE: RecordTooLargeError,
    KafkaError.RECORD_LIST_TOO_LARGE: RecordTooLargeError,
    KafkaError.INVALID_RECORD: InvalidRecordError,
    KafkaError.OFFSET_OUT_OF_RANGE: OffsetOutOfRangeError,
    KafkaError._AUTO_OFFSET_RESET: OffsetOutOfRangeError,
    KafkaError._TIMED_OUT: OperationTimeoutError,
    KafkaError._TIMED_OUT_QUEUE: OperationTimeoutError,
    KafkaError._MSG_TIMED_OUT: OperationTimeoutError,
    KafkaError.PRODUCER_FENCED: FencedError,
    KafkaError._FENCED: FencedError,
    KafkaError.INVALID_PRODUCER_EPOCH: FencedError,
    KafkaError.INVALID_PRODUCER_ID_MAPPING: FencedError,
    KafkaError._ALL_BROKERS_DOWN: LogUnavailableError,
    KafkaError._TRANSPORT: LogUnavailableError,
    KafkaError._DESTROY_BROKER: LogUnavailableError,
    KafkaError.BROKER_NOT_AVAILABLE: LogUnavailableError,
    KafkaError.LEADER_NOT_AVAILABLE: LogUnavailableError,
    KafkaError.NOT_LEADER_FOR_PARTITION: LogUnavailableError,
    KafkaError.OFFSET_NOT_AVAILABLE: LogUnavailableError,
    KafkaError.FENCED_LEADER_EPOCH: LogUnavailableError,
    KafkaError.UNKNOWN_LEADER_EPOCH: LogUnavailableError,
    KafkaError.NOT_ENOUGH_REPLICAS: LogUnavailableError,
    KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND: LogUnavailableError,
    KafkaError._AUTHENTICATION: LogAuthenticationError,
    KafkaError._SSL: LogAuthenticationError,
    KafkaError.SASL_AUTHENTICATION_FAILED: LogAuthenticationError,
}
"""Written out again, not derived from TABLE: a code moved to another class fails here."""

NOT_IN_TABLE = [
    KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.CONCURRENT_TRANSACTIONS,
    KafkaError._INVALID_ARG,
    KafkaError._STATE,
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
]
"""Codes that fall to DEFAULT on purpose (see TABLE's docstring)."""


def _name(code: int) -> str:
    return KafkaError(code).name()


def test_the_table_is_the_expected_one() -> None:
    assert dict(TABLE) == EXPECTED
    assert set(HINTS) <= set(TABLE)


@pytest.mark.parametrize(("code", "cls"), sorted(EXPECTED.items()), ids=lambda v: str(v))
def test_each_code_becomes_its_class_with_code_and_cause(
    code: int, cls: type[KafkaKVError]
) -> None:
    original = KafkaException(KafkaError(code))
    with pytest.raises(KafkaKVError) as info, translated("doing x"):
        raise original
    error = info.value
    assert type(error) is cls
    assert error.__cause__ is original
    assert error.code == code
    assert error.code_name == _name(code)
    text = f"doing x: {KafkaError(code).str()}"
    assert str(error) == (f"{text} ({HINTS[code]})" if code in HINTS else text)


def test_every_code_a_wait_calls_again_through_has_a_class_of_its_own() -> None:
    """A wait that calls again through an error (a leader moving, a slice cut short) raises
    the last one when the caller's time is up: the table must give it the class a caller
    expects of a log it cannot reach, never the plain default (OFFSET_NOT_AVAILABLE once
    reached a put as a LogError during a failover)."""
    waited_through = set(log_module._IN_PASSING) | set(log_module._SLICE_EXPIRED)
    classes = {KafkaError(code).name(): error_class(code) for code in waited_through}
    allowed = {LogUnavailableError, OperationTimeoutError, UnknownTopicError, UnknownPartitionError}
    assert {name: cls for name, cls in classes.items() if cls not in allowed} == {}


def test_log_errors_in_the_table_are_log_errors_or_say_why_not() -> None:
    """Every class is a LogError but for the two whose meaning is not the log's: a setting
    (ConfigError) and a wait that ran out (OperationTimeoutError); all carry the code."""
    others = {cls for cls in TABLE.values() if not issubclass(cls, LogError)}
    assert others == {ConfigError, OperationTimeoutError}


@pytest.mark.parametrize("code", NOT_IN_TABLE, ids=_name)
def test_an_unknown_code_falls_to_the_default(code: int) -> None:
    assert DEFAULT is LogError
    assert error_class(code) is LogError
    original = KafkaException(KafkaError(code))
    with pytest.raises(LogError) as info, translated("doing x"):
        raise original
    assert type(info.value) is LogError
    assert info.value.__cause__ is original
    assert info.value.code == code
    assert info.value.code_name == _name(code)


def test_a_code_librdkafka_does_not_know_falls_to_the_default_too() -> None:
    error = translate("doing x", KafkaError(-12345))
    assert type(error) is LogError
    assert error.code == -12345


def test_a_kafka_exception_without_a_kafka_error_is_the_default_without_code() -> None:
    original = KafkaException("something odd")
    with pytest.raises(LogError) as info, translated("doing x"):
        raise original
    assert type(info.value) is LogError
    assert str(info.value) == "doing x: something odd"
    assert info.value.__cause__ is original
    assert info.value.code is None
    assert info.value.code_name is None


def test_a_callers_class_wins_over_the_table_and_drops_its_hint() -> None:
    error = translate("connecting", KafkaError(KafkaError._TIMED_OUT), LogUnavailableError)
    assert type(error) is LogUnavailableError
    assert error.code == KafkaError._TIMED_OUT
    assert HINTS[KafkaError._TIMED_OUT] not in str(error)
    fenced = translate("committing", KafkaError(KafkaError._FENCED), FencedError)
    assert HINTS[KafkaError._FENCED] in str(fenced)  # the table's own class: its hint stays


@pytest.mark.parametrize(
    "error",
    [KeyError("k"), ValueError("v"), TimeoutError("t"), RuntimeError("r")],
    ids=lambda e: type(e).__name__,
)
def test_other_exceptions_pass_through_untouched(error: Exception) -> None:
    with pytest.raises(type(error)) as info, translated("doing x"):
        raise error
    assert info.value is error
    assert info.value.__cause__ is None


def test_kafkakv_errors_pass_through_untouched() -> None:
    error = UnknownTopicError("no topic 't'", code=3)
    with pytest.raises(UnknownTopicError) as info, translated("doing x"):
        raise error
    assert info.value is error
    assert str(info.value) == "no topic 't'"


def test_a_block_that_raises_nothing_returns_its_value() -> None:
    def call() -> int:
        with translated("doing x"):
            return 7

    assert call() == 7


def test_refusals_are_the_tables_authentication_codes() -> None:
    refused = {code for code, cls in TABLE.items() if cls is LogAuthenticationError}
    assert all(is_refusal(code, "") for code in refused)
    assert not is_refusal(KafkaError._TRANSPORT, "Connection refused")
    assert is_refusal(KafkaError._TRANSPORT, "SSL handshake failed")


def test_every_error_takes_code_keywords_and_keeps_its_signature() -> None:
    assert KafkaKVError("m").code is None
    assert LogError("m", code=5, code_name="X").code_name == "X"
    assert OperationTimeoutError("m", code=-185).code == -185
    lock = LockTimeoutError("m", path="/p", pid=None)
    assert (lock.path, lock.code) == ("/p", None)
    stalled = PartitionStalledError("m", partition=1, offset=2)
    assert (stalled.partition, stalled.code) == (1, None)


def test_the_code_survives_pickling() -> None:
    error = translate("doing x", KafkaError(KafkaError._TRANSPORT))
    copy = pickle.loads(pickle.dumps(error))
    assert (type(copy), str(copy), copy.code, copy.code_name) == (
        LogUnavailableError,
        str(error),
        KafkaError._TRANSPORT,
        "_TRANSPORT",
    )
