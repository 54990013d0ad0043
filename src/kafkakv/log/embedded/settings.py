"""Settings of an embedded log (per open log, not per topic)."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from kafkakv.errors import ConfigError

__all__ = ["EmbeddedSettings", "FsyncPolicy"]


class FsyncPolicy(enum.Enum):
    """When appended data is forced to stable storage.

    A process that dies (``kill -9``, a crash) loses nothing it was told was appended under any
    policy: the data is in the operating system's page cache once ``append`` returns. The
    policies differ only when the *machine* stops (power loss, kernel panic):

    ``ALWAYS``
        ``append`` returns after ``fdatasync`` of the segment (and, for a transactional
        writer, of its journal). No acknowledged batch is lost. Slowest: one disk flush per
        append call, so batch your records.
    ``INTERVAL``
        ``append`` returns after the write; a background thread of the log (one per open log)
        flushes the partitions appended to every ``fsync_interval_ms``, outside their locks, and
        ``close()`` flushes the rest. A power loss may lose the batches appended since the last
        flush (about one interval). With ``fsync_interval_ms=0`` each append flushes, as under
        ``ALWAYS``. The default.
    ``NEVER``
        the operating system writes data back when it chooses (typically within 30 s).

    The policy governs appended data. A transaction's commit, and every change of layout (a
    new log or topic, a segment roll, a compaction's swap, retention), sync under every
    policy: they are rare, and they are what keeps a transaction whole and the log openable
    after a power loss (docs/embedded-log.md, "Crash consistency").
    """

    ALWAYS = "always"
    INTERVAL = "interval"
    NEVER = "never"


@dataclass(frozen=True, slots=True)
class EmbeddedSettings:
    fsync: FsyncPolicy = FsyncPolicy.INTERVAL
    fsync_interval_ms: int = 1000
    background_cleaner: bool = True
    cleaner_interval_s: float = 5.0
    lock_timeout: float = 30.0
    """Seconds a call waits for a lock another process holds, unless it is given a timeout."""
    private: bool = False
    """Create directories 0700 and files 0600 (else 0755 and 0644); the umask only takes bits
    away, so it can never give group or others access to a private log's files."""

    @property
    def file_mode(self) -> int:
        """The mode new files are created with (before the umask)."""
        return 0o600 if self.private else 0o644

    @property
    def dir_mode(self) -> int:
        """The mode new directories are created with (before the umask)."""
        return 0o700 if self.private else 0o755

    @staticmethod
    def make(
        fsync: FsyncPolicy | str,
        fsync_interval_ms: int,
        background_cleaner: bool,
        cleaner_interval_s: float,
        lock_timeout: float = 30.0,
        private: bool = False,
    ) -> EmbeddedSettings:
        try:
            policy = FsyncPolicy(fsync) if isinstance(fsync, str) else fsync
        except ValueError:
            raise ConfigError(
                f"fsync must be 'always', 'interval' or 'never', not {fsync!r}"
            ) from None
        if not isinstance(policy, FsyncPolicy):
            raise ConfigError(f"fsync must be a FsyncPolicy or str, not {type(fsync).__name__}")
        if not isinstance(fsync_interval_ms, int) or fsync_interval_ms < 0:
            raise ConfigError(f"fsync_interval_ms must be an int >= 0, not {fsync_interval_ms!r}")
        if not cleaner_interval_s > 0:
            raise ConfigError(f"cleaner_interval_s must be > 0, not {cleaner_interval_s!r}")
        if (
            isinstance(lock_timeout, bool)
            or not isinstance(lock_timeout, (int, float))
            or math.isnan(lock_timeout)
            or lock_timeout < 0
        ):
            raise ConfigError(
                f"lock_timeout must be a number of seconds >= 0, not {lock_timeout!r}"
            )
        if not isinstance(private, bool):
            raise ConfigError(f"private must be a bool, not {private!r}")
        return EmbeddedSettings(
            policy,
            fsync_interval_ms,
            bool(background_cleaner),
            float(cleaner_interval_s),
            float(lock_timeout),
            private,
        )
