"""Topic configuration with Apache Kafka's names, defaults and meanings.

Pure: parsing and validation only, no I/O. Values may be given as Kafka's strings or as Python
values (``"compact,delete"``, ``["compact", "delete"]``, ``86400000``, ``"86400000"``).

Settings the embedded log honours:

===============================  ============================================================
``cleanup.policy``               ``delete``, ``compact`` or both
``retention.ms``                 delete-policy: drop sealed segments older than this (-1: never)
``retention.bytes``              delete-policy: drop oldest sealed segments beyond this (-1: never)
``segment.bytes``                roll the active segment before it passes this size
``segment.ms``                   roll the active segment once it is this old
``min.compaction.lag.ms``        never compact a record younger than this
``max.compaction.lag.ms``        compact a dirty segment older than this whatever the dirty ratio
``delete.retention.ms``          keep a tombstone this long after the cleaner first saw it
``min.cleanable.dirty.ratio``    the background cleaner starts when dirty/total passes this
``max.message.bytes``            the largest record (key + value + headers) accepted
``index.interval.bytes``         bytes between two entries of the sparse offset index
``file.delete.delay.ms``         how long replaced segment files stay on disk after a swap
===============================  ============================================================

Kafka settings that only mean something on a cluster (``min.insync.replicas``,
``unclean.leader.election.enable``) are accepted and kept so that one topic description works on
both backends; the embedded log has a single copy and ignores them. So is
``message.timestamp.type`` (``CreateTime`` or ``LogAppendTime``): on Kafka ``LogAppendTime``
has the leader broker stamp every record with its clock when it stores it, where
``CreateTime`` keeps the producer's stamp; the embedded log stamps a record that comes
without a timestamp with the appending process's clock when it stores it, whichever is set.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from kafkakv.errors import ConfigError

__all__ = ["TopicConfig", "parse_topic_config", "validate_topic_name"]

_MAX_INT = 2**31 - 1
_MAX_LONG = 2**63 - 1
_LEGAL_NAME = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


@dataclass(frozen=True, slots=True)
class TopicConfig:
    """Validated topic settings. Field names are Kafka's with ``.`` replaced by ``_``."""

    cleanup_policy: frozenset[str] = frozenset({"delete"})
    retention_ms: int = 7 * 24 * 3600 * 1000
    retention_bytes: int = -1
    segment_bytes: int = 1 << 30
    segment_ms: int = 7 * 24 * 3600 * 1000
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = _MAX_LONG
    delete_retention_ms: int = 24 * 3600 * 1000
    min_cleanable_dirty_ratio: float = 0.5
    max_message_bytes: int = 1048588
    index_interval_bytes: int = 4096
    file_delete_delay_ms: int = 60000
    min_insync_replicas: int = 1
    unclean_leader_election_enable: bool = False
    message_timestamp_type: str = "CreateTime"

    @property
    def compact(self) -> bool:
        """True when the cleaner compacts this topic."""
        return "compact" in self.cleanup_policy

    @property
    def delete(self) -> bool:
        """True when retention by time and size applies."""
        return "delete" in self.cleanup_policy

    def to_kafka(self) -> dict[str, str]:
        """Every setting as Kafka's name → string, as ``describe`` shows them."""
        out: dict[str, str] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            name = f.name.replace("_", ".")
            if isinstance(value, frozenset):
                text = ",".join(p for p in ("compact", "delete") if p in value)
            elif isinstance(value, bool):
                text = "true" if value else "false"
            else:
                text = str(value)
            out[name] = text
        return out


def _as_int(name: str, raw: object, low: int, high: int) -> int:
    if isinstance(raw, bool):
        raise ConfigError(f"{name} must be an integer, not {raw!r}")
    if isinstance(raw, int):
        value = raw
    elif isinstance(raw, str):
        try:
            value = int(raw.strip())
        except ValueError:
            raise ConfigError(f"{name} must be an integer, not {raw!r}") from None
    else:
        raise ConfigError(f"{name} must be an integer, not {type(raw).__name__}")
    if not low <= value <= high:
        raise ConfigError(f"{name} must be between {low} and {high}, not {value}")
    return value


