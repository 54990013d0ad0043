"""The manifest: which segment files make up a partition.

A small JSON file replaced atomically (write a temporary file, rename over). Segment files are
named ``<base offset, 20 digits>-<generation>``; a cleaned segment gets a new generation, so a
swap never overwrites a file that a reader in another process may have open. Files in the
partition directory that the manifest does not list are leftovers of an interrupted swap.
"""

from __future__ import annotations

import itertools
import json
import os
from dataclasses import asdict, dataclass

from kafkakv.errors import CorruptLogError
from kafkakv.log.embedded import fs

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
    def from_json(text: str | bytes, path: str) -> Manifest:
        """Parse a manifest; anything that is not one (bad bytes, bad JSON, a field missing
        or of the wrong type, segments out of order or misnamed) raises
        :class:`CorruptLogError` naming ``path``: the one decode boundary of this file."""
        try:
            doc = json.loads(text)  # bytes that are not UTF-8: UnicodeDecodeError, a ValueError
            segments = tuple(_segment(s) for s in doc["segments"])
            if not segments:
                raise ValueError("no segments")
            for before, after in itertools.pairwise(segments):
                if after.base <= before.base:
                    raise ValueError(f"segment {after.name} does not follow {before.name}")
            return Manifest(
                version=_int(doc["version"]),
                segments=segments,
                clean_upto=_int(doc["clean_upto"]),
                next_generation=_int(doc["next_generation"]),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptLogError(f"unreadable manifest {path}: {exc!r}", path=path) from exc

    @staticmethod
    def load(directory: str) -> Manifest:
        """Read and parse ``manifest.json``; OSError when it cannot be read (see from_json)."""
        path = os.path.join(directory, MANIFEST)
        with open(path, "rb") as f:
            return Manifest.from_json(f.read(), path)

    def save(self, directory: str, *, mode: int = 0o644) -> None:
        """Replace the manifest atomically and durably, under every fsync policy (it changes
        only when the layout does: a roll, a compaction, retention). A new file gets ``mode``
        (before the umask).

        The directory is synced before the rename as well as after it: the segment files this
        manifest names (a roll's new segment, a compaction's output) were created in it just
        before, and a manifest must never be durable while a name it lists is not. The
        crash-state explorer found the state in between, where the rename survives a power
        loss and the create does not (tests/log/test_crash_explorer.py)."""
        path = os.path.join(directory, MANIFEST)
        fs.fsync_dir(directory)
        data = self.to_json().encode()
        fs.replace_file(path, data, mode, tmp=f"{path}.tmp.{os.getpid()}")


def _int(value: object) -> int:
    if type(value) is not int or value < 0:
        raise TypeError(f"{value!r} is not a count or offset")
    return value


def _segment(doc: object) -> SegmentInfo:
    if not isinstance(doc, dict) or not isinstance(doc.get("name"), str):
        raise TypeError(f"{doc!r} is not a segment")
    info = SegmentInfo(**doc)
    base, _, generation = info.name.partition("-")
    if base != f"{_int(info.base):020d}" or not generation.isdigit():
        raise ValueError(f"segment {info.name!r} is not named after its base {info.base}")
    for value in (info.created_ms, info.size, info.max_ts, info.tombstone_horizon):
        if value is not None and type(value) is not int:
            raise TypeError(f"segment {info.name}: {value!r} is not an integer")
    if info.size is not None and info.size < 0:
        raise ValueError(f"segment {info.name}: size {info.size}")
    return info
