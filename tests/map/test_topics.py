"""Opening a map's topics at the edges, on every log: what ``db.map`` adopts, refuses and
creates (``kafkakv.map.topics``), and the targets ``kafkakv.connect`` refuses."""

from __future__ import annotations

import os
import re
import uuid
from pathlib import Path

import msgpack
import pytest

import kafkakv
from kafkakv.errors import ConfigError, TopicMismatchError, UnknownMapError
from kafkakv.log import Log, Record
from kafkakv.log.kafka import KafkaLog
from kafkakv.log.partitioner import partition_for
from kafkakv.map import FLUSH_POINT_KEY
from kafkakv.map.topics import (
    MapTopics,
    adopt_existing,
    check_ops_clock,
    check_topics,
    create_topics,
    min_insync_replicas,
)
from tests.waiting import wait_for


def _name() -> str:
    return f"m-{uuid.uuid4().hex[:10]}"


def _companions(log: Log, name: str) -> set[str]:
    """Which of ``name``'s ops and flush topics exist."""
    return {f"{name}_ops", f"{name}_flush"} & set(log.topics())


def _fill(log: Log, topic: str, count: int, *, misplaced: bool) -> None:
    """Write keys c0..c19 as another producer would: with murmur2, or with another
    partitioner that puts every key one partition further."""
    for i in range(20):
        key = f"c{i}".encode()
        p = (partition_for(key, count) + (1 if misplaced else 0)) % count
        log.append(topic, p, [Record(key, b'"old"')])


def _wait_listed(log: Log, topic: str) -> None:
    """Until ``topic`` is listed: a Kafka broker other than the one that confirmed the
    creation may list topics from metadata a moment old."""
    wait_for(lambda: topic in log.topics(), 10, f"{topic} to be listed", interval=0.05)


# -- adopting a data topic ------------------------------------------------------------------
def test_a_foreign_data_topic_is_refused_and_nothing_is_created(log: Log) -> None:
    name = _name()
    log.create_topic(name, 3, {"cleanup.policy": "compact"})
    _fill(log, name, 3, misplaced=True)
    with kafkakv.connect(log) as db:
        with pytest.raises(TopicMismatchError, match="kafkakv init-existing") as caught:
            db.map(name)
        assert "no ops topic" in str(caught.value)
        with pytest.raises(UnknownMapError, match="kafkakv init-existing"):
            db.map(name, create=False)
    assert _companions(log, name) == set()
    with pytest.raises(TopicMismatchError, match="not in the partition the map would use"):
        adopt_existing(log, MapTopics.for_name(name))
    assert _companions(log, name) == set()


def test_a_well_placed_foreign_topic_is_adopted_only_explicitly(log: Log) -> None:
    name = _name()
    log.create_topic(name, 3, {"cleanup.policy": "compact"})
    _fill(log, name, 3, misplaced=False)
    with kafkakv.connect(log) as db:
        with pytest.raises(TopicMismatchError, match="kafkakv init-existing"):
            db.map(name)
        report = adopt_existing(log, MapTopics.for_name(name))
        assert sum(report.records.values()) == 20
        m = db.map(name, flush_period=1)
        assert len(m) == 20
        m["c5"] = "new"
        m.flush()
    with kafkakv.connect(log) as db:  # a fresh replica agrees with the writer
        assert db.map(name)["c5"] == "new"


def test_an_empty_existing_compacted_topic_becomes_a_map(log: Log) -> None:
    name = _name()
    log.create_topic(name, 2, {"cleanup.policy": "compact"})
    with kafkakv.connect(log) as db:
        m = db.map(name)
        m["k"] = 1
        assert list(m.partitions) == [0, 1]
    assert _companions(log, name) == {f"{name}_ops", f"{name}_flush"}


def test_maps_flushed_or_not_reopen(log: Log) -> None:
    never, flushed = _name(), _name()
    with kafkakv.connect(log) as db:
        db.map(never)["k"] = 1  # the data topic stays empty
        f = db.map(flushed, flush_period=1)
        f["k"] = 2
        f.flush()  # the data topic holds k and the flush point
    assert log.end_offset(flushed, 0) > 0
    with kafkakv.connect(log) as db:
        assert db.map(never, create=False)["k"] == 1
        assert db.map(flushed, create=False)["k"] == 2


def test_a_former_data_topic_whose_ops_topic_is_gone_is_refused(log: Log) -> None:
    """Flush points say ops up to 500 were applied; a new ops topic would start at 0."""
    name = _name()
    log.create_topic(name, 1, {"cleanup.policy": "compact"})
    log.append(name, 0, [Record(b"k", b"1"), Record(FLUSH_POINT_KEY, msgpack.packb([500]))])
    with kafkakv.connect(log) as db, pytest.raises(TopicMismatchError, match="no ops topic"):
        db.map(name)
    with pytest.raises(TopicMismatchError, match="flush points"):
        adopt_existing(log, MapTopics.for_name(name))
    assert _companions(log, name) == set()


# -- checks before creating ------------------------------------------------------------------
def test_a_partition_count_mismatch_creates_nothing(log: Log) -> None:
    name = _name()
    log.create_topic(name, 2, {"cleanup.policy": "compact"})
    with kafkakv.connect(log) as db, pytest.raises(TopicMismatchError, match="2 partitions"):
        db.map(name, partitions=4)
    assert _companions(log, name) == set()


