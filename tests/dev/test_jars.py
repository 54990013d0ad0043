"""The jar cache: what counts as complete, and how a failed fetch reads."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kafkakv.dev import DEFAULT_KAFKA_VERSION, cached_jars, fetch_kafka
from kafkakv.dev.errors import ClusterError, JarFetchError


def _fake_cache(root: Path, version: str, libs: list[str], **more: str) -> Path:
    home = root / f"kafka-{version}"
    (home / "libs").mkdir(parents=True)
    for name in libs:
        (home / "libs" / name).write_bytes(b"jar")
    manifest = {"version": version, "libs": libs, **more}
    (home / "complete.json").write_text(json.dumps(manifest))
    return home


def test_a_complete_cache_is_used_without_maven(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = _fake_cache(tmp_path, "9.9.9", ["kafka_2.13-9.9.9.jar", "a.jar"])
    monkeypatch.setenv("PATH", "")  # no mvn, no java: any Maven run would fail
    jars = fetch_kafka("9.9.9", tmp_path)
    assert jars.libs == home / "libs"
    assert jars.classpath == f"{home / 'libs'}/*"


def test_a_cache_written_with_the_jdbc_driver_is_still_complete(tmp_path: Path) -> None:
    """Caches from before the pipeline fetched its driver itself list it too: still used."""
    home = _fake_cache(tmp_path, "9.9.9", ["kafka_2.13-9.9.9.jar"], jdbc="postgresql-42.7.1.jar")
    jars = cached_jars("9.9.9", tmp_path)
    assert jars is not None and jars.libs == home / "libs"


def test_a_cache_missing_a_listed_jar_is_incomplete(tmp_path: Path) -> None:
    home = _fake_cache(tmp_path, "9.9.9", ["kafka_2.13-9.9.9.jar"])
    assert cached_jars("9.9.9", tmp_path) is not None
    (home / "libs" / "kafka_2.13-9.9.9.jar").unlink()
    assert cached_jars("9.9.9", tmp_path) is None
    (home / "complete.json").write_text("{not json")
    assert cached_jars("9.9.9", tmp_path) is None


def test_missing_maven_is_a_typed_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "")
    with pytest.raises(JarFetchError, match="mvn not found") as caught:
        fetch_kafka("9.9.9", tmp_path)
    assert isinstance(caught.value, ClusterError)


@pytest.mark.kafka
def test_maven_failure_shows_the_tail_of_its_output(tmp_path: Path) -> None:
    with pytest.raises(JarFetchError) as caught:
        fetch_kafka("0.0.0-no-such-release", tmp_path)
    message = str(caught.value)
    assert "Maven failed" in message
    assert "kafka_2.13" in message  # Maven's own words name the artifact it could not find
    assert cached_jars("0.0.0-no-such-release", tmp_path) is None


_FETCH = """
import sys
from pathlib import Path
from kafkakv.dev import fetch_kafka
jars = fetch_kafka(cache_root=Path(sys.argv[1]), progress=lambda line: print("RAN MAVEN"))
print(jars.home)
"""


@pytest.mark.kafka
def test_two_processes_fetching_at_once_run_maven_once(tmp_path: Path) -> None:
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", _FETCH, str(tmp_path)], stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outputs = [run.communicate(timeout=900)[0] for run in runs]
    assert [run.returncode for run in runs] == [0, 0]
    assert sum(out.count("RAN MAVEN") for out in outputs) == 1
    homes = {out.split()[-1] for out in outputs}
    assert homes == {str(tmp_path / f"kafka-{DEFAULT_KAFKA_VERSION}")}
    jars = cached_jars(cache_root=tmp_path)
    assert jars is not None and (jars.libs / f"kafka_2.13-{jars.version}.jar").is_file()
