"""The three topics of a map, their required settings, and creating or verifying them.

=================  ===================================================================
``<name>``         data: compacted snapshot of every key, written only by flushes
``<name>_ops``     ops: every update attempt, in order; kept until a flush covers it
``<name>_flush``   flush: requests to flush, for observability and stale detection
=================  ===================================================================

The ops and flush topics must never lose records by age (``retention.ms=-1``): a replica that
starts after a quiet week still needs every op after the last flush. Their size retention is a
safety net sized from the flush period (see docs/maps-operations.md). The data topic must be compacted and
only compacted: deleting old data by age would lose keys nobody updated lately. The ops topic
is created with ``message.timestamp.type=LogAppendTime``: on Kafka the leader broker stamps
its records, and a map with expiry decides by that one clock (see docs/maps.md, "Clocks and
skew"); :func:`check_ops_clock` warns about an ops topic created otherwise.

Opening a map checks before it creates: :func:`check_topics` reads what exists and refuses
(creating nothing) when an existing topic has a wrong setting or partition count, belongs to
another map, or is a data topic that holds records but has no ops topic (written by another
program: only :func:`adopt_existing` checks where its records sit and adopts it). Only then
does :func:`create_topics` create the missing topics.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import msgpack

from kafkakv.errors import ConfigError, TopicExistsError, TopicMismatchError, UnknownMapError
from kafkakv.log.base import Log, Record, patiently
from kafkakv.log.config import validate_topic_name
from kafkakv.log.partitioner import partition_for
from kafkakv.map.keyspace import FLUSH_POINT_KEY, SETTINGS_KEY
from kafkakv.map.settings import MapSettings

__all__ = [
    "AdoptReport",
    "MapTopics",
    "TopicPlan",
    "adopt_existing",
    "check_ops_clock",
    "check_topics",
    "create_topics",
    "ensure_topics",
    "min_insync_replicas",
]

_SAFE = {"unclean.leader.election.enable": "false"}
_NO_AGE = {"cleanup.policy": "delete", "retention.ms": "-1", "file.delete.delay.ms": "7200000"}

#: (setting, required value) pairs checked on existing topics; anything else may differ
#: (``min.insync.replicas`` is checked as a minimum: see :func:`min_insync_replicas`).
_REQUIRED_DATA = {"cleanup.policy": "compact", "unclean.leader.election.enable": "false"}
_REQUIRED_LOG = {
    "cleanup.policy": "delete",
    "retention.ms": "-1",
    "unclean.leader.election.enable": "false",
}

_ROLES = (("_ops", "ops"), ("_flush", "flush"))

#: The log stamps ops records itself (see :func:`check_ops_clock`).
_LOG_CLOCK = {"message.timestamp.type": "LogAppendTime"}

logger = logging.getLogger("kafkakv.map")


def min_insync_replicas(replication: int) -> int:
    """The ``min.insync.replicas`` a map's topics need when topics get ``replication`` copies:
    2 from three copies on (an acknowledged update survives the loss of any one broker, and
    one broker down stops no writes), else 1 (with one or two copies, 2 would stop every
    write while one broker is down).

    >>> min_insync_replicas(1), min_insync_replicas(2), min_insync_replicas(3)
    (1, 1, 2)
    """
    return 2 if replication >= 3 else 1


@dataclass(frozen=True)
class MapTopics:
    """Names of a map's three topics (``MapTopics.for_name("flowers")``)."""

    data: str
    ops: str
    flush: str

    @classmethod
    def for_name(cls, name: str) -> MapTopics:
        validate_topic_name(name)
        topics = cls(name, f"{name}_ops", f"{name}_flush")
        validate_topic_name(topics.flush)
        return topics

    @property
    def names(self) -> tuple[str, str, str]:
        """``(data, ops, flush)``."""
        return (self.data, self.ops, self.flush)

    def settings(
        self, replication: int = 1, ops_retention_bytes: int = 2 << 30
    ) -> dict[str, dict[str, str]]:
        """Kafka topic configs to create the three topics with, for ``replication`` copies
        (``min.insync.replicas`` from :func:`min_insync_replicas`)."""
        safe = {**_SAFE, "min.insync.replicas": str(min_insync_replicas(replication))}
        return {
            self.data: {**safe, "cleanup.policy": "compact", "min.compaction.lag.ms": "0"},
            self.ops: {
                **safe,
                **_NO_AGE,
                **_LOG_CLOCK,
                "retention.bytes": str(ops_retention_bytes),
            },
            self.flush: {**safe, **_NO_AGE, "retention.bytes": str(1 << 30)},
        }


