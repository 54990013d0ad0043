"""``kafkakv topics create|verify`` and reading map commands on both logs; ``kafkakv
init-existing``, min.insync.replicas and foreign topics on Kafka."""

from __future__ import annotations

import json
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from confluent_kafka import Producer

import kafkakv
from kafkakv.cli.main import main
from kafkakv.dev import Cluster
from kafkakv.errors import TopicMismatchError
from kafkakv.log import Log
from kafkakv.log.partitioner import partition_for
from kafkakv.map.topics import MapTopics
from tests.conftest import KAFKA_TIMEOUT, SHARED_LOG_BACKENDS, open_log


@pytest.fixture(params=SHARED_LOG_BACKENDS)
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Log]]:
    """A target string for the CLI and an open log on the same place."""
    lg = open_log(request, request.param, tmp_path / "log")
    if request.param == "embedded":
        text = str(tmp_path / "log")
    else:
        text = "kafka://" + request.getfixturevalue("kafka_cluster").bootstrap
    try:
        yield text, lg
    finally:
        lg.close()


def _name() -> str:
    return f"cli-{uuid.uuid4().hex[:10]}"


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_create_then_verify(target: tuple[str, Log]) -> None:
    where, lg = target
    name = _name()
    code, out, err = run("topics", "verify", "-t", where, name)
    assert code == 1 and "missing" in err
    code, out, err = run("topics", "create", "-t", where, name, "--partitions", "3")
    assert code == 0, err
    assert f"{name}_ops" in out and "compact" in out
    assert {lg.partitions(t) for t in (name, f"{name}_ops", f"{name}_flush")} == {3}
    assert lg.topic_config(f"{name}_ops")["retention.ms"] == "-1"
    code, out, err = run("topics", "verify", "-t", where, name)
    assert code == 0, err
    assert "ok: map" in out and "3 partitions" in out


def test_request_timeout_bounds_each_command_on_an_unreachable_cluster() -> None:
    with socket.socket() as sock:  # a port nobody listens on once closed
        sock.bind(("127.0.0.1", 0))
        where = f"kafka://127.0.0.1:{sock.getsockname()[1]}"
    for command in (("topics", "create"), ("topics", "verify"), ("init-existing",)):
        started = time.monotonic()
        code, _, err = run(*command, "-t", where, "--request-timeout", "1", _name())
        assert code == 2 and "within 1.0 s" in err and where[8:] in err, (command, err)
        assert time.monotonic() - started < 8, command  # the default would wait 30 s


def test_verify_names_the_wrong_setting(target: tuple[str, Log]) -> None:
    where, lg = target
    name = _name()
    lg.create_topic(name, 1, {"cleanup.policy": "delete"})
    lg.create_topic(f"{name}_ops", 1, {"cleanup.policy": "delete", "retention.ms": -1})
    lg.create_topic(f"{name}_flush", 1, {"cleanup.policy": "delete", "retention.ms": -1})
    code, _, err = run("topics", "verify", "-t", where, name)
    assert code == 1
    assert f"topic {name!r} has cleanup.policy=delete" in err


def test_create_refuses_a_partition_count_that_differs(target: tuple[str, Log]) -> None:
    where, _ = target
    name = _name()
    assert run("topics", "create", "-t", where, name, "-n", "2")[0] == 0
    code, _, err = run("topics", "create", "-t", where, name, "-n", "4")
    assert code == 2 and "2 partitions, not 4" in err


def test_create_refuses_before_creating_anything(target: tuple[str, Log]) -> None:
    where, lg = target
    name = _name()
    lg.create_topic(name, 2, {"cleanup.policy": "compact"})
    code, _, err = run("topics", "create", "-t", where, name, "-n", "4")
    assert code == 2 and "2 partitions, not 4" in err
    flowers = _name()
    assert run("topics", "create", "-t", where, flowers)[0] == 0
    code, _, err = run("topics", "create", "-t", where, f"{flowers}_ops")
    assert code == 2 and f"the ops topic of map {flowers!r}" in err
    left = set(lg.topics())
    assert {
        f"{name}_ops",
        f"{name}_flush",
        f"{flowers}_ops_ops",
        f"{flowers}_ops_flush",
    }.isdisjoint(left)


def test_map_commands_create_nothing_on_a_missing_map(target: tuple[str, Log]) -> None:
    where, lg = target
    name = _name()
    for command in (("get", name, "k"), ("dump", name), ("del", name, "k")):
        code, _, err = run("map", "-p", where, *command)
        assert code == 2 and f"there is no map {name!r}" in err, err
    assert name not in lg.topics()
    code, _, err = run("map", "-p", where, "put", name, "k", "1")
    assert code == 0, err
    assert run("map", "-p", where, "get", name, "k")[:2] == (0, "1\n")


