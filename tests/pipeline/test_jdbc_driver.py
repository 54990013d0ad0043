"""The PostgreSQL JDBC driver jar: cached once, reused, fetched with Maven on its own."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from kafkakv.errors import PipelineError
from kafkakv.pipeline.jdbc_driver import POSTGRES_JDBC_VERSION, jdbc_cache_dir, postgres_jdbc_jar


def test_a_cached_jar_is_returned_without_maven(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cached = tmp_path / "jdbc" / "postgresql-42.0.0.jar"
    cached.parent.mkdir()
    cached.write_bytes(b"jar")
    monkeypatch.setenv("PATH", "")  # any Maven run would fail
    assert postgres_jdbc_jar("42.0.0", tmp_path) == cached


def test_a_jar_cached_beside_the_kafka_jars_is_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    earlier = tmp_path / "kafka-4.3.1" / "jdbc" / "postgresql-42.0.0.jar"
    earlier.parent.mkdir(parents=True)
    earlier.write_bytes(b"the old copy")
    monkeypatch.setenv("PATH", "")
    jar = postgres_jdbc_jar("42.0.0", tmp_path)
    assert jar == tmp_path / "jdbc" / "postgresql-42.0.0.jar"
    assert jar.read_bytes() == b"the old copy"
    assert [p.name for p in jar.parent.iterdir()] == [jar.name]  # no staging left


def test_missing_maven_is_a_pipeline_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "")
    with pytest.raises(PipelineError, match="mvn not found"):
        postgres_jdbc_jar("42.0.0", tmp_path)
    assert list(jdbc_cache_dir(tmp_path).iterdir()) == []


def test_the_cache_root_follows_kafkakv_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KAFKAKV_CACHE", str(tmp_path))
    assert jdbc_cache_dir() == tmp_path / "jdbc"


@pytest.mark.kafka
def test_maven_fetches_the_driver(tmp_path: Path) -> None:
    said: list[str] = []
    jar = postgres_jdbc_jar(cache_root=tmp_path, progress=said.append)
    assert jar == tmp_path / "jdbc" / f"postgresql-{POSTGRES_JDBC_VERSION}.jar"
    with zipfile.ZipFile(jar) as archive:
        assert "org/postgresql/Driver.class" in archive.namelist()
    assert len(said) == 1
    assert postgres_jdbc_jar(cache_root=tmp_path, progress=said.append) == jar
    assert len(said) == 1  # the second call found it cached


@pytest.mark.kafka
def test_maven_failure_is_a_pipeline_error(tmp_path: Path) -> None:
    with pytest.raises(PipelineError, match="Maven failed"):
        postgres_jdbc_jar("0.0.0-no-such-release", tmp_path)