@dataclass(frozen=True)
class TopicPlan:
    """What :func:`check_topics` found sound: the partition count the map's topics have (or
    will be created with), the topics still to create, the count asked for, and whether
    :func:`adopt_existing` checked the data topic's records itself."""

    topics: MapTopics
    partitions: int
    missing: tuple[str, ...]
    requested: int | None = None
    adopting: bool = False


def ensure_topics(
    log: Log,
    topics: MapTopics,
    partitions: int | None,
    settings: Mapping[str, Mapping[str, str]] | None = None,
    *,
    create: bool = True,
) -> int:
    """Verify the map's existing topics, then create the missing ones; return the partition
    count. :func:`check_topics` then :func:`create_topics`: a refusal creates nothing."""
    return create_topics(log, check_topics(log, topics, partitions, create=create), settings)


def check_topics(
    log: Log, topics: MapTopics, partitions: int | None, *, create: bool = True
) -> TopicPlan:
    """Check everything about the map's topics that can be checked before creating any.

    ``partitions=None`` takes the existing count (1 when none exists). Raises
    :class:`~kafkakv.errors.ConfigError` for a bad ``partitions``;
    :class:`~kafkakv.errors.UnknownMapError` when ``create`` is false and a topic is missing;
    :class:`~kafkakv.errors.TopicMismatchError` when an existing topic has a wrong setting (a
    ``min.insync.replicas`` below :func:`min_insync_replicas` of the copies the log gives its
    topics included), belongs to another map, when the existing topics disagree on their
    partition count or differ from ``partitions``, or when the data topic holds records but
    the ops topic does not exist (see :func:`adopt_existing`). Creates nothing. Cost: one
    metadata round trip per existing topic, and two offset look-ups per partition of a data
    topic that has no ops topic.
    """
    return _check(log, topics, partitions, create=create, adopting=False)


def create_topics(
    log: Log, plan: TopicPlan, settings: Mapping[str, Mapping[str, str]] | None = None
) -> int:
    """Create the topics ``plan`` lists as missing (``settings``: configs by topic name,
    default :meth:`MapTopics.settings`); return the partition count.

    A topic that exists after all (another process created it meanwhile, or a Kafka broker
    listed it late) is checked as :func:`check_topics` checks existing ones before the next
    is created, raising :class:`~kafkakv.errors.TopicMismatchError` when it is not sound.
    Cost: one create request per missing topic.
    """
    topics, count = plan.topics, plan.partitions
    if not plan.missing:
        return count
    wanted = settings or topics.settings(log.new_topic_replication())
    done = [n for n in topics.names if n not in plan.missing]
    for name in plan.missing:
        try:
            log.create_topic(name, count, wanted[name])
        except TopicExistsError:
            count = _check_counts(log, topics, [*done, name], plan.requested) or count
            _verify(log, topics, name, {*log.topics(), name})
            if name == topics.data and topics.ops in plan.missing and not plan.adopting:
                _refuse_foreign_data(log, topics, count)
        done.append(name)
    return count


HASH_TAGS = "hash-tags"
"""The value of ``"placement"`` in the settings record of a map created with hash tags."""