def test_verify_checks_min_insync_replicas_against_the_copies(kafka_cluster: Cluster) -> None:
    """3 copies: min.insync.replicas=1 would let a leader alone acknowledge updates that die
    with it; verify says so, and the map refuses to open."""
    url = "kafka://" + kafka_cluster.bootstrap
    name = _name()
    with kafkakv.connect(url, timeout=KAFKA_TIMEOUT) as db:
        topics = MapTopics.for_name(name)
        settings = topics.settings(db.log.new_topic_replication())
        for topic, config in settings.items():
            weak = topic == name
            db.log.create_topic(
                topic, 1, {**config, "min.insync.replicas": "1"} if weak else config
            )
        code, out, err = run("topics", "verify", "-t", url, name)
        assert code == 1 and "ok: map" not in out
        assert f"topic {name!r} has min.insync.replicas=1, a map needs at least 2" in err
        with pytest.raises(TopicMismatchError, match=r"min\.insync\.replicas"):
            db.map(name)


# -- init-existing (Kafka) ---------------------------------------------------------------------
def _producer(cluster: Cluster, **extra: str) -> Producer:
    return Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", **extra})


def _connector_topic(cluster: Cluster, lg: Log, partitioner: str) -> str:
    """A compacted topic as a connector would write it: JSON rows, some of them committed in
    a transaction, some in a transaction that was aborted."""
    name = _name()
    lg.create_topic(name, 3, {"cleanup.policy": "compact"})
    plain = _producer(cluster, partitioner=partitioner)
    for i in range(60):
        plain.produce(name, json.dumps({"id": i}).encode(), f"row-{i}".encode())
    plain.flush(10)
    txn = _producer(cluster, partitioner=partitioner, **{"transactional.id": f"c-{name}"})
    txn.init_transactions(10)
    txn.begin_transaction()
    txn.produce(name, json.dumps({"id": 100}).encode(), b"committed")
    txn.commit_transaction(10)
    txn.begin_transaction()
    txn.produce(name, json.dumps({"id": 200}).encode(), b"aborted")
    txn.produce(name, json.dumps({"id": -1}).encode(), b"row-1")
    txn.flush(10)
    txn.abort_transaction(10)
    return name


def test_init_existing_adopts_committed_records_only(kafka_cluster: Cluster) -> None:
    url = "kafka://" + kafka_cluster.bootstrap
    with kafkakv.connect(url, timeout=KAFKA_TIMEOUT) as db:
        name = _connector_topic(kafka_cluster, db.log, "murmur2_random")
        code, out, err = run("init-existing", "-t", url, name)
        assert code == 0, err
        assert "61 records in 3 partitions" in out
        m = db.map(name, key_codec="str", value_codec="json")
        assert len(m) == 61
        assert m["row-1"] == {"id": 1} and m["committed"] == {"id": 100}
        assert "aborted" not in m
        m["row-1"] = {"id": 1, "changed": True}  # the adopted map takes updates
        assert partition_for(b"row-1", 3) == m.partition_of("row-1")
    with kafkakv.connect(url, timeout=KAFKA_TIMEOUT) as db:
        assert db.map(name, value_codec="json")["row-1"] == {"id": 1, "changed": True}
        # The map has history now: adopting again is refused.
        code, _, err = run("init-existing", "-t", url, name)
        assert code == 2 and "is not empty" in err


def test_a_topic_another_partitioner_wrote_is_never_adopted_by_opening_it(
    kafka_cluster: Cluster,
) -> None:
    """The CRC32-written topic of issue 18: db.map and kafkakv map put refuse it (they used to
    create the ops and flush topics and go on, and a fresh replica then read stale values)."""
    url = "kafka://" + kafka_cluster.bootstrap
    with kafkakv.connect(url, timeout=KAFKA_TIMEOUT) as db:
        name = _connector_topic(kafka_cluster, db.log, "consistent_random")  # CRC32
        with pytest.raises(TopicMismatchError, match="kafkakv init-existing"):
            db.map(name)
        code, _, err = run("map", "-p", url, "put", name, "row-5", '{"id": 5}')
        assert code == 2 and f"kafkakv init-existing {name}" in err
        code, _, err = run("topics", "create", "-t", url, name)
        assert code == 2 and "kafkakv init-existing" in err
        assert {f"{name}_ops", f"{name}_flush"}.isdisjoint(db.log.topics())


def test_init_existing_refuses_keys_placed_by_another_partitioner(
    kafka_cluster: Cluster,
) -> None:
    url = "kafka://" + kafka_cluster.bootstrap
    with kafkakv.connect(url, timeout=KAFKA_TIMEOUT) as db:
        name = _connector_topic(kafka_cluster, db.log, "consistent_random")  # CRC32
        code, _, err = run("init-existing", "-t", url, name)
        assert code == 2
        assert "not in the partition the map would use" in err
        assert f"{name}_ops" not in db.log.topics()  # nothing was created


def test_init_existing_refuses_a_delete_topic_and_unequal_counts(
    kafka_cluster: Cluster,
) -> None:
    url = "kafka://" + kafka_cluster.bootstrap
    with kafkakv.connect(url, timeout=KAFKA_TIMEOUT) as db:
        plain = _name()
        db.log.create_topic(plain, 1)
        code, _, err = run("init-existing", "-t", url, plain)
        assert code == 2 and "only a compacted topic" in err
        odd = _name()
        db.log.create_topic(odd, 2, {"cleanup.policy": "compact"})
        db.log.create_topic(f"{odd}_ops", 3)
        code, _, err = run("init-existing", "-t", url, odd)
        assert code == 2 and "must be equal" in err
