"""ClusterLayout and the command lines: pure values, no processes."""

from __future__ import annotations

import pytest

from kafkakv.dev.layout import (
    TLS_STORE_PASSWORD,
    ClusterLayout,
    broker_command,
    format_command,
    new_cluster_id,
    render_properties,
)
from kafkakv.errors import ConfigError


def test_three_nodes_listen_ten_thousand_ports_apart() -> None:
    layout = ClusterLayout(brokers=3, base_port=19092)
    assert list(layout.node_ids) == [1, 2, 3]
    assert [layout.client_port(i) for i in layout.node_ids] == [19092, 29092, 39092]
    assert [layout.controller_port(i) for i in layout.node_ids] == [19093, 29093, 39093]
    assert layout.ports == [19092, 19093, 29092, 29093, 39092, 39093]
    assert layout.bootstrap == "127.0.0.1:19092,127.0.0.1:29092,127.0.0.1:39092"


def test_sasl_users_add_a_plain_listener_two_ports_above_each_client_port() -> None:
    layout = ClusterLayout(2, 19092, sasl_users=(("app", "pw-1"), ("ops", "pw.2")))
    assert layout.ports == [19092, 19093, 19094, 29092, 29093, 29094]
    assert layout.node_ports(2) == [29092, 29093, 29094]
    assert layout.sasl_bootstrap == "127.0.0.1:19094,127.0.0.1:29094"
    config = layout.broker_config(2, "/d")
    assert config["listeners"].endswith(",SASL_PLAINTEXT://127.0.0.1:29094")
    assert "SASL_PLAINTEXT://127.0.0.1:29094" in config["advertised.listeners"]
    assert config["inter.broker.listener.name"] == "PLAINTEXT"  # brokers talk plaintext
    assert config["sasl.enabled.mechanisms"] == "PLAIN"
    jaas = config["listener.name.sasl_plaintext.plain.sasl.jaas.config"]
    assert 'user_app="pw-1" user_ops="pw.2";' in jaas
    plain = ClusterLayout(2, 19092)
    assert plain.sasl_bootstrap is None and "sasl.enabled.mechanisms" not in plain.broker_config(
        1, "/d"
    )


def test_a_keystore_adds_a_tls_listener_three_ports_above_each_client_port() -> None:
    layout = ClusterLayout(2, 19092, tls_keystore="/state/tls/broker.p12")
    assert layout.ports == [19092, 19093, 19095, 29092, 29093, 29095]
    assert layout.tls_bootstrap == "127.0.0.1:19095,127.0.0.1:29095"
    config = layout.broker_config(1, "/d")
    assert config["listeners"].endswith(",SSL://127.0.0.1:19095")
    assert "SSL:SSL" in config["listener.security.protocol.map"]
    assert config["listener.name.ssl.ssl.keystore.location"] == "/state/tls/broker.p12"
    assert config["listener.name.ssl.ssl.keystore.password"] == TLS_STORE_PASSWORD
    assert ClusterLayout(2, 19092).tls_bootstrap is None


@pytest.mark.parametrize("user", [("a b", "pw"), ("app", 'pw"; x'), ("", "pw")])
def test_sasl_names_that_would_need_quoting_are_refused(user: tuple[str, str]) -> None:
    with pytest.raises(ConfigError, match="letters, digits"):
        ClusterLayout(1, 19092, sasl_users=(user,))


@pytest.mark.parametrize(
    ("brokers", "rf", "isr"), [(1, "1", "1"), (2, "2", "2"), (3, "3", "2"), (5, "3", "2")]
)
def test_replication_settings_follow_the_broker_count(brokers: int, rf: str, isr: str) -> None:
    config = ClusterLayout(brokers=brokers, base_port=2000).broker_config(1, "/d")
    assert config["default.replication.factor"] == rf
    assert config["offsets.topic.replication.factor"] == rf
    assert config["transaction.state.log.replication.factor"] == rf
    assert config["min.insync.replicas"] == isr
    assert config["transaction.state.log.min.isr"] == isr


def test_node_config_binds_loopback_only_and_names_every_voter() -> None:
    config = ClusterLayout(brokers=3, base_port=19092).broker_config(2, "/data/n2")
    assert config["node.id"] == "2"
    assert config["process.roles"] == "broker,controller"
    assert config["listeners"] == "PLAINTEXT://127.0.0.1:29092,CONTROLLER://127.0.0.1:29093"
    assert config["advertised.listeners"] == "PLAINTEXT://127.0.0.1:29092"
    assert config["controller.quorum.voters"] == (
        "1@127.0.0.1:19093,2@127.0.0.1:29093,3@127.0.0.1:39093"
    )
    assert config["log.dirs"] == "/data/n2"
    assert config["unclean.leader.election.enable"] == "false"
    assert config["auto.create.topics.enable"] == "false"
    assert config["group.initial.rebalance.delay.ms"] == "0"


@pytest.mark.parametrize(("brokers", "base_port"), [(0, 19092), (3, 49092), (1, 80)])
def test_impossible_layouts_are_refused(brokers: int, base_port: int) -> None:
    with pytest.raises(ConfigError):
        ClusterLayout(brokers=brokers, base_port=base_port)


def test_unknown_node_and_comma_in_data_dir_are_refused() -> None:
    layout = ClusterLayout(brokers=1, base_port=59092)
    with pytest.raises(ConfigError):
        layout.broker_config(2, "/d")
    with pytest.raises(ConfigError):
        layout.broker_config(1, "/a,b")


def test_properties_escape_backslashes() -> None:
    assert render_properties({"a": "x\\y"}) == "a=x\\\\y\n"


def test_cluster_ids_are_fresh_urlsafe_base64() -> None:
    ids = {new_cluster_id() for _ in range(50)}
    assert len(ids) == 50
    assert all(len(i) == 22 and "=" not in i and "+" not in i and "/" not in i for i in ids)
    # One id in 64 would start with "-", which the storage tool takes for an option.
    assert not any(new_cluster_id().startswith("-") for _ in range(2000))


def test_command_lines_name_the_main_classes_and_the_log_settings() -> None:
    run = broker_command(
        "java", "/libs/*", "/n/server.properties", "/n/logs", "/s/log4j2", ["-Xmx1g"]
    )
    assert run[0] == "java" and "-Xmx1g" in run
    assert run[-2:] == ["kafka.Kafka", "/n/server.properties"]
    assert "-Dkafka.logs.dir=/n/logs" in run and "-Dlog4j2.configurationFile=/s/log4j2" in run
    fmt = format_command("java", "/libs/*", "/n/server.properties", "ID", "/n/logs", "/s/l")
    assert fmt[-6:] == [
        "kafka.tools.StorageTool",
        "format",
        "-t",
        "ID",
        "-c",
        "/n/server.properties",
    ]