def test_bad_options_create_nothing(log: Log, tmp_path: Path) -> None:
    name = _name()
    with kafkakv.connect(log) as db:
        with pytest.raises(ConfigError, match="store_path"):
            db.map(name, store="lmdb")
        with pytest.raises(ConfigError, match="unknown store"):
            db.map(name, store="btree")
        with pytest.raises(ConfigError, match="in memory"):
            db.map(name, store="dict", store_path=str(tmp_path / "s"))
        with pytest.raises(ConfigError, match="shard"):
            db.map(name, partitions=2, shard=[5])
        with pytest.raises(ConfigError, match="store_path"):
            db.maps(name, ["a", "b"], store="lmdb")
    assert name not in log.topics() and _companions(log, name) == set()


def test_a_name_on_another_maps_topics_is_refused(log: Log) -> None:
    flowers, plain = _name(), _name()
    with kafkakv.connect(log) as db:
        db.map(flowers)
        for taken, role in ((f"{flowers}_ops", "ops"), (f"{flowers}_flush", "flush")):
            with pytest.raises(TopicMismatchError, match=f"the {role} topic of map '{flowers}'"):
                db.map(taken)
            assert _companions(log, taken) == set()
        db.map(f"{plain}_ops")  # first comes the map named like another's ops topic...
        with pytest.raises(TopicMismatchError, match=f"data topic of map '{plain}_ops'"):
            db.map(plain)  # ...then the other map is refused
        assert plain not in log.topics()


def test_a_topic_created_between_check_and_create_is_checked(log: Log) -> None:
    """Another program creates and fills the data topic after the check: creating stops at
    it, as the check would have."""
    name = _name()
    topics = MapTopics.for_name(name)
    plan = check_topics(log, topics, None)
    assert plan.missing == topics.names
    log.create_topic(name, 3, {"cleanup.policy": "compact"})
    _fill(log, name, 3, misplaced=True)
    with pytest.raises(TopicMismatchError, match="kafkakv init-existing"):
        create_topics(log, plan)
    assert _companions(log, name) == set()


# -- create=False ---------------------------------------------------------------------------
def test_create_false_opens_only_an_existing_map(log: Log) -> None:
    name = _name()
    with kafkakv.connect(log) as db:
        with pytest.raises(UnknownMapError, match=f"there is no map '{name}'"):
            db.map(name, create=False)
        with pytest.raises(UnknownMapError):
            db.sorted_map(name, create=False)
        with pytest.raises(UnknownMapError):
            db.maps(name, ["a", "b"], create=False)
        assert name not in log.topics() and _companions(log, name) == set()
        db.map(name)["k"] = "v"
        assert db.map(name, create=False)["k"] == "v"


def test_create_false_names_the_missing_topics_of_an_incomplete_map(log: Log) -> None:
    name = _name()
    topics = MapTopics.for_name(name)
    log.create_topic(name, 1, topics.settings(log.new_topic_replication())[name])
    _wait_listed(log, name)
    with kafkakv.connect(log) as db, pytest.raises(UnknownMapError, match="incomplete") as caught:
        db.map(name, create=False)
    assert f"'{name}_ops'" in str(caught.value) and f"'{name}_flush'" in str(caught.value)
    assert _companions(log, name) == set()


# -- min.insync.replicas --------------------------------------------------------------------
def test_min_insync_replicas_is_verified_against_the_copies(log: Log) -> None:
    name = _name()
    topics = MapTopics.for_name(name)
    needed = min_insync_replicas(log.new_topic_replication())
    assert needed == (2 if isinstance(log, KafkaLog) else 1)  # 3 brokers; one machine
    weak = {**topics.settings(log.new_topic_replication())[name], "min.insync.replicas": "1"}
    log.create_topic(name, 1, weak)
    # A broker may describe a just-created topic with the cluster's defaults for a moment.
    wait_for(
        lambda: log.topic_config(name).get("min.insync.replicas") == "1",
        10,
        "the topic's own min.insync.replicas to show",
    )
    if needed == 1:  # one copy: 1 is all there can be
        assert check_topics(log, topics, None).partitions == 1
        return
    with pytest.raises(
        TopicMismatchError, match=re.escape("min.insync.replicas=1, a map needs at least 2")
    ):
        check_topics(log, topics, None)
    with kafkakv.connect(log) as db, pytest.raises(TopicMismatchError):
        db.map(name)
    assert _companions(log, name) == set()


# -- targets --------------------------------------------------------------------------------
@pytest.mark.parametrize("text", ["127.0.0.1:12600", "localhost:9092,broker-2.example:9093"])
def test_a_broker_address_without_kafka_scheme_is_refused(
    text: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=re.escape(f"did you mean kafka://{text}")):
        kafkakv.connect(text)
    assert os.listdir(tmp_path) == []


def test_a_directory_named_like_an_address_still_opens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    os.mkdir("data:1")
    with kafkakv.connect("data:1") as db:  # it exists: a directory, as before
        db.map("m")["k"] = 1
    with kafkakv.connect("./host:2") as db:  # spelled as a path: created
        db.map("m")["k"] = 1
    assert sorted(os.listdir(tmp_path)) == ["data:1", "host:2"]


def test_an_ops_topic_is_created_with_log_append_time_and_local_logs_need_no_warning() -> None:
    """The embedded and memory logs stamp ops records when they store them, whatever the
    topic says: an ops topic with ``CreateTime`` (an earlier kafkakv) is no reason to warn."""
    with kafkakv.connect("memory://") as db:
        db.map("fresh", expiry=True)
        assert db.log.topic_config("fresh_ops")["message.timestamp.type"] == "LogAppendTime"
        old = MapTopics.for_name("old")
        for name, config in old.settings().items():
            db.log.create_topic(name, 1, {k: v for k, v in config.items() if "timestamp" not in k})
        assert db.log.topic_config("old_ops")["message.timestamp.type"] == "CreateTime"
        assert db.log.clock_is_local and check_ops_clock(db.log, old) is None
