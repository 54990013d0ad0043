"""``kafkakv.metrics.serve``: a directory's metrics over HTTP, bound to 127.0.0.1."""

from __future__ import annotations

import socket
import urllib.request
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

import kafkakv
from kafkakv.errors import ConfigError
from kafkakv.metrics import serve


@pytest.mark.parametrize("backend", ["embedded"], indirect=True)
def test_serve_exposes_every_series_of_a_directory(
    db: kafkakv.Database, make_topic: Any, registry: CollectorRegistry
) -> None:
    topic = make_topic(partitions=2)
    topic.write([(b"a", b"1"), (b"b", b"nope")], partition=1)
    d = db.directory(topic.name, name="terminals", metrics=registry)
    with serve(registry=registry) as server:
        assert server.addr == "127.0.0.1" and server.port > 0
        body = urllib.request.urlopen(server.url, timeout=10).read().decode()
    labels = f'directory="terminals",topic="{topic.name}"'
    part = f'directory="terminals",partition="{{}}",topic="{topic.name}"'
    for line in (
        f"kafkakv_directory_ready{{{labels}}} 1.0",
        f"kafkakv_directory_entries{{{labels}}} 1.0",
        f"kafkakv_directory_records_total{{{labels}}} 2.0",
        f"kafkakv_directory_errors_total{{{labels}}} 1.0",
        f"kafkakv_directory_position{{{part.format(1)}}} 2.0",
        f"kafkakv_directory_end_offset{{{part.format(1)}}} 2.0",
        f"kafkakv_directory_lag{{{part.format(0)}}} 0.0",
    ):
        assert line in body, line
    assert f"kafkakv_directory_ready_seconds{{{labels}}}" in body
    # Closed: nothing answers there any more.
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", server.port), timeout=5)
    d.close()
    assert (
        registry.get_sample_value(
            "kafkakv_directory_ready", {"directory": "terminals", "topic": topic.name}
        )
        is None
    )


def test_serve_refuses_bad_ports() -> None:
    with pytest.raises(ConfigError, match="port"):
        serve(port=70000)
    with (
        serve(registry=CollectorRegistry()) as first,
        pytest.raises(ConfigError, match="cannot serve"),
    ):
        serve(port=first.port)
