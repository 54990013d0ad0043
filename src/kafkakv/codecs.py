"""Codecs turn keys and values into the bytes that travel through the log.

Pure, no I/O. Every codec encodes equal objects to equal bytes (keys are compared and
partitioned by their bytes), refuses what it cannot encode with
:class:`~kafkakv.errors.EncodeError` (a ``TypeError``) before anything is appended, and reports
bytes it cannot read with :class:`~kafkakv.errors.DecodeError` (a ``ValueError``).

============  =============================================  =======================================
name          objects                                        byte order = object order
============  =============================================  =======================================
``str``       ``str`` as UTF-8                               yes (code point order)
``bytes``     ``bytes``, ``bytearray``, ``memoryview``       yes
``int``       ints in the signed 64-bit range                yes (8 bytes, sign bit flipped)
``json``      JSON values; dicts written with sorted keys    no
``msgpack``   msgpack values (dict order is kept as given)   no
============  =============================================  =======================================

Pickle is not in this table on purpose: unpickling runs code chosen by whoever wrote the bytes.
:class:`PickleCodec` exists for logs whose every writer you trust, and must be asked for by
constructing it with ``trusted=True``.

>>> codec = codec_for("int")
>>> codec.decode(codec.encode(-5)), codec.encode(-1) < codec.encode(0) < codec.encode(1)
(-5, True)
>>> codec_for("json").encode({"b": 1, "a": [1, 2]})
b'{"a":[1,2],"b":1}'
"""

from __future__ import annotations

import json
import math
import pickle
import struct
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Generic, Literal, TypeVar, overload

import msgpack
import msgspec
import orjson

from kafkakv.errors import ConfigError, DecodeError, EncodeError

__all__ = [
    "BytesCodec",
    "Codec",
    "IntCodec",
    "JsonCodec",
    "MsgpackCodec",
    "PickleCodec",
    "StrCodec",
    "codec_for",
]

T = TypeVar("T")


class Codec(ABC, Generic[T]):
    """Turns objects of one kind into bytes and back."""

    #: Short name, as accepted by :func:`codec_for`.
    name: str = ""
    #: True when comparing encoded bytes orders like comparing the objects (sorted maps need it).
    ordered: bool = False
    #: True when every bytes decode (:meth:`check` never raises): replicas skip the check.
    reads_any_bytes: bool = False
    #: True when :meth:`decode` gives back the stored bytes as they are: reads skip it.
    decodes_as_is: bool = False
    #: A C-level function that encodes what this codec is usually given exactly as
    #: :meth:`encode` does, and raises anything at all for other objects, which then take
    #: :meth:`encode` for its typed error; None when there is none. Hot paths call it.
    fast_encode: Callable[[Any], bytes] | None = None

    @abstractmethod
    def encode(self, obj: T) -> bytes:
        """The bytes of ``obj``; raises :class:`~kafkakv.errors.EncodeError` when impossible."""

    @abstractmethod
    def decode(self, data: bytes) -> T:
        """The object of ``data``; raises :class:`~kafkakv.errors.DecodeError` on bad bytes."""

    def encode_many(self, objs: Sequence[T]) -> list[bytes]:
        """:meth:`encode` of each of ``objs``; one C-level pass when :attr:`fast_encode`
        takes them all."""
        fast = self.fast_encode
        if fast is not None:
            try:
                return list(map(fast, objs))
            except Exception:  # encode() says what was wrong, below
                pass
        return [self.encode(obj) for obj in objs]

    def check(self, data: bytes) -> None:
        """Raise :class:`~kafkakv.errors.DecodeError` unless :meth:`decode` would read
        ``data``. A replica stores only bytes that pass, so that a record another program
        wrote can never break reads. Codecs override it with a check cheaper than decoding."""
        self.decode(data)

    def undecodable(self, items: Sequence[bytes]) -> list[int]:
        """The indexes of ``items`` that fail :meth:`check`, in order (usually none). Codecs
        override it with a check of the whole batch at C speed, and look at items one by one
        only when that fails."""
        bad = []
        for i, data in enumerate(items):
            try:
                self.check(data)
            except DecodeError:
                bad.append(i)
        return bad

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


# Many UTF-8 items checked with one decode: they are joined with an ASCII byte between each
# two. A UTF-8 decoder meets an ASCII byte only between characters, so when the join decodes,
# every item starts and ends on a character boundary and decodes alone. Joined with nothing,
# the end of one item and the start of the next could make one character (b"k\xc3" then
# b"\xa9k" read "kék"), and two items that do not decode would pass.


