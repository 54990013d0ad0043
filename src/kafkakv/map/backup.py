"""Backups of a map to a file, and restores from one, with no Spark and on any log.

A backup is one consistent snapshot: every key and value of the map, copied with applying
paused (:meth:`~kafkakv.map.ReplicaMap.encoded_snapshot`), with the cursor they were read at.
Keys and values are kept as the map's codecs encoded them, so a backup loses nothing (keys
this replica's codecs cannot read included) and restoring needs no codec. ::

    from kafkakv.map.backup import backup, restore

    backup(m, "accounts.kvbackup")                      # -> BackupHeader
    restore(db, "accounts", "accounts.kvbackup")         # into an empty or missing map
    restore(db, "accounts", "accounts.kvbackup", replace=True)   # the backup's contents only

The format (version 1): UTF-8 JSON lines, so that any language reads it with its standard
library, ``head -1`` shows what a file holds, and a truncated file is plain to see.

- Line 1, the header: a JSON object with ``"format": "kafkakv-map-backup"``, ``"version": 1``,
  ``"map"`` (the name), ``"partitions"`` (the topics' partition count), ``"cursor"`` (the
  position of the snapshot, ``str(cursor)`` as ``"0:120,1:98"``), ``"key_codec"`` and
  ``"value_codec"`` (names of the codecs that encoded the bytes), ``"pairs"`` (how many lines
  follow), ``"checksum"`` (``"sha256:"`` and 64 hex digits), ``"created"`` (ISO 8601, UTC),
  and the options the map was created with, ``"hash_tags"`` and ``"versions"`` (booleans,
  false when absent). Readers ignore fields they do not know.
- Then one line per pair: a JSON array of two strings, the key's bytes and the value's bytes
  in standard base64 (RFC 4648, with padding): ``["YWxpY2U=","eyJiYWxhbmNlIjoxMH0="]``. This
  module writes them in key-byte order, so equal maps give equal files; a reader takes any
  order. Every line ends with ``\\n``.
- The checksum is SHA-256 over the pairs in file order, each as the key's length (8 bytes,
  big-endian), the key, the value's length (8 bytes, big-endian) and the value. It covers the
  bytes, not the JSON text, so another tool may write the lines with other spacing.

A reader refuses a file whose first line is not such a header (:class:`NotABackupError`), and
one whose lines do not parse or whose count or checksum differ from the header's
(:class:`CorruptBackupError`), before anything is restored. Writing goes to a temporary file
beside ``file``, synced, then renamed over it: a failed backup leaves no file behind.

Why not msgpack: it is more compact (no base64), but needs a library and a program to look
inside; JSON lines with base64 cost a third more space and nothing else.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import datetime
import hashlib
import itertools
import json
import os
import secrets
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

from kafkakv.errors import (
    BackupError,
    BackupIOError,
    CorruptBackupError,
    CursorError,
    MapNotEmptyError,
    NotABackupError,
    UnknownMapError,
)
from kafkakv.map.feed import Cursor

if TYPE_CHECKING:
    from kafkakv.db import Database
    from kafkakv.map.replica import ReplicaMap

__all__ = [
    "FORMAT",
    "VERSION",
    "BackupHeader",
    "Progress",
    "RestoreReport",
    "backup",
    "checksum",
    "decode_pair",
    "encode_pair",
    "read_header",
    "read_pairs",
    "restore",
    "verify",
]

FORMAT = "kafkakv-map-backup"
"""The ``format`` field of every backup's header."""

VERSION = 1
"""The format version this module writes and reads."""

Progress = Callable[[str, int, int], None]
"""``progress(stage, done, total)``, called as work goes on: the stage (``"write"`` for a
backup; ``"verify"``, ``"restore"`` then ``"remove"`` for a restore) and how many pairs of
``total`` are done."""

_HEADER_LIMIT = 1 << 20  # a first line longer than this is no header
_CHUNK = 16_384  # pairs per file write, per put_all and per progress report
_LENGTH = 8  # bytes of each length in the checksum


