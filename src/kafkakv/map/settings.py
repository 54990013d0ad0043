"""Settings of a map replica, validated once when the map opens."""

from __future__ import annotations

from dataclasses import dataclass

from kafkakv.errors import ConfigError

__all__ = ["BARRIERS", "CONSISTENCY", "MapSettings"]

CONSISTENCY = ("local", "linearizable")
BARRIERS = ("auto", "offset", "shared", "per-read")


@dataclass(frozen=True)
class MapSettings:
    """How a replica behaves. Every time is in seconds.

    ``flush_period``: ops of one partition between two flushes to the data topic.
    ``timeout``: the longest any update, ``sync`` or bootstrap step waits before raising
    :class:`~kafkakv.errors.OperationTimeoutError`.
    ``max_in_flight``: async updates appended but not yet applied, per replica; the next
    ``*_async`` call blocks (up to ``timeout``) until one completes.
    ``consistency``: ``"local"`` reads the replica as it is; ``"linearizable"`` makes every read
    wait for a barrier first (shared by concurrent readers).
    ``barriers``: how ``sync`` learns how far the log reaches. ``"auto"`` (the default) reads
    the end offset where the log guarantees it is authoritative (the embedded log) and appends
    shared barrier records otherwise; ``"offset"`` and ``"shared"`` force one of the two;
    ``"per-read"`` appends one barrier record per call and exists only to measure what the
    others save.
    ``hash_tags``: keys place by their hash tag (see :mod:`kafkakv.map.keyspace`); fixed when
    the map is created (recorded in its data topic), so a replica that says True or False
    must say what the map was created with. None (the default): as the map was created;
    False for a new map.
    ``versions``: every key carries the ops offset of its last change; fixed likewise.
    ``expiry``: keys may be put with a time to live; fixed likewise.
    """

    flush_period: int = 1000
    timeout: float = 30.0
    max_in_flight: int = 10_000
    consistency: str = "local"
    barriers: str = "auto"
    hash_tags: bool | None = None
    versions: bool | None = None
    expiry: bool | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.flush_period, int) or self.flush_period < 1:
            raise ConfigError(f"flush_period must be an int >= 1, not {self.flush_period!r}")
        if not isinstance(self.timeout, int | float) or not self.timeout > 0:
            raise ConfigError(f"timeout must be a positive number of seconds, not {self.timeout!r}")
        if not isinstance(self.max_in_flight, int) or self.max_in_flight < 1:
            raise ConfigError(f"max_in_flight must be an int >= 1, not {self.max_in_flight!r}")
        if self.barriers not in BARRIERS:
            raise ConfigError(
                f"barriers must be one of {', '.join(BARRIERS)}, not {self.barriers!r}"
            )
        for name in ("hash_tags", "versions", "expiry"):
            if getattr(self, name) not in (None, True, False):
                raise ConfigError(
                    f"{name} must be True, False or None (as created), not {getattr(self, name)!r}"
                )
        if self.consistency not in CONSISTENCY:
            raise ConfigError(
                f"consistency must be one of {', '.join(CONSISTENCY)}, not {self.consistency!r}"
            )
