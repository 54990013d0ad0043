"""The Apache Kafka broker jars, fetched once with Maven.

The cache is ``${KAFKAKV_CACHE:-~/.cache/kafkakv}/kafka-<version>/``::

    pom.xml        the copy of this package's pom.xml that Maven ran on
    maven.log      Maven's output from the fetch
    libs/          every runtime jar of kafka_2.13 (broker, storage tool, kafka-clients)
                   plus the log4j2 binding
    complete.json  written last: the file names above; without it the cache is incomplete

:func:`fetch_kafka` returns at once when ``complete.json`` lists files that all exist; else it
takes an exclusive lock on ``kafka-<version>/.lock`` (so two processes fetching at once run
Maven once), runs ``mvn validate`` into a staging directory and moves the result in place.
Maven keeps its own cache in ``~/.m2``, so a second fetch of the same version downloads nothing.
The PostgreSQL JDBC driver is the pipeline's business: :mod:`kafkakv.pipeline.jdbc_driver`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from kafkakv.dev.errors import ClusterError, JarFetchError
from kafkakv.dev.lock import exclusive_lock
from kafkakv.dev.process import log_tail

__all__ = [
    "DEFAULT_KAFKA_VERSION",
    "KafkaJars",
    "cached_jars",
    "default_cache_root",
    "fetch_kafka",
    "find_java",
]

DEFAULT_KAFKA_VERSION = "4.3.1"
"""The newest Apache Kafka release whose every runtime jar is on Maven Central (4.4.0's
``kafka-tools-api`` was missing when this was chosen)."""

Progress = Callable[[str], None]
"""Receives one line of progress for a person to read."""

_MANIFEST = "complete.json"
_MAVEN_TIMEOUT_S = 900.0
_LOCK_TIMEOUT_S = 960.0


@dataclass(frozen=True)
class KafkaJars:
    """A complete cache of one Kafka version's jars."""

    version: str
    home: Path
    """``<cache root>/kafka-<version>``."""
    libs: Path
    """The directory of the broker's runtime jars."""

    @property
    def classpath(self) -> str:
        """A ``java -cp`` value holding every jar in :attr:`libs` (a ``dir/*`` wildcard)."""
        return f"{self.libs}{os.sep}*"


def default_cache_root() -> Path:
    """``$KAFKAKV_CACHE`` when set, else ``~/.cache/kafkakv``."""
    configured = os.environ.get("KAFKAKV_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "kafkakv"


def find_java() -> str:
    """The ``java`` to run brokers with: ``$JAVA_HOME/bin/java``, else the one on ``PATH``.

    Raises :class:`~kafkakv.dev.errors.ClusterError` when there is none.
    """
    home = os.environ.get("JAVA_HOME")
    if home and os.access(os.path.join(home, "bin", "java"), os.X_OK):
        return os.path.join(home, "bin", "java")
    found = shutil.which("java")
    if found is None:
        raise ClusterError("java not found (install a JDK 17 or newer, or set JAVA_HOME)")
    return found


def cached_jars(
    version: str = DEFAULT_KAFKA_VERSION, cache_root: Path | None = None
) -> KafkaJars | None:
    """The cached jars of ``version`` when the cache is complete, else ``None``.

    Reads one small file and checks that every jar it names exists; no Maven.
    """
    home = (cache_root or default_cache_root()) / f"kafka-{version}"
    try:
        manifest = json.loads((home / _MANIFEST).read_text(encoding="utf-8"))
        names = list(manifest["libs"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    libs = home / "libs"
    if not names or not all((libs / name).is_file() for name in names):
        return None
    return KafkaJars(version, home, libs)


def fetch_kafka(
    version: str = DEFAULT_KAFKA_VERSION,
    cache_root: Path | None = None,
    *,
    progress: Progress | None = None,
) -> KafkaJars:
    """The jars of Apache Kafka ``version``, fetched with Maven unless already cached.

    Costs one small file read when cached; otherwise one Maven run (tens of seconds with an
    empty ``~/.m2``) under an exclusive lock. Raises :class:`~kafkakv.dev.errors.JarFetchError`
    when ``mvn`` or ``java`` is missing or Maven fails (the message ends with its output).
    """
    jars = cached_jars(version, cache_root)
    if jars is not None:
        return jars
    home = (cache_root or default_cache_root()) / f"kafka-{version}"
    try:
        home.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise JarFetchError(f"cannot create the jar cache {home}: {exc}") from exc
    busy = JarFetchError(
        f"another process has been fetching into {home} for {_LOCK_TIMEOUT_S:.0f} s; "
        f"if none is running, remove {home / '.lock'}"
    )
    with exclusive_lock(home / ".lock", _LOCK_TIMEOUT_S, busy):
        jars = cached_jars(version, cache_root)  # another process may have just finished
        if jars is not None:
            return jars
        if progress is not None:
            progress(f"fetching Apache Kafka {version} jars with Maven into {home} ...")
        _run_maven(home, version)
        return _publish(home, version)


def _maven_command(mvn: str, pom: Path, staging: Path, version: str) -> list[str]:
    return [
        mvn,
        "-B",
        "-q",
        "-U",  # look again for what a failed earlier run recorded as missing
        "-Dstyle.color=never",
        "-f",
        str(pom),
        "validate",
        f"-Dkafka.version={version}",
        f"-Dlibs.dir={staging / 'libs'}",
    ]


def _run_maven(home: Path, version: str) -> None:
    """Run Maven on a copy of the shipped pom, copying the jars into ``home/staging``."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise JarFetchError("mvn not found: install Apache Maven to fetch the Kafka jars")
    find_java()  # Maven needs it too; fail with the plain message first
    pom = home / "pom.xml"
    staging = home / "staging"
    shutil.rmtree(staging, ignore_errors=True)
    pom.write_bytes(resources.files(__package__).joinpath("pom.xml").read_bytes())
    log = home / "maven.log"
    command = _maven_command(mvn, pom, staging, version)
    try:
        with open(log, "wb") as out:
            done = subprocess.run(
                command,
                cwd=home,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=_MAVEN_TIMEOUT_S,
                check=False,
            )
    except subprocess.TimeoutExpired as exc:
        raise JarFetchError(
            f"Maven did not finish within {_MAVEN_TIMEOUT_S:.0f} s fetching Kafka {version}:\n"
            + log_tail(log)
        ) from exc
    except OSError as exc:
        raise JarFetchError(f"cannot run {mvn}: {exc}") from exc
    if done.returncode != 0:
        raise JarFetchError(
            f"Maven failed (exit {done.returncode}) fetching Apache Kafka {version}; "
            f"full output in {log}:\n{log_tail(log)}"
        )


def _publish(home: Path, version: str) -> KafkaJars:
    """Move the staged jars in place and write the manifest last."""
    staging = home / "staging"
    names = sorted(p.name for p in (staging / "libs").glob("*.jar"))
    if f"kafka_2.13-{version}.jar" not in names:
        raise JarFetchError(
            f"Maven finished but {staging} lacks kafka_2.13-{version}.jar (found {len(names)} libs)"
        )
    shutil.rmtree(home / "libs", ignore_errors=True)
    os.replace(staging / "libs", home / "libs")
    shutil.rmtree(staging, ignore_errors=True)
    manifest = {"version": version, "libs": names}
    temporary = home / f"{_MANIFEST}.tmp"
    temporary.write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    os.replace(temporary, home / _MANIFEST)
    return KafkaJars(version, home, home / "libs")
