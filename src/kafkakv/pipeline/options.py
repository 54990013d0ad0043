"""What a Spark job needs to find a map or a topic: plain settings, parsed and checked once.

Spark ships a data source to its executors by pickling it; :class:`SourceOptions` is all the
kafkakv data source holds, so only these strings travel. Each task opens its own connection
to the log with them (the embedded log's directory, or the Kafka bootstrap servers) and closes
it when the task ends.

>>> opts = SourceOptions.from_options({"target": "/tmp/db", "map": "terminals"})
>>> opts.what, opts.key_codec, opts.value_codec
("map 'terminals'", 'str', 'json')
>>> SourceOptions.from_options(opts.to_options()) == opts
True
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kafkakv.db import Database, check_target, connect
from kafkakv.errors import ConfigError, UnknownTopicError
from kafkakv.map.keyspace import map_prefix
from kafkakv.map.topics import MapTopics

if TYPE_CHECKING:
    from kafkakv.log.base import Log

__all__ = ["SPARK_CODECS", "SourceOptions"]

SPARK_CODECS = ("str", "bytes", "int", "json", "msgpack")
"""Codecs the data source can carry to and from Spark columns. Pickle is refused: decoding
it in an executor would run code that came through the log."""

_KAFKA_PREFIX = "kafka."


@dataclass(frozen=True)
class SourceOptions:
    """Which log, which map or topic, which codecs.

    ``target``: a directory (the embedded log) or ``kafka://host:port,...`` (librdkafka settings
    in its query string, or as options named ``kafka.<setting>``). Exactly one of ``map`` (a
    replicated map; ``topics`` names its topic set when several maps share one) and ``topic`` (a
    plain topic, e.g. a directory's). ``timeout``: seconds a task waits for the log.
    ``check_json``: a write parses each JSON value before appending it (False: the text is
    known to be JSON, as ``to_json`` writes it; the ingest sets it).
    """

    target: str
    map: str | None = None
    topic: str | None = None
    topics: str | None = None
    key_codec: str = "str"
    value_codec: str = "json"
    timeout: float = 60.0
    kafka: Mapping[str, str] = field(default_factory=dict)
    check_json: bool = True

    def __post_init__(self) -> None:
        if not self.target:
            raise ConfigError(
                "the kafkakv data source needs option 'target' (a directory or kafka://...)"
            )
        check_target(self.target)  # a memory:// log would be a new, empty one in each task
        if (self.map is None) == (self.topic is None):
            raise ConfigError("give exactly one of the options 'map' and 'topic'")
        if self.topics is not None and self.map is None:
            raise ConfigError("option 'topics' (a shared topic set) applies to a map only")
        for role, name in (("key_codec", self.key_codec), ("value_codec", self.value_codec)):
            if name not in SPARK_CODECS:
                raise ConfigError(
                    f"option {role}={name!r}: the data source supports {', '.join(SPARK_CODECS)}"
                )
        if not self.timeout > 0:
            raise ConfigError(f"option timeout must be a positive number, not {self.timeout!r}")
        if self.kafka and not self.target.startswith("kafka://"):
            raise ConfigError("kafka.* options apply only to a kafka:// target")

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> SourceOptions:
        """Parse Spark's string options (keys case-insensitive, as Spark passes them)."""
        lowered = {k.lower(): v for k, v in options.items()}
        known = {"target", "map", "topic", "topics", "key_codec", "value_codec", "timeout"}
        known.add("check_json")
        unknown = [k for k in lowered if k not in known and not k.startswith(_KAFKA_PREFIX)]
        if unknown:
            raise ConfigError(f"unknown kafkakv data source options: {', '.join(sorted(unknown))}")
        try:
            timeout = float(lowered.get("timeout", "60"))
        except ValueError:
            raise ConfigError(
                f"option timeout must be a number, not {lowered['timeout']!r}"
            ) from None
        check_json = lowered.get("check_json", "true").lower()
        if check_json not in ("true", "false"):
            raise ConfigError(f"option check_json must be true or false, not {check_json!r}")
        return cls(
            target=lowered.get("target", ""),
            map=lowered.get("map"),
            topic=lowered.get("topic"),
            topics=lowered.get("topics"),
            key_codec=lowered.get("key_codec", "str"),
            value_codec=lowered.get("value_codec", "json"),
            timeout=timeout,
            kafka={
                k[len(_KAFKA_PREFIX) :]: v
                for k, v in lowered.items()
                if k.startswith(_KAFKA_PREFIX)
            },
            check_json=check_json == "true",
        )

    def to_options(self) -> dict[str, str]:
        """The options to give ``spark.read.format("kafkakv").options(...)``."""
        out = {"target": self.target, "key_codec": self.key_codec, "value_codec": self.value_codec}
        out["timeout"] = repr(self.timeout)
        for name in ("map", "topic", "topics"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        out.update({_KAFKA_PREFIX + k: v for k, v in self.kafka.items()})
        if not self.check_json:
            out["check_json"] = "false"
        return out

    @property
    def what(self) -> str:
        """``map 'name'`` or ``topic 'name'``, for messages."""
        return f"map {self.map!r}" if self.map is not None else f"topic {self.topic!r}"

    @property
    def map_topics(self) -> MapTopics:
        """The map's three topics (only for a map)."""
        assert self.map is not None
        return MapTopics.for_name(self.topics or self.map)

    @property
    def record_prefix(self) -> bytes:
        """What precedes each encoded key in the map's records: the map's name when it shares
        its topics, else nothing."""
        if self.map is None or self.topics is None:
            return b""
        return map_prefix(self.map)

    def followed_topic(self, log: Log) -> str:
        """The topic whose partitions a job follows (a map's ops topic); raises
        UnknownTopicError when the map's topics or the topic do not exist (neither reading nor
        writing rows creates them)."""
        existing = set(log.topics())
        if self.map is not None:
            topics = self.map_topics
            missing = [t for t in (topics.data, topics.ops, topics.flush) if t not in existing]
            if missing:
                raise UnknownTopicError(
                    f"{self.what} does not exist on {self.target}: no {missing}"
                )
            return topics.ops
        if self.topic not in existing:
            raise UnknownTopicError(f"{self.what} does not exist on {self.target}")
        return str(self.topic)

    def connect(self) -> Database:
        """Open a database on the target (each task calls this once)."""
        options: dict[str, Any] = {}
        if self.target.startswith("kafka://"):
            options["timeout"] = self.timeout
            if self.kafka:
                options["config"] = dict(self.kafka)
        return connect(self.target, **options)
