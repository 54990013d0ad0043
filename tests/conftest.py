"""Fixtures shared by every test package."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from kafkakv.log import EmbeddedLog, Log

LOG_BACKENDS = ["embedded"]
"""Every Log backend the contract suite runs on (Kafka joins when its backend lands)."""


@pytest.fixture(params=LOG_BACKENDS)
def log(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Log]:
    """A fresh, open log of each backend."""
    if request.param == "embedded":
        lg = EmbeddedLog(tmp_path, background_cleaner=False)
    else:  # pragma: no cover - future backends
        raise AssertionError(f"unknown backend {request.param}")
    try:
        yield lg
    finally:
        lg.close()


@pytest.fixture
def topic() -> str:
    """A topic name unique to the test."""
    return f"t-{uuid.uuid4().hex[:12]}"