def _as_ratio(name: str, raw: object) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float | str):
        raise ConfigError(f"{name} must be a number between 0 and 1, not {raw!r}")
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number between 0 and 1, not {raw!r}") from None
    if not 0.0 <= value <= 1.0:
        raise ConfigError(f"{name} must be between 0 and 1, not {value}")
    return value


def _as_bool(name: str, raw: object) -> bool:
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and raw.strip().lower() in ("true", "false"):
        return raw.strip().lower() == "true"
    raise ConfigError(f"{name} must be true or false, not {raw!r}")


def _as_timestamp_type(name: str, raw: object) -> str:
    if raw not in ("CreateTime", "LogAppendTime"):
        raise ConfigError(f"{name} must be 'CreateTime' or 'LogAppendTime', not {raw!r}")
    return str(raw)


def _as_policy(name: str, raw: object) -> frozenset[str]:
    parts: Iterable[object]
    if isinstance(raw, str):
        parts = raw.split(",")
    elif isinstance(raw, list | tuple | set | frozenset):
        parts = raw
    else:
        raise ConfigError(f"{name} must be 'delete', 'compact' or both, not {raw!r}")
    policy = frozenset(str(p).strip() for p in parts)
    if not policy or not policy <= {"delete", "compact"}:
        raise ConfigError(f"{name} must be 'delete', 'compact' or both, not {raw!r}")
    return policy


_PARSERS: dict[str, Callable[[str, object], object]] = {
    "cleanup.policy": _as_policy,
    "retention.ms": lambda n, v: _as_int(n, v, -1, _MAX_LONG),
    "retention.bytes": lambda n, v: _as_int(n, v, -1, _MAX_LONG),
    "segment.bytes": lambda n, v: _as_int(n, v, 1024, _MAX_INT),
    "segment.ms": lambda n, v: _as_int(n, v, 1, _MAX_LONG),
    "min.compaction.lag.ms": lambda n, v: _as_int(n, v, 0, _MAX_LONG),
    "max.compaction.lag.ms": lambda n, v: _as_int(n, v, 1, _MAX_LONG),
    "delete.retention.ms": lambda n, v: _as_int(n, v, 0, _MAX_LONG),
    "min.cleanable.dirty.ratio": _as_ratio,
    "max.message.bytes": lambda n, v: _as_int(n, v, 0, _MAX_INT),
    "index.interval.bytes": lambda n, v: _as_int(n, v, 0, _MAX_INT),
    "file.delete.delay.ms": lambda n, v: _as_int(n, v, 0, _MAX_LONG),
    "min.insync.replicas": lambda n, v: _as_int(n, v, 1, _MAX_INT),
    "unclean.leader.election.enable": _as_bool,
    "message.timestamp.type": _as_timestamp_type,
}


def parse_topic_config(config: Mapping[str, object] | None) -> TopicConfig:
    """Validate ``config`` (Kafka names) and fill in Kafka's defaults.

    Raises :class:`~kafkakv.errors.ConfigError` naming the first unknown name or bad value.

    >>> parse_topic_config({"cleanup.policy": "compact"}).compact
    True
    """
    values: dict[str, Any] = {}
    for name, raw in (config or {}).items():
        parser = _PARSERS.get(name)
        if parser is None:
            known = ", ".join(sorted(_PARSERS))
            raise ConfigError(f"unknown topic config {name!r}; known names: {known}")
        values[name.replace(".", "_")] = parser(name, raw)
    return replace(TopicConfig(), **values)


def validate_topic_name(name: object) -> str:
    """Kafka's rules: 1-249 characters of ``[a-zA-Z0-9._-]``, not ``.`` or ``..``."""
    if not isinstance(name, str):
        raise ConfigError(f"a topic name must be a str, not {type(name).__name__}")
    if not name or len(name) > 249:
        raise ConfigError(f"a topic name must have 1 to 249 characters, not {len(name)}")
    if name in (".", ".."):
        raise ConfigError(f"{name!r} is not a legal topic name")
    bad = sorted(set(name) - _LEGAL_NAME)
    if bad:
        raise ConfigError(
            f"topic name {name!r} has illegal characters {''.join(bad)!r}; "
            "use ASCII letters, digits, '.', '_' and '-'"
        )
    return name