@dataclass(frozen=True, slots=True)
class BackupHeader:
    """The first line of a backup: what it holds and where it was taken (module doc)."""

    map: str
    partitions: int
    cursor: Cursor
    key_codec: str
    value_codec: str
    pairs: int
    checksum: str
    created: str
    hash_tags: bool = False
    versions: bool = False
    expiry: bool = False

    def to_line(self) -> bytes:
        """The header as its JSON line.

        >>> h = BackupHeader("m", 1, Cursor({0: 7}), "str", "json", 0, checksum([]), "now")
        >>> BackupHeader.parse(h.to_line()) == h, h.to_line()[:52]
        (True, b'{"format":"kafkakv-map-backup","version":1,"map":"m"')
        """
        doc = {
            "format": FORMAT,
            "version": VERSION,
            "map": self.map,
            "partitions": self.partitions,
            "cursor": str(self.cursor),
            "key_codec": self.key_codec,
            "value_codec": self.value_codec,
            "pairs": self.pairs,
            "checksum": self.checksum,
            "created": self.created,
            "hash_tags": self.hash_tags,
            "versions": self.versions,
            "expiry": self.expiry,
        }
        return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"

    @classmethod
    def parse(cls, line: bytes) -> BackupHeader:
        """The header that ``line`` holds. Raises :class:`NotABackupError` for a line that is
        not a backup header or a version other than :data:`VERSION`, and
        :class:`CorruptBackupError` for a header with a missing or malformed field.

        >>> BackupHeader.parse(b'{"format": "kafkakv-map-backup", "version": 9}')
        Traceback (most recent call last):
        ...
        kafkakv.errors.NotABackupError: backup format version 9: this kafkakv reads version 1
        """
        try:
            doc = json.loads(line)
        except (ValueError, UnicodeDecodeError):
            if FORMAT.encode() in line:  # a header, damaged or cut short
                raise CorruptBackupError("damaged or truncated header", line=1) from None
            doc = None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise NotABackupError(f"not a kafkakv map backup (no {FORMAT!r} header line)")
        if doc.get("version") != VERSION:
            raise NotABackupError(
                f"backup format version {doc.get('version')!r}: this kafkakv reads version "
                f"{VERSION}"
            )
        fields: dict[str, type] = {
            "map": str,
            "partitions": int,
            "cursor": str,
            "key_codec": str,
            "value_codec": str,
            "pairs": int,
            "checksum": str,
            "created": str,
        }
        for name, kind in fields.items():
            value = doc.get(name)
            least = 1 if name == "partitions" else 0  # ints: at least this
            if type(value) is not kind or (isinstance(value, int) and value < least):
                raise CorruptBackupError(f"damaged header: field {name!r} is {value!r}", line=1)
        checksum = doc["checksum"]
        if not (checksum.startswith("sha256:") and _is_hex(checksum[7:], 64)):
            raise CorruptBackupError(f"damaged header: checksum {checksum!r}", line=1)
        for name in ("hash_tags", "versions", "expiry"):  # optional: False when absent
            if type(doc.get(name, False)) is not bool:
                raise CorruptBackupError(f"damaged header: field {name!r} is {doc[name]!r}", line=1)
        try:
            cursor = Cursor.parse(doc["cursor"])
        except CursorError as exc:
            raise CorruptBackupError(f"damaged header: {exc}", line=1) from None
        return cls(
            doc["map"],
            doc["partitions"],
            cursor,
            doc["key_codec"],
            doc["value_codec"],
            doc["pairs"],
            checksum,
            doc["created"],
            doc.get("hash_tags", False),
            doc.get("versions", False),
            doc.get("expiry", False),
        )


@dataclass(frozen=True, slots=True)
class RestoreReport:
    """What :func:`restore` did: the backup's header, the pairs it put, how many of those
    keys had a value before (``overwritten``) and how many keys ``replace`` removed."""

    header: BackupHeader
    put: int
    overwritten: int
    removed: int


# -- the pure parts: lines and checksums ------------------------------------------------------


def encode_pair(key: bytes, value: bytes) -> bytes:
    """The line of one pair.

    >>> encode_pair(b"alice", b'{"balance":10}')
    b'["YWxpY2U=","eyJiYWxhbmNlIjoxMH0="]\\n'
    """
    return b'["%s","%s"]\n' % (base64.b64encode(key), base64.b64encode(value))