#: What a map without a settings record is: keys placed by murmur2, no versions.
DEFAULT_SETTINGS: dict[str, object] = {"placement": "murmur2", "versions": False, "expiry": False}


def settings_as_created(log: Log, topics: MapTopics, settings: MapSettings) -> MapSettings:
    """``settings`` with placement, versions and expiry as the map was created with them
    (:func:`check_map_settings`, which checks those ``settings`` names and may write the
    settings record of a new map)."""
    created = check_map_settings(
        log,
        topics,
        hash_tags=settings.hash_tags,
        versions=settings.versions,
        expiry=settings.expiry,
        timeout=settings.timeout,
    )
    return dataclasses.replace(
        settings,
        hash_tags=created["hash_tags"],
        versions=created["versions"],
        expiry=created["expiry"],
    )


def check_map_settings(
    log: Log,
    topics: MapTopics,
    *,
    hash_tags: bool | None,
    versions: bool | None,
    expiry: bool | None = None,
    timeout: float,
) -> dict[str, bool]:
    """The settings every replica of the map must share, as it was created: how keys are
    placed (``hash_tags``), whether keys carry versions, whether they may expire. Each is
    taken from the map when None, and checked against it otherwise.

    A map created with other than the defaults starts its data topic's partition 0 with a
    settings record (:data:`~kafkakv.map.keyspace.SETTINGS_KEY`, msgpack
    ``{"placement": ..., "versions": ..., "expiry": ...}``), written here when the map is
    new (nothing in its ops or data topics yet) and asked for with non-defaults. Replicas
    that placed a key in two partitions would append its ops to two logs whose order no
    replica can tell; replicas that disagreed on versions would decide version compares
    differently, and so would replicas that disagreed on expiry about keys past their
    deadline. Raises :class:`~kafkakv.errors.TopicMismatchError` naming the setting that
    differs. Returns ``{"hash_tags": ..., "versions": ..., "expiry": ...}``. Cost: one
    offset look-up and one read of a record per open; a new map with other settings, one
    append more."""
    asked = {"hash_tags": hash_tags, "versions": versions, "expiry": expiry}
    deadline = time.monotonic() + timeout
    found = _settings(log, topics, deadline)
    if found is None and any(asked.values()) and _untouched(log, topics):
        record = Record(SETTINGS_KEY, msgpack.packb(_recorded(asked)))
        log.append(topics.data, 0, [record], timeout=timeout)
        found = _settings(log, topics, deadline)
    made = {**DEFAULT_SETTINGS, **(found or {})}
    created = {
        "hash_tags": made.get("placement") == HASH_TAGS,
        "versions": made.get("versions") is True,
        "expiry": made.get("expiry") is True,
    }
    for name, value in asked.items():
        if value is not None and value != created[name]:
            raise TopicMismatchError(
                f"map topics {topics.data!r} were created with {name}={created[name]}; every "
                f"replica must open the map with the same {name} (or leave it None: as created)"
            )
    return created


def check_ops_clock(log: Log, topics: MapTopics) -> str | None:
    """For a map with expiry: whether one clock stamps its ops records. Returns (and logs as
    a warning) what is wrong, or None.

    A map with expiry decides by its ops records' timestamps. Its ops topic is created with
    ``message.timestamp.type=LogAppendTime``: on Kafka the leader broker then stamps every
    record. An ops topic created before (or by other tools) with ``CreateTime`` keeps the
    stamp of the client that produced each record, so a client whose clock runs ahead
    removes keys early for every replica. kafkakv does not change the topic itself (altering
    a topic's config takes rights a client may lack, and other programs may rely on it): the
    warning gives the command. Logs that stamp records with this machine's clock when they
    store them (:attr:`~kafkakv.log.base.Log.clock_is_local`: the embedded log) need
    nothing. Cost: one config look-up."""
    if log.clock_is_local:
        return None
    kind = log.topic_config(topics.ops).get("message.timestamp.type", "CreateTime")
    if kind == "LogAppendTime":
        return None
    problem = (
        f"ops topic {topics.ops!r} of a map with expiry has message.timestamp.type={kind}: "
        "its records carry the clocks of the clients that wrote them, and a client whose "
        "clock runs ahead expires keys early for every replica. Make the brokers stamp them: "
        f"kafka-configs --alter --entity-type topics --entity-name {topics.ops} "
        "--add-config message.timestamp.type=LogAppendTime"
    )
    logger.warning("%s", problem)
    return problem


