"""Keys and values between their JSON form and the objects of a map's codecs: pure functions.

A key arrives as text (a path segment, or a string in a JSON body) and leaves as text; a value
arrives and leaves as a JSON value. The table is in docs/serve.md, "Keys and values". Every
refusal is a :class:`~kafkakv.serve.errors.ApiError` with status 400, naming what was wrong.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import orjson

from kafkakv.serve.errors import ApiError

__all__ = ["KeyForm", "ValueForm", "dumps"]


def _default(obj: Any) -> Any:
    """What orjson cannot write itself: bytes (inside a msgpack value) as base64."""
    if isinstance(obj, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(obj)).decode("ascii")
    raise TypeError(f"{type(obj).__name__} has no JSON form")


def dumps(doc: Any) -> bytes:
    """``doc`` as compact JSON bytes; bytes become base64 strings, mapping keys need not be
    strings (msgpack allows integer keys).

    >>> dumps({"a": b"hi", 1: [True]})
    b'{"a":"aGk=","1":[true]}'
    """
    return orjson.dumps(doc, default=_default, option=orjson.OPT_NON_STR_KEYS)


class KeyForm:
    """Keys of one codec as text.

    >>> KeyForm("int").parse("42"), KeyForm("json").parse('{"a":1}'), KeyForm("str").parse("x")
    (42, {'a': 1}, 'x')
    >>> KeyForm("int").text(42), KeyForm("json").text([1, "a"]), KeyForm("bytes").text(b"k")
    ('42', '[1,"a"]', 'k')
    """

    __slots__ = ("codec", "ordered_text")

    def __init__(self, codec: str) -> None:
        self.codec = codec
        self.ordered_text = codec in ("str", "bytes")
        """Whether a text prefix of keys is a prefix of their encoded bytes."""

    def parse(self, text: str) -> Any:
        """The key that ``text`` stands for; 400 ``invalid_key`` when it does not parse."""
        codec = self.codec
        if codec == "str":
            return text
        if codec == "bytes":
            return text.encode("utf-8", errors="surrogateescape")
        if codec == "int":
            try:
                if text.strip() != text:
                    raise ValueError(text)
                return int(text)
            except ValueError:
                raise ApiError(400, "invalid_key", f"key {text!r} is not an integer") from None
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            raise ApiError(400, "invalid_key", f"key {text!r} is not JSON text") from None

    def parse_json(self, obj: object) -> Any:
        """A key given inside a JSON body: a string, read as :meth:`parse` reads text (an
        integer is accepted for the ``int`` codec too)."""
        if self.codec == "int" and isinstance(obj, int) and not isinstance(obj, bool):
            return obj
        if not isinstance(obj, str):
            raise ApiError(400, "invalid_key", f"a key is a JSON string, not {dumps(obj)!r}")
        return self.parse(obj)

    def text(self, key: Any) -> str:
        """The text form of ``key``, as :meth:`parse` reads it back."""
        codec = self.codec
        if codec == "str":
            return str(key)
        if codec == "bytes":
            return bytes(key).decode("utf-8", errors="backslashreplace")
        if codec == "int":
            return str(key)
        return dumps(key).decode("utf-8")


class ValueForm:
    """Values of one codec as JSON values.

    >>> ValueForm("bytes").parse("aGk="), ValueForm("bytes").json(b"hi")
    (b'hi', 'aGk=')
    >>> ValueForm("json").parse({"a": [1]})
    {'a': [1]}
    """

    __slots__ = ("codec",)

    def __init__(self, codec: str) -> None:
        self.codec = codec

    def parse(self, obj: Any, what: str = "value") -> Any:
        """The value that JSON value ``obj`` stands for; 400 ``invalid_value`` otherwise
        (``null`` included: it is never a value)."""
        if obj is None:
            raise ApiError(400, "invalid_value", f"null is not a {what}: DELETE removes a key")
        codec = self.codec
        if codec in ("json", "msgpack"):
            return obj
        if codec == "str":
            if isinstance(obj, str):
                return obj
            raise ApiError(400, "invalid_value", f"the {what} must be a JSON string (str codec)")
        if codec == "int":
            if isinstance(obj, int) and not isinstance(obj, bool):
                return obj
            raise ApiError(400, "invalid_value", f"the {what} must be a JSON integer (int codec)")
        if isinstance(obj, str):
            try:
                return base64.b64decode(obj, validate=True)
            except (binascii.Error, ValueError):
                pass
        raise ApiError(400, "invalid_value", f"the {what} must be a base64 string (bytes codec)")

    def parse_optional(self, obj: Any, what: str) -> Any:
        """As :meth:`parse`, with ``null`` standing for "absent" (None)."""
        return None if obj is None else self.parse(obj, what)

    def json(self, value: Any) -> Any:
        """The JSON form of ``value`` (None stays None: "absent")."""
        if self.codec == "bytes" and value is not None:
            return base64.b64encode(value).decode("ascii")
        return value