def decode_pair(line: bytes, number: int) -> tuple[bytes, bytes]:
    """The (key, value) of pair line ``line``, the file's line ``number``. Raises
    :class:`CorruptBackupError` naming the line when it is not a pair line.

    >>> decode_pair(b'[ "YWxpY2U=", "" ]\\n', 2)
    (b'alice', b'')
    >>> decode_pair(b'["YWxpY2U="', 3)
    Traceback (most recent call last):
    ...
    kafkakv.errors.CorruptBackupError: line 3: truncated (no end of line)
    """
    if not line.endswith(b"\n"):
        raise CorruptBackupError(f"line {number}: truncated (no end of line)", line=number)
    try:
        doc = json.loads(line)
        if not (type(doc) is list and len(doc) == 2 and all(type(x) is str for x in doc)):
            raise ValueError("not a pair of base64 strings")
        return base64.b64decode(doc[0], validate=True), base64.b64decode(doc[1], validate=True)
    except (ValueError, UnicodeDecodeError, binascii.Error) as exc:
        raise CorruptBackupError(f"line {number}: damaged pair ({exc})", line=number) from None


class _Digest:
    """The running checksum of pairs (module doc)."""

    def __init__(self) -> None:
        self._sha = hashlib.sha256()

    def add(self, key: bytes, value: bytes) -> None:
        update = self._sha.update
        update(len(key).to_bytes(_LENGTH, "big"))
        update(key)
        update(len(value).to_bytes(_LENGTH, "big"))
        update(value)

    def text(self) -> str:
        return "sha256:" + self._sha.hexdigest()


def checksum(pairs: Iterable[tuple[bytes, bytes]]) -> str:
    """The checksum of ``pairs``, in their order, as the header writes it.

    >>> one = (1).to_bytes(8, "big")
    >>> checksum([(b"k", b"v")]) == "sha256:" + hashlib.sha256(one + b"k" + one + b"v").hexdigest()
    True
    """
    digest = _Digest()
    for key, value in pairs:
        digest.add(key, value)
    return digest.text()


def _is_hex(text: str, length: int) -> bool:
    return len(text) == length and all(c in "0123456789abcdef" for c in text)


# -- backing up -------------------------------------------------------------------------------


def backup(
    m: ReplicaMap[Any, Any], file: str | os.PathLike[str], *, progress: Progress | None = None
) -> BackupHeader:
    """Write a backup of map ``m`` to ``file`` (replaced if it exists) and return its header.

    The pairs are copied with applying paused (O(n) references; updates wait meanwhile), then
    sorted, checksummed and written with applying running: the backup is the state at the
    header's cursor, so ``m.changes(since=header.cursor)`` tells what changed after it (while
    no flush has covered it). Call ``m.sync()`` first to include every update completed
    anywhere before. Costs one pass over the pairs in memory, and a file write streamed in
    chunks; the file is written to a temporary file and renamed. The codec names in the header
    are ``m``'s.

    Raises :class:`~kafkakv.errors.BackupError` for a sharded replica (it holds only part of
    the map), :class:`~kafkakv.errors.BackupIOError` when the file cannot be written (nothing
    is left behind), ClosedError and PartitionStalledError as reads do.
    """
    if len(m.partitions) != m.partition_count:
        raise BackupError(
            f"map {m.name!r}: this replica holds partitions {list(m.partitions)} of "
            f"{m.partition_count}; back up from a replica that holds them all"
        )
    items, cursor = m.encoded_snapshot()
    pairs = sorted(items.items())  # a list of the same bytes objects, in key order
    del items
    key_codec, value_codec = m.codec_names
    header = BackupHeader(
        m.name,
        m.partition_count,
        cursor,
        key_codec,
        value_codec,
        len(pairs),
        checksum(pairs),
        datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        **m.creation_options,
    )
    _write(file, header, pairs, progress)
    return header


