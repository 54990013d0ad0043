"""The data source's settings: what travels to executors, and what is refused."""

from __future__ import annotations

import pytest

from kafkakv.errors import ConfigError
from kafkakv.pipeline.options import SourceOptions


def test_options_round_trip_through_spark_strings() -> None:
    opts = SourceOptions(
        "kafka://127.0.0.1:1",
        map="m",
        topics="shared",
        key_codec="int",
        timeout=5.0,
        kafka={"security.protocol": "SSL"},
        check_json=False,
    )
    assert SourceOptions.from_options(opts.to_options()) == opts
    assert opts.to_options()["kafka.security.protocol"] == "SSL"
    assert SourceOptions.from_options({"target": "/x", "map": "m"}).check_json


def test_spark_passes_option_names_in_any_case() -> None:
    opts = SourceOptions.from_options({"TARGET": "/x", "Topic": "t", "Value_Codec": "str"})
    assert (opts.target, opts.topic, opts.value_codec) == ("/x", "t", "str")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"map": "m"}, "needs option 'target'"),
        ({"target": "/x"}, "exactly one of"),
        ({"target": "/x", "map": "m", "topic": "t"}, "exactly one of"),
        ({"target": "/x", "topic": "t", "topics": "b"}, "applies to a map only"),
        ({"target": "/x", "map": "m", "value_codec": "pickle"}, "supports str, bytes"),
        ({"target": "/x", "map": "m", "timeout": "soon"}, "must be a number"),
        ({"target": "/x", "map": "m", "check_json": "no"}, "must be true or false"),
        ({"target": "/x", "map": "m", "colour": "red"}, "unknown kafkakv data source options"),
        ({"target": "/x", "map": "m", "kafka.acks": "1"}, "only to a kafka:// target"),
        ({"target": "memory://m", "map": "m"}, "a memory log lives inside one Python process"),
    ],
)
def test_bad_options_are_refused(options: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        SourceOptions.from_options(options)


def test_a_shared_map_prefixes_its_keys_with_its_name() -> None:
    assert SourceOptions("/x", map="m", topics="base").record_prefix == b"\x01m"
    assert SourceOptions("/x", map="m").record_prefix == b""
    assert SourceOptions("/x", map="m", topics="base").map_topics.ops == "base_ops"