def _check_all_utf8(items: Sequence[bytes]) -> None:
    """Raise UnicodeDecodeError unless every item is UTF-8 (TypeError for one not bytes).
    ASCII items (most keys and JSON) are told by a scan of each, 3x faster than a decode,
    which would also build a string; otherwise one decode of them all, joined as above."""
    if not all(map(bytes.isascii, items)):
        b"\n".join(items).decode("utf-8")


class StrCodec(Codec[str]):
    name = "str"
    ordered = True
    # UTF-8, strict: a TypeError for a non-str, a UnicodeEncodeError for lone surrogates.
    fast_encode = staticmethod(str.encode)

    def encode(self, obj: str) -> bytes:
        if not isinstance(obj, str):
            raise EncodeError(f"the str codec takes str, not {type(obj).__name__}")
        try:
            return obj.encode("utf-8")
        except UnicodeEncodeError as exc:  # lone surrogates
            raise EncodeError(f"string cannot be written as UTF-8: {exc}") from exc

    def decode(self, data: bytes) -> str:
        try:
            return bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DecodeError(f"not UTF-8: {exc}") from exc

    def check(self, data: bytes) -> None:
        try:  # record keys are bytes: decoded in place, no copy first
            data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DecodeError(f"not UTF-8: {exc}") from exc

    def undecodable(self, items: Sequence[bytes]) -> list[int]:
        try:
            _check_all_utf8(items)
        except (UnicodeDecodeError, TypeError):
            return super().undecodable(items)
        return []


class BytesCodec(Codec[bytes]):
    name = "bytes"
    ordered = True
    reads_any_bytes = True
    decodes_as_is = True

    def encode_many(self, objs: Sequence[bytes]) -> list[bytes]:
        if _BYTES.issuperset(map(type, objs)):  # one C-level pass over the types
            return list(objs)
        return [self.encode(obj) for obj in objs]

    def encode(self, obj: bytes) -> bytes:
        if isinstance(obj, bytes):
            return obj
        if isinstance(obj, bytearray | memoryview):
            return bytes(obj)
        raise EncodeError(f"the bytes codec takes bytes, not {type(obj).__name__}")

    # bytes(data) itself, a C call (the same object for bytes, a copy of a memoryview): it
    # runs for every value a listener or a result gets.
    decode = staticmethod(bytes)  # type: ignore[assignment]  # takes any buffer: wider

    def check(self, data: bytes) -> None:
        pass

    def undecodable(self, items: Sequence[bytes]) -> list[int]:
        return []


_BYTES = frozenset({bytes})
_INT = struct.Struct(">Q")
_SIGN = 1 << 63


class IntCodec(Codec[int]):
    """Signed 64-bit integers as 8 big-endian bytes with the sign bit flipped, so that byte
    order is numeric order."""

    name = "int"
    ordered = True

    def encode(self, obj: int) -> bytes:
        if not isinstance(obj, int) or isinstance(obj, bool):
            raise EncodeError(f"the int codec takes int, not {type(obj).__name__}")
        if not -_SIGN <= obj < _SIGN:
            raise EncodeError(f"{obj} is outside the signed 64-bit range of the int codec")
        return _INT.pack(obj + _SIGN)

    def decode(self, data: bytes) -> int:
        if len(data) != 8:
            raise DecodeError(f"the int codec reads 8 bytes, got {len(data)}")
        value: int = _INT.unpack(data)[0]
        return value - _SIGN

    def check(self, data: bytes) -> None:
        if len(data) != 8:
            raise DecodeError(f"the int codec reads 8 bytes, got {len(data)}")


class JsonCodec(Codec[Any]):
    """JSON through orjson, dict keys sorted so that equal dicts give equal bytes. Tuples come
    back as lists. NaN and infinity, at any depth, are refused (JSON has neither; orjson would
    write them as null). A number too large for a float reads as infinity, as Python's own
    ``json`` module reads it."""

    name = "json"

    def encode(self, obj: Any) -> bytes:
        try:
            data = orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)
        except TypeError as exc:  # orjson.JSONEncodeError is a TypeError
            raise EncodeError(f"cannot write as JSON: {exc}") from exc
        # orjson writes a NaN or an infinity as null: look closer only when a null is there.
        if b"null" in data and _has_non_finite(obj):
            raise EncodeError("JSON has no NaN or infinity")
        return data

    def decode(self, data: bytes) -> Any:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            try:  # orjson refuses numbers beyond a float's range, which check() lets pass
                return json.loads(bytes(data).decode("utf-8"))
            except ValueError:
                raise DecodeError(f"not JSON: {exc}") from exc

    def check(self, data: bytes) -> None:
        try:  # validates the syntax without building objects; the strings' UTF-8 apart
            _json_syntax(data)
            bytes(data).decode("utf-8")
        except (msgspec.DecodeError, UnicodeDecodeError) as exc:
            raise DecodeError(f"not JSON: {exc}") from exc

    def undecodable(self, items: Sequence[bytes]) -> list[int]:
        # Each item parsed alone as raw JSON (its syntax; no object built, and trailing bytes
        # refused), then UTF-8 for them all at once; only when one fails are they looked at
        # one by one. (Parsing them joined as one array took 1.7x as long: the join and a
        # Raw object per item.)
        try:
            deque(map(_json_syntax, items), maxlen=0)
            _check_all_utf8(items)
        except (msgspec.DecodeError, UnicodeDecodeError, TypeError):
            return super().undecodable(items)
        return []


