"""Fixtures of the pipeline tests: a log target on each backend."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest


@pytest.fixture(params=["embedded", "kafka"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where a job writes: an embedded log directory, or the 3-broker test cluster."""
    if request.param == "embedded":
        return str(tmp_path / "log")
    cluster = request.getfixturevalue("kafka_cluster")
    return f"kafka://{cluster.bootstrap}"


@pytest.fixture
def name() -> str:
    """A map or topic name unique to the test (Kafka topics outlive a test)."""
    return f"p-{uuid.uuid4().hex[:10]}"
