"""librdkafka settings passed through a ``kafka://`` URL or ``config=``: one librdkafka refuses
(an unknown name, a value it cannot parse) is a :class:`ConfigError` naming it, from the Python
API and from every command (``error: ...``, exit code 2), never a ``KafkaException``."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

import kafkakv
from kafkakv.cli.main import main
from kafkakv.dev import Cluster
from kafkakv.errors import ConfigError
from kafkakv.log.kafka import KafkaLog


def test_an_unknown_setting_in_the_url_is_a_config_error(kafka_single: Cluster) -> None:
    url = f"kafka://{kafka_single.bootstrap}?no.such.setting=1"
    with pytest.raises(ConfigError, match=r"no\.such\.setting") as info:
        kafkakv.connect(url, timeout=5)
    assert info.value.__cause__ is not None  # librdkafka's own error, kept


def test_a_value_librdkafka_cannot_parse_is_a_config_error(kafka_single: Cluster) -> None:
    with pytest.raises(ConfigError, match=r"linger\.ms|queue\.buffering\.max\.ms"):
        KafkaLog(kafka_single.bootstrap, config={"linger.ms": "soon"}, timeout=5)


@pytest.mark.parametrize(
    "command",
    [
        ["map", "-p", "{url}", "get", "m", "k"],
        ["directory", "-p", "{url}", "load", "t"],
        ["topics", "verify", "-t", "{url}", "m"],
    ],
    ids=["map", "directory", "topics"],
)
def test_the_cli_says_error_and_names_the_setting(
    kafka_single: Cluster, command: list[str]
) -> None:
    url = f"kafka://{kafka_single.bootstrap}?no.such.setting=1"
    args = [url if arg == "{url}" else arg for arg in command]
    result = CliRunner().invoke(main, args, env={"KAFKAKV_LOG": None, "KAFKAKV_TARGET": None})
    assert result.exit_code == 2, (result.output, result.exception)
    assert "error: librdkafka refused the Kafka settings" in result.stderr
    assert "no.such.setting" in result.stderr
    assert "Traceback" not in result.output