def _recorded(asked: Mapping[str, bool | None]) -> dict[str, object]:
    """The settings record's value for a new map asked to have ``asked``."""
    return {
        "placement": HASH_TAGS if asked["hash_tags"] else "murmur2",
        "versions": bool(asked["versions"]),
        "expiry": bool(asked["expiry"]),
    }


def _settings(log: Log, topics: MapTopics, deadline: float) -> dict[str, object] | None:
    """What the data topic's settings record says (None: there is none)."""
    data = topics.data
    position, end = log.start_offset(data, 0), log.end_offset(data, 0)
    first: list[Record] = []
    # The first record, stepping over offsets that hold none (Kafka's transaction markers,
    # records compaction removed): read_batch says where to read next.
    while not first and position < end:
        read = functools.partial(log.read_batch, data, 0, position, max_records=1)
        first, after = patiently(deadline, read)
        if not first and after <= position:  # nothing read: a reader not caught up yet
            if time.monotonic() > deadline:
                raise TopicMismatchError(f"{data}[0] has records, but none could be read")
            time.sleep(0.05)
        position = max(position, after)
    if not first or first[0].key != SETTINGS_KEY:
        return None
    try:
        found = msgpack.unpackb(first[0].value or b"", raw=False)
        if not isinstance(found, dict):
            raise TypeError(f"a {type(found).__name__}, not a map")
    except Exception as exc:
        raise TopicMismatchError(
            f"{data}[0] starts with a settings record that does not read: {exc}"
        ) from exc
    return found


def _untouched(log: Log, topics: MapTopics) -> bool:
    """Nothing was ever written to the map's ops or data topics."""
    partitions = log.partitions(topics.ops)
    return log.end_offset(topics.data, 0) == 0 and all(
        log.end_offset(topics.ops, p) == 0 for p in range(partitions)
    )


def _check(
    log: Log, topics: MapTopics, partitions: int | None, *, create: bool, adopting: bool
) -> TopicPlan:
    if partitions is not None and (
        not isinstance(partitions, int) or isinstance(partitions, bool) or partitions < 1
    ):
        raise ConfigError(f"partitions must be a positive int, not {partitions!r}")
    existing = set(log.topics())
    present = [n for n in topics.names if n in existing]
    missing = tuple(n for n in topics.names if n not in existing)
    count = _check_counts(log, topics, present, partitions) or partitions or 1
    for name in present:
        _verify(log, topics, name, existing)
    if missing and not create:
        raise UnknownMapError(_unknown_map(topics, missing))
    if not adopting and topics.data in existing and topics.ops not in existing:
        _refuse_foreign_data(log, topics, count)
    return TopicPlan(topics, count, missing, partitions, adopting)


def _check_counts(
    log: Log, topics: MapTopics, present: list[str], partitions: int | None
) -> int | None:
    """The partition count the present topics share (None: none present)."""
    counts = {name: log.partitions(name) for name in present}
    if len(set(counts.values())) > 1:
        detail = ", ".join(f"{n}={c}" for n, c in counts.items())
        raise TopicMismatchError(f"a map's topics must have equal partition counts: {detail}")
    if not counts:
        return None
    count = next(iter(counts.values()))
    if partitions is not None and partitions != count:
        raise TopicMismatchError(
            f"map topics of {topics.data!r} exist with {count} partitions, not {partitions}; "
            "nothing was created"
        )
    return count


