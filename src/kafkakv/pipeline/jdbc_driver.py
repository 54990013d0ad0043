"""The PostgreSQL JDBC driver that Spark's JDBC source needs, fetched once from Maven Central.

The jar is kept as ``${KAFKAKV_CACHE:-~/.cache/kafkakv}/jdbc/postgresql-<version>.jar``.
:func:`postgres_jdbc_jar` returns it at once when it is there; a jar of the same version that
an older kafkakv cached beside the Kafka jars (``kafka-*/jdbc/``) is copied in instead of
fetched again. Otherwise one Maven run (``dependency:copy`` of ``org.postgresql:postgresql``,
no project file) writes it into a private staging directory, and an atomic rename publishes it:
two processes fetching at once both succeed, and a reader never sees half a jar. Maven keeps
its own cache in ``~/.m2``, so a later fetch downloads nothing.

This module is part of the pipeline, for its users: it needs ``mvn`` and ``java`` only when
the jar is not cached yet. Nothing here touches the development cluster in :mod:`kafkakv.dev`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from kafkakv.errors import PipelineError

__all__ = ["POSTGRES_JDBC_VERSION", "jdbc_cache_dir", "postgres_jdbc_jar"]

POSTGRES_JDBC_VERSION = "42.7.14"
"""The version of ``org.postgresql:postgresql`` fetched by default."""

_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy"
_MAVEN_TIMEOUT_S = 600.0
_TAIL_LINES = 20


def jdbc_cache_dir(cache_root: Path | None = None) -> Path:
    """Where the driver jars are kept: ``<cache root>/jdbc``, the cache root being
    ``cache_root``, else ``$KAFKAKV_CACHE``, else ``~/.cache/kafkakv``. No I/O."""
    if cache_root is None:
        configured = os.environ.get("KAFKAKV_CACHE")
        cache_root = Path(configured) if configured else Path.home() / ".cache" / "kafkakv"
    return cache_root / "jdbc"


def postgres_jdbc_jar(
    version: str = POSTGRES_JDBC_VERSION,
    cache_root: Path | None = None,
    *,
    progress: Callable[[str], None] | None = None,
) -> Path:
    """The path of the PostgreSQL JDBC driver jar ``version``, fetched unless cached.

    Costs one ``stat`` when cached; else one Maven run (a few seconds, more with an empty
    ``~/.m2``). ``progress`` receives one line before Maven runs. Raises
    :class:`~kafkakv.errors.PipelineError` when ``mvn`` is missing, Maven fails or times out
    (the message ends with its output), or the cache cannot be written.
    """
    name = f"postgresql-{version}.jar"
    cache = jdbc_cache_dir(cache_root)
    jar = cache / name
    if jar.is_file():
        return jar
    try:
        cache.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".fetch-", dir=cache))
    except OSError as exc:
        raise PipelineError(f"cannot create the JDBC driver cache {cache}: {exc}") from exc
    try:
        earlier = sorted(cache.parent.glob(f"kafka-*/jdbc/{name}"))
        if earlier:
            shutil.copyfile(earlier[-1], staging / name)
        else:
            if progress is not None:
                progress(f"fetching the PostgreSQL JDBC driver {version} with Maven into {cache}")
            _run_maven(version, staging)
        os.replace(staging / name, jar)
    except OSError as exc:
        raise PipelineError(f"cannot store the JDBC driver in {cache}: {exc}") from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return jar


def _run_maven(version: str, staging: Path) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise PipelineError(
            "mvn not found: install Apache Maven to fetch the PostgreSQL JDBC driver, or pass "
            "the driver jar yourself"
        )
    command = [
        mvn,
        "-B",
        "-q",
        "-Dstyle.color=never",
        _PLUGIN,
        f"-Dartifact=org.postgresql:postgresql:{version}",
        f"-DoutputDirectory={staging}",
    ]
    try:
        done = subprocess.run(
            command,
            cwd=staging,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=_MAVEN_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise PipelineError(
            f"Maven did not fetch the PostgreSQL JDBC driver {version} within "
            f"{_MAVEN_TIMEOUT_S:.0f} s"
        ) from exc
    except OSError as exc:
        raise PipelineError(f"cannot run {mvn}: {exc}") from exc
    if done.returncode != 0 or not (staging / f"postgresql-{version}.jar").is_file():
        said = "\n".join((done.stdout + done.stderr).splitlines()[-_TAIL_LINES:])
        raise PipelineError(
            f"Maven failed (exit {done.returncode}) fetching the PostgreSQL JDBC driver "
            f"{version}:\n{said}"
        )
