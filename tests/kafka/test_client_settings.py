"""The librdkafka settings kafkakv gives each kind of client (no cluster needed)."""

from __future__ import annotations

from kafkakv.log.kafka.settings import ClientSettings


def test_data_requests_give_up_in_3_s_admin_requests_wait_up_to_the_log_timeout() -> None:
    """A CreateTopics on a loaded controller took longer than the 3 s that keep produce and
    fetch off a cut-off broker: admin requests wait up to the log's timeout, unless set."""
    settings = ClientSettings("127.0.0.1:9092", None, 20.0)
    assert settings.producer()["socket.timeout.ms"] == "3000"
    assert settings.consumer("g")["socket.timeout.ms"] == "3000"
    assert settings.admin()["socket.timeout.ms"] == "20000"
    given = ClientSettings("127.0.0.1:9092", {"socket.timeout.ms": 7000}, 20.0)
    assert given.admin()["socket.timeout.ms"] == "7000"