def _unknown_map(topics: MapTopics, missing: tuple[str, ...]) -> str:
    if len(missing) == 3:
        return f"there is no map {topics.data!r} (no topic {topics.data!r}); nothing was created"
    text = (
        f"map {topics.data!r} is incomplete: topic(s) {', '.join(map(repr, missing))} do not "
        "exist; nothing was created"
    )
    if topics.ops in missing and topics.data not in missing:
        text += f"; to make the existing topic {topics.data!r} a map, see kafkakv init-existing"
    return text


def _refuse_foreign_data(log: Log, topics: MapTopics, count: int) -> None:
    """A data topic with records and no ops topic was not written by this map: refuse it.

    Either another program wrote it (its records may sit where murmur2 would not put them,
    and a replica that loads one key from two partitions diverges from the writer), or it was
    a map's data topic whose ops topic is gone (its flush points cover ops offsets that a new
    ops topic would reuse, and replicas would skip those updates)."""
    data = topics.data
    holding = [p for p in range(count) if log.end_offset(data, p) > log.start_offset(data, p)]
    if holding:
        raise TopicMismatchError(
            f"topic {topics.data!r} holds records (partitions {holding}) but there is no ops "
            f"topic {topics.ops!r}: it was not written by this map. To adopt a topic another "
            f"program wrote, check and adopt it with `kafkakv init-existing {topics.data}` "
            "(kafkakv.map.topics.adopt_existing); else choose another map name. Nothing was "
            "created"
        )


def _owner(topics: MapTopics, topic: str, existing: set[str]) -> str | None:
    """Which other map ``topic`` belongs to, judged by the topics around it (a data topic
    ``X_ops`` or ``X_flush`` next to a topic ``X``; an ops topic next to its own ops topic)."""
    for suffix, role in _ROLES:
        base = topic.removesuffix(suffix)
        if base not in (topic, topics.data) and base in existing:
            return f"it is the {role} topic of map {base!r}"
    if topic != topics.data and f"{topic}_ops" in existing:
        return f"it is the data topic of map {topic!r}"
    return None


def _verify(log: Log, topics: MapTopics, topic: str, existing: set[str]) -> None:
    config = log.topic_config(topic)
    required = _REQUIRED_DATA if topic == topics.data else _REQUIRED_LOG
    for key, value in required.items():
        actual = config.get(key)
        if actual != value:
            owner = _owner(topics, topic, existing) if key == "cleanup.policy" else None
            if owner is not None:
                raise TopicMismatchError(
                    f"map {topics.data!r} cannot use topic {topic!r}: {owner} "
                    f"({key}={actual}); choose another map name. Nothing was created"
                )
            raise TopicMismatchError(
                f"topic {topic!r} has {key}={actual}, a map needs {key}={value}; "
                f"fix it with your admin tools or use another map name"
            )
    replication = log.new_topic_replication()
    needed = min_insync_replicas(replication)
    actual_isr = config.get("min.insync.replicas", "1")  # Kafka's default when not reported
    if not actual_isr.isdigit() or int(actual_isr) < needed:
        raise TopicMismatchError(
            f"topic {topic!r} has min.insync.replicas={actual_isr}, a map needs at least "
            f"{needed} where topics get {replication} copies (with fewer, an "
            "acknowledged update is lost when its leader dies); fix it with your admin tools "
            "(kafka-configs --alter --add-config min.insync.replicas=...)"
        )