def _write(
    file: str | os.PathLike[str],
    header: BackupHeader,
    pairs: list[tuple[bytes, bytes]],
    progress: Progress | None,
) -> None:
    """Write ``header`` and ``pairs`` to a temporary file beside ``file``, sync it and rename
    it over ``file``; on any failure remove the temporary file."""
    path = os.fspath(file)
    directory = os.path.dirname(os.path.abspath(path))
    temporary = os.path.join(
        directory, f".{os.path.basename(path)}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    )
    try:  # as open() would create it (mode 0o666 less the umask), unlike mkstemp's 0o600
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as exc:
        raise BackupIOError(f"cannot write backup {path}: {exc.strerror or exc}") from exc
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(header.to_line())
            done = 0
            for start in range(0, len(pairs), _CHUNK):
                chunk = pairs[start : start + _CHUNK]
                out.write(b"".join([encode_pair(k, v) for k, v in chunk]))
                done += len(chunk)
                if progress is not None:
                    progress("write", done, len(pairs))
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        if isinstance(exc, OSError):
            raise BackupIOError(f"cannot write backup {path}: {exc.strerror or exc}") from exc
        raise
    _sync_directory(directory)


def _sync_directory(directory: str) -> None:
    """Make the rename durable (where directories can be opened: not on Windows)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# -- reading ----------------------------------------------------------------------------------


@contextlib.contextmanager
def _opened(file: str | os.PathLike[str]) -> Iterator[tuple[IO[bytes], BackupHeader]]:
    """``file`` open for reading, past its header, and the header."""
    path = os.fspath(file)
    try:
        handle = open(path, "rb")  # noqa: SIM115 (closed below, after the caller's work)
    except OSError as exc:
        raise BackupIOError(f"cannot read backup {path}: {exc.strerror or exc}") from exc
    with handle:
        try:
            first = handle.readline(_HEADER_LIMIT)
        except OSError as exc:
            raise BackupIOError(f"cannot read backup {path}: {exc.strerror or exc}") from exc
        if not first:
            raise NotABackupError(f"{path} is empty: not a kafkakv map backup")
        try:
            if not first.endswith(b"\n"):  # a header cut short, or a line longer than any
                if FORMAT.encode() in first:
                    raise CorruptBackupError("truncated in its header", line=1)
                raise NotABackupError(f"not a kafkakv map backup (no {FORMAT!r} header line)")
            header = BackupHeader.parse(first)
        except (NotABackupError, CorruptBackupError) as exc:
            raise type(exc)(f"{path}: {exc}", **_line_of(exc)) from None
        yield handle, header


def _line_of(exc: BaseException) -> dict[str, Any]:
    return {"line": exc.line} if isinstance(exc, CorruptBackupError) else {}


def read_header(file: str | os.PathLike[str]) -> BackupHeader:
    """The header of backup ``file``: reads its first line only, so the rest is not checked
    (:func:`verify` checks it all). Raises BackupIOError, NotABackupError and
    CorruptBackupError (a damaged header)."""
    with _opened(file) as (_, header):
        return header


def read_pairs(
    file: str | os.PathLike[str], *, progress: Progress | None = None, stage: str = "verify"
) -> Iterator[tuple[bytes, bytes]]:
    """The (key, value) pairs of backup ``file``, in file order, read as a stream (memory:
    one line). The checks come as the pairs do: a damaged line raises
    :class:`~kafkakv.errors.CorruptBackupError` when reached, and a count or checksum unlike
    the header's at the end, after every pair was yielded; call :func:`verify` first to
    refuse a damaged file before using any of it. Raises BackupIOError and NotABackupError
    on the first step. ``progress`` is called with ``stage``."""
    with _opened(file) as (handle, header):
        path, digest, count = os.fspath(file), _Digest(), 0
        try:
            for number, line in enumerate(handle, start=2):
                if count == header.pairs:
                    raise CorruptBackupError(
                        f"{path}: line {number}: more pairs than the {header.pairs:,} of its "
                        "header",
                        line=number,
                    )
                try:
                    key, value = decode_pair(line, number)
                except CorruptBackupError as exc:
                    raise CorruptBackupError(f"{path}: {exc}", line=number) from None
                digest.add(key, value)
                count += 1
                if progress is not None and count % _CHUNK == 0:
                    progress(stage, count, header.pairs)
                yield key, value
        except OSError as exc:
            raise BackupIOError(f"cannot read backup {path}: {exc.strerror or exc}") from exc
        if count != header.pairs:
            raise CorruptBackupError(
                f"{path}: truncated: {count:,} pairs of the {header.pairs:,} in its header",
                line=count + 2,
            )
        if digest.text() != header.checksum:
            raise CorruptBackupError(
                f"{path}: damaged: the pairs' checksum is {digest.text()}, its header says "
                f"{header.checksum}"
            )
        if progress is not None:
            progress(stage, count, header.pairs)


def verify(file: str | os.PathLike[str], *, progress: Progress | None = None) -> BackupHeader:
    """Read all of backup ``file`` and return its header when every line parses and the
    pairs' count and checksum match it. One streamed pass, O(n), memory O(1). Raises
    :class:`~kafkakv.errors.BackupIOError`, :class:`~kafkakv.errors.NotABackupError` or
    :class:`~kafkakv.errors.CorruptBackupError`."""
    for _ in read_pairs(file, progress=progress):
        pass
    return read_header(file)


# -- restoring --------------------------------------------------------------------------------


def restore(
    db: Database,
    name: str,
    file: str | os.PathLike[str],
    *,
    replace: bool = False,
    partitions: int | None = None,
    hash_tags: bool | None = None,
    versions: bool | None = None,
    expiry: bool | None = None,
    topics: str | None = None,
    timeout: float = 30.0,
    progress: Progress | None = None,
) -> RestoreReport:
    """Put the pairs of backup ``file`` into map ``name`` of ``db``, byte for byte.

    First the whole file is checked (:func:`verify`): a missing, foreign or damaged file
    raises before anything is written. Then the map is opened with the ``bytes`` codecs (a
    replica of its own, closed at the end) and created when missing, with ``partitions``
    (default: the backup's; an existing map must have as many, when given). An existing map
    may have another partition count than the backup's: each key goes to the partition its
    bytes choose in the target, as any put. ``hash_tags``, ``versions`` and ``expiry``
    (default: the backup's) are passed to :meth:`Database.map` likewise: a new map is created with them, an
    existing one must have been created with them (else TopicMismatchError). Versions are
    not in a backup: each restored key's version is the offset of its restoring record. Nor
    are deadlines: restored keys do not expire.
    ``topics``: the map shares those topics with others (see :meth:`Database.map`).

    Without ``replace``, a map that holds keys raises :class:`~kafkakv.errors.MapNotEmptyError`
    and nothing is written. With it, the backup's pairs are put, then every other key is
    removed, so the map ends holding exactly the backup's contents (if nothing else writes
    meanwhile). Writes go through ``put_all`` and ``remove_all`` in chunks of 16,384 pairs:
    the restore as a whole is not atomic, and an error midway (OperationTimeoutError after
    ``timeout``, a log error) leaves the chunks before it written; running it again with
    ``replace`` finishes it (so does a file changed between the check and the writing,
    which raises CorruptBackupError midway). Costs two streamed reads of the file; memory holds the target's
    replica, and with ``replace`` the set of the backup's keys.

    The target's replicas must use the codecs named in the header (``report.header``) to read
    what was restored. The header's cursor is a position in the source map's log; the target
    starts from its own.
    """
    header = verify(file, progress=progress)
    options: dict[str, Any] = {
        "key_codec": "bytes",
        "value_codec": "bytes",
        "timeout": timeout,
        "hash_tags": header.hash_tags if hash_tags is None else hash_tags,
        "versions": header.versions if versions is None else versions,
        "expiry": header.expiry if expiry is None else expiry,
    }
    if topics is not None:
        options["topics"] = topics
    try:
        m = db.map(name, partitions=partitions, create=False, **options)
    except UnknownMapError:
        m = db.map(name, partitions=partitions or header.partitions, **options)
    with m:
        m.sync()
        present = len(m)
        if present and not replace:
            raise MapNotEmptyError(
                f"map {name!r} holds {present:,} keys: restore into an empty map, or replace "
                "its contents (replace=True, --replace)",
                count=present,
            )
        kept: set[bytes] = set()
        put = overwritten = 0
        pairs = iter(read_pairs(file))
        while chunk := list(itertools.islice(pairs, _CHUNK)):
            overwritten += m.put_all(chunk)
            put += len(chunk)
            if present:
                kept.update(k for k, _ in chunk)
            if progress is not None:
                progress("restore", put, header.pairs)
        removed = 0
        if present:
            extra = [k for k in m if k not in kept]
            for start in range(0, len(extra), _CHUNK):
                removed += m.remove_all(extra[start : start + _CHUNK])
                if progress is not None:
                    progress("remove", start + len(extra[start : start + _CHUNK]), len(extra))
    return RestoreReport(header, put, overwritten, removed)