_json_syntax = msgspec.json.Decoder(msgspec.Raw).decode


def _has_non_finite(obj: Any) -> bool:
    if isinstance(obj, float):
        return not math.isfinite(obj)
    if isinstance(obj, dict):
        return any(_has_non_finite(v) for v in obj.values())
    if isinstance(obj, list | tuple):
        return any(_has_non_finite(v) for v in obj)
    return False


class MsgpackCodec(Codec[Any]):
    """msgpack: compact and fast; bytes stay bytes. Dicts keep the order they were built in, so
    prefer another codec for keys that are dicts."""

    name = "msgpack"

    def encode(self, obj: Any) -> bytes:
        try:
            return msgpack.packb(obj, use_bin_type=True)
        except (TypeError, ValueError, OverflowError) as exc:
            raise EncodeError(f"cannot write as msgpack: {exc}") from exc

    def decode(self, data: bytes) -> Any:
        try:
            return msgpack.unpackb(data, raw=False, strict_map_key=False)
        except Exception as exc:  # msgpack raises several unrelated types for bad input
            raise DecodeError(f"not msgpack: {exc}") from exc

    # check() decodes: msgpack validates at about the speed it decodes.


class PickleCodec(Codec[Any]):
    """Any picklable object. Decoding runs code named by the bytes, so this codec exists only for
    logs that nobody untrusted can write to; construct it with ``trusted=True`` to say so."""

    name = "pickle"

    def __init__(self, *, trusted: bool = False) -> None:
        if trusted is not True:
            raise ConfigError(
                "PickleCodec executes code from the log when decoding; pass trusted=True if "
                "every writer of these topics is trusted, or use the json or msgpack codec"
            )

    def encode(self, obj: Any) -> bytes:
        try:
            return pickle.dumps(obj, protocol=5)
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            raise EncodeError(f"cannot pickle: {exc}") from exc

    def decode(self, data: bytes) -> Any:
        try:
            return pickle.loads(data)
        except Exception as exc:
            raise DecodeError(f"cannot unpickle: {exc}") from exc

    def check(self, data: bytes) -> None:
        """Nothing: telling whether bytes unpickle means running them. Replicas store what
        they are given; a bad record breaks reads of its key only when they decode it."""


_BY_NAME: dict[str, type[Codec[Any]]] = {
    c.name: c for c in (StrCodec, BytesCodec, IntCodec, JsonCodec, MsgpackCodec)
}


@overload
def codec_for(spec: Literal["str"]) -> StrCodec: ...
@overload
def codec_for(spec: Literal["bytes"]) -> BytesCodec: ...
@overload
def codec_for(spec: Literal["int"]) -> IntCodec: ...
@overload
def codec_for(spec: Codec[T]) -> Codec[T]: ...
@overload
def codec_for(spec: str | Codec[Any]) -> Codec[Any]: ...
def codec_for(spec: str | Codec[Any]) -> Codec[Any]:
    """A codec from its name (``str``, ``bytes``, ``int``, ``json``, ``msgpack``) or as given.

    Typed: ``codec_for("int")`` is a ``Codec[int]``, a ``Codec[T]`` stays one, and the codecs
    of any value (``json``, ``msgpack``, a name known only at run time) are ``Codec[Any]``.

    Raises :class:`~kafkakv.errors.ConfigError` for another name (``pickle`` included: build a
    :class:`PickleCodec` yourself).
    """
    if isinstance(spec, Codec):
        return spec
    if isinstance(spec, str) and spec in _BY_NAME:
        return _BY_NAME[spec]()
    if spec == "pickle":
        raise ConfigError("pickle is opt-in only: pass PickleCodec(trusted=True) as the codec")
    raise ConfigError(f"unknown codec {spec!r}; choose one of {', '.join(sorted(_BY_NAME))}")
