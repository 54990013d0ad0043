"""The manifest: which segment files make up a partition.

A small JSON file replaced atomically (write a temporary file, rename over). Segment files are
named ``<base offset, 20 digits>-<generation>``; a cleaned segment gets a new generation, so a
swap never overwrites a file that a reader in another process may have open. Files in the
partition directory that the manifest does not list are leftovers of an interrupted swap.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

from kafkakv.errors import CorruptLogError
from kafkakv.log.embedded.settings import file_opener

__all__ = ["Manifest", "SegmentInfo", "segment_name"]

MANIFEST = "manifest.json"


def segment_name(base: int, generation: int) -> str:
    return f"{base:020d}-{generation}"


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """One segment. ``size`` and ``max_ts`` are set once it is sealed (no longer active)."""

    base: int
    name: str
    created_ms: int
    size: int | None = None
    max_ts: int | None = None
    tombstone_horizon: int | None = None
    """Earliest delete horizon (ms) of the tombstones the cleaner kept in this segment."""


@dataclass(frozen=True, slots=True)
class Manifest:
    version: int
    segments: tuple[SegmentInfo, ...]
    clean_upto: int = 0
    """Offsets below this have been through the cleaner (the clean section)."""
    next_generation: int = 1

    @property
    def active(self) -> SegmentInfo:
        return self.segments[-1]

    @property
    def sealed(self) -> tuple[SegmentInfo, ...]:
        return self.segments[:-1]

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": 1,
                "version": self.version,
                "clean_upto": self.clean_upto,
                "next_generation": self.next_generation,
                "segments": [asdict(s) for s in self.segments],
            },
            indent=1,
        )

    @staticmethod
    def from_json(text: str, path: str) -> Manifest:
        try:
            doc = json.loads(text)
            segments = tuple(SegmentInfo(**s) for s in doc["segments"])
            if not segments:
                raise ValueError("no segments")
            return Manifest(
                version=int(doc["version"]),
                segments=segments,
                clean_upto=int(doc["clean_upto"]),
                next_generation=int(doc["next_generation"]),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptLogError(f"unreadable manifest: {exc}", path=path) from exc

    @staticmethod
    def load(directory: str) -> Manifest:
        path = os.path.join(directory, MANIFEST)
        with open(path, encoding="utf-8") as f:
            return Manifest.from_json(f.read(), path)

    def save(self, directory: str, *, durable: bool, mode: int = 0o644) -> None:
        """Replace the manifest atomically; with ``durable`` also fsync file and directory.
        A new file gets ``mode`` (before the umask)."""
        path = os.path.join(directory, MANIFEST)
        tmp = f"{path}.tmp.{os.getpid()}"
        with open(tmp, "w", encoding="utf-8", opener=file_opener(mode)) as f:
            f.write(self.to_json())
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
        if durable:
            fsync_dir(directory)


def fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
