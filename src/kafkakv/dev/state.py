"""The state file of a dev cluster: ``<state dir>/cluster.json``.

It records what the storage was formatted for (cluster id, broker count, base port, Kafka
version) and the pid of every broker started from the directory, so that another process (the
``kafkakv dev-cluster status`` and ``stop`` commands) can find the brokers.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kafkakv.dev.errors import ClusterError

__all__ = ["STATE_FILE", "ClusterState"]

STATE_FILE = "cluster.json"


@dataclass
class ClusterState:
    """What ``cluster.json`` holds."""

    cluster_id: str
    brokers: int
    base_port: int
    kafka_version: str
    pids: dict[int, int] = field(default_factory=dict)
    """node id → pid of the broker last started for it (absent when stopped)."""

    @classmethod
    def load(cls, state_dir: Path) -> ClusterState | None:
        """The state recorded in ``state_dir``; ``None`` when there is none.

        Raises :class:`~kafkakv.dev.errors.ClusterError` when the file exists but cannot be read.
        """
        path = state_dir / STATE_FILE
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
            return cls(
                cluster_id=str(doc["cluster_id"]),
                brokers=int(doc["brokers"]),
                base_port=int(doc["base_port"]),
                kafka_version=str(doc["kafka_version"]),
                pids={int(k): int(v) for k, v in dict(doc.get("pids", {})).items()},
            )
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ClusterError(f"{path} is not a dev cluster state file: {exc}") from exc

    def save(self, state_dir: Path) -> None:
        """Write the state atomically (a temporary file renamed over the old one)."""
        path = state_dir / STATE_FILE
        temporary = state_dir / f"{STATE_FILE}.tmp"
        doc = asdict(self)
        doc["pids"] = {str(k): v for k, v in sorted(self.pids.items())}
        try:
            temporary.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
            os.replace(temporary, path)
        except OSError as exc:
            raise ClusterError(f"cannot write {path}: {exc}") from exc
