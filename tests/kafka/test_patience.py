"""A broker that does not know a partition the metadata already lists is only behind (a topic
just created, a leader just moved): asking its offsets is tried again within the timeout,
not failed at once (a map opening right after another process created its topics once did)."""

from __future__ import annotations

import concurrent.futures
import time

import pytest
from confluent_kafka import KafkaError, KafkaException

from kafkakv.dev import Cluster
from kafkakv.errors import FencedError, LogUnavailableError, OperationTimeoutError
from kafkakv.log.kafka import KafkaLog
from kafkakv.log.kafka.errors import translated
from tests.conftest import KAFKA_TIMEOUT

pytestmark = pytest.mark.kafka


def _behind(times: int) -> tuple[list[float], object]:
    calls: list[float] = []

    def call(wait: float) -> int:
        calls.append(wait)
        if len(calls) <= times:
            raise KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART))
        return 42

    return calls, call


def test_a_partition_the_metadata_lists_is_asked_again(kafka_cluster: Cluster) -> None:
    with KafkaLog(kafka_cluster.bootstrap, timeout=KAFKA_TIMEOUT) as log:
        calls, call = _behind(2)
        assert log._patiently("asking", call, known=True) == 42  # type: ignore[arg-type]
        assert len(calls) == 3
        calls, call = _behind(1)
        with pytest.raises(KafkaException):  # not known to exist: the first answer stands
            log._patiently("asking", call)  # type: ignore[arg-type]
        assert len(calls) == 1


def test_a_call_whose_deadline_has_passed_says_so(kafka_cluster: Cluster) -> None:
    """Not "no answer within 0.0 s": the caller's time was gone before the call began."""

    def call(wait: float) -> int:
        raise concurrent.futures.TimeoutError

    with KafkaLog(kafka_cluster.bootstrap, timeout=KAFKA_TIMEOUT) as log:
        with pytest.raises(OperationTimeoutError, match="time had run out before it"):
            log._patiently("asking", call, deadline=time.monotonic() - 1)
        with pytest.raises(OperationTimeoutError, match=r"no answer within \d+\.\d+ s$"):
            log._patiently("asking", call, deadline=time.monotonic() + 0.5)


def test_a_leader_still_settling_is_asked_until_the_deadline_then_is_unavailable(
    kafka_cluster: Cluster,
) -> None:
    """A leader just elected answers offsets with OFFSET_NOT_AVAILABLE until its high watermark
    has caught up: asked again until the caller's deadline (not given up at the last slice's
    first quick failure), then raised as the log being unavailable, not as a plain LogError
    (a put during a failover once was)."""
    calls: list[float] = []

    def call(wait: float) -> int:
        calls.append(wait)
        raise KafkaException(KafkaError(KafkaError.OFFSET_NOT_AVAILABLE))

    with KafkaLog(kafka_cluster.bootstrap, timeout=KAFKA_TIMEOUT) as log:
        started = time.monotonic()
        with pytest.raises(LogUnavailableError, match="not caught up") as info, translated("x"):
            log._patiently("asking", call, known=True, deadline=started + 1.0)
        assert 0.9 <= time.monotonic() - started < 1.5
        assert len(calls) >= 5  # one every 0.1 s or so
        assert info.value.code == KafkaError.OFFSET_NOT_AVAILABLE


def test_a_request_lost_with_its_connection_is_sent_again(kafka_cluster: Cluster) -> None:
    """A metadata request whose connection closed fails at once with _TRANSPORT: no broker
    answered it, so it is sent again within the deadline (a map opening on a loaded machine
    once failed so in its first slice), and raised as unavailable once the time is up."""
    calls: list[float] = []

    def call(wait: float) -> int:
        calls.append(wait)
        if len(calls) == 1:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "Broker transport failure"))
        return 42

    def lost(wait: float) -> int:
        calls.append(wait)
        raise KafkaException(KafkaError(KafkaError._TRANSPORT, "Broker transport failure"))

    with KafkaLog(kafka_cluster.bootstrap, timeout=KAFKA_TIMEOUT) as log:
        assert log._patiently("listing topics", call) == 42
        assert len(calls) == 2
        calls.clear()
        started = time.monotonic()
        with pytest.raises(LogUnavailableError, match="transport"), translated("x"):
            log._patiently("listing topics", lost, deadline=started + 1.0)
        assert 0.9 <= time.monotonic() - started < 1.5 and len(calls) >= 5


def test_a_system_error_standing_for_a_kafka_error_is_handled_as_that_error(
    kafka_cluster: Cluster,
) -> None:
    """confluent-kafka ran a callback of kafkakv's (error_cb) while a fenced producer's fatal
    error was still set: the callback's lock raised a SystemError chained to it, which the
    client call raised, and it escaped a flush past every ``except KafkaException`` (fresh run
    44, under stress-ng). It is handled as the error it stands for."""

    def standing_for(code: int) -> SystemError:
        try:
            raise SystemError("returned a result with an exception set") from KafkaException(
                KafkaError(code)
            )
        except SystemError as exc:
            return exc

    calls: list[float] = []

    def behind_then_answers(wait: float) -> int:
        calls.append(wait)
        if len(calls) == 1:
            raise standing_for(KafkaError.UNKNOWN_TOPIC_OR_PART)
        return 42

    def fenced(wait: float) -> int:
        raise standing_for(KafkaError._FENCED)

    with KafkaLog(kafka_cluster.bootstrap, timeout=KAFKA_TIMEOUT) as log:
        assert log._patiently("asking", behind_then_answers, known=True) == 42
        assert len(calls) == 2  # asked again, as for the KafkaException itself
        with pytest.raises(FencedError, match=r"^writing: .*fenced"), translated("writing"):
            log._patiently("writing", fenced)