def adopt_existing(
    log: Log,
    topics: MapTopics,
    progress: Callable[[int], None] | None = None,
) -> AdoptReport:
    """Make the existing compacted topic ``topics.data`` the data topic of a map (seed 000's
    procedure for bringing a key-value topic that another program wrote under a map).

    Checks, and refuses with :class:`~kafkakv.errors.TopicMismatchError` when one fails:

    - the data topic exists and is compacted;
    - an ops or flush topic that exists has the same partition count, and the ops topic
      holds no record (a map with history cannot adopt data);
    - every record sits in the partition the map would put its key in (Kafka's Java
      partitioner, murmur2); a topic written with another partitioner (librdkafka's default
      is CRC32) would leave a key in two partitions once the map updates it;
    - no record is a map's flush point: a topic that was a map's data topic, whose ops topic
      is gone, records ops offsets as flushed that a new ops topic would start over at.

    Then it checks the rest as :func:`check_topics` does and creates the missing ops and flush
    topics. Reading every record costs one pass over
    the data topic; ``progress(n)`` is called with the number of records checked so far. A
    map opened afterwards loads every committed record of the data topic.
    """
    existing = set(log.topics())
    if topics.data not in existing:
        raise TopicMismatchError(f"there is no topic {topics.data!r} to adopt")
    config = log.topic_config(topics.data)
    if config.get("cleanup.policy") != "compact":
        raise TopicMismatchError(
            f"topic {topics.data!r} has cleanup.policy={config.get('cleanup.policy')}; "
            "only a compacted topic (cleanup.policy=compact) can be a map's data topic"
        )
    count = log.partitions(topics.data)
    for name in (topics.ops, topics.flush):
        if name in existing and log.partitions(name) != count:
            raise TopicMismatchError(
                f"topic {name!r} has {log.partitions(name)} partitions and {topics.data!r} "
                f"has {count}; they must be equal"
            )
    if topics.ops in existing:
        used = [p for p in range(count) if log.end_offset(topics.ops, p) > 0]
        if used:
            raise TopicMismatchError(
                f"ops topic {topics.ops!r} is not empty (partitions {used}): a map already "
                "used these topics, and adopting data now would mix two histories"
            )
    report = _check_partitioning(log, topics.data, count, progress)
    if report.flush_points:
        raise TopicMismatchError(
            f"topic {topics.data!r} holds {report.flush_points} flush points of a map: it was a "
            f"map's data topic and its ops topic is gone. A new ops topic starts again at offset "
            "0, below what the flush points say was applied, so replicas would skip updates; "
            "copy its keys into a new topic instead"
        )
    if report.misplaced:
        key, found, wanted = report.misplaced[0]
        raise TopicMismatchError(
            f"{report.misplaced_count} records of {topics.data!r} are not in the partition the "
            f"map would use (first: key {key!r} in partition {found}, murmur2 says {wanted}); "
            "write the topic with Kafka's default (murmur2) partitioner, or repartition it"
        )
    create_topics(log, _check(log, topics, count, create=True, adopting=True))
    return report


@dataclass
class AdoptReport:
    """What :func:`adopt_existing` read: records per partition, misplaced keys (the first 100
    as ``(key, partition found, partition wanted)``, and how many in all), and the number of
    map flush-point records."""

    records: dict[int, int]
    misplaced: list[tuple[bytes | None, int, int]]
    misplaced_count: int = 0
    flush_points: int = 0


def _check_partitioning(
    log: Log, topic: str, count: int, progress: Callable[[int], None] | None
) -> AdoptReport:
    report = AdoptReport({}, [])
    seen = 0
    for p in range(count):
        position, records = log.start_offset(topic, p), 0
        while True:
            batch = log.read_batch(topic, p, position, max_records=5000)
            if not batch.records:
                break
            for record in batch.records:
                key = record.key
                if key == FLUSH_POINT_KEY:
                    report.flush_points += 1
                    continue
                wanted = partition_for(key, count) if key is not None else p
                if wanted != p:
                    report.misplaced_count += 1
                    if len(report.misplaced) < 100:
                        report.misplaced.append((key, p, wanted))
            records += len(batch.records)
            seen += len(batch.records)
            position = batch.next_offset
            if progress is not None:
                progress(seen)
        report.records[p] = records
    return report
