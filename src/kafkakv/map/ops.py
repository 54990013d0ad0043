"""The ops protocol, without I/O: what an ops record holds, and how a replica decides it.

An ops record is one update attempt. Its key is the map's record key (the map prefix, if any,
then the encoded key); its value is a msgpack array ``[code, origin, seq, *args]`` where
``origin`` identifies the replica that appended it and ``seq`` that replica's request, so the
writer recognises its own record when it applies it, and every replica a record written twice
(:mod:`kafkakv.map.dedup`). Control records (barriers, flush marks)
have no key.

A ``WRITE_MANY`` record carries a batch of one map in one partition: its args are two arrays of
the same length, store keys (the map prefix left out) and values, where nil removes the key. Its
record key is the record key of its first pair, which names the map and the partition. Every
replica applies the whole batch at that one offset, pair by pair in order. Its result is the
value each pair found (nil: absent), in order: ``put_all`` counts them, and the ``put_async``
calls the sender gathered into the record take one each.

A ``TRANSACT`` record is a transaction over keys of one map in one partition: its args are the
expected store keys and values (nil: absent), the store keys and versions expected of a map
with versions (nil: absent), then store keys and values to write (nil: remove). Every replica
compares the expectations with its state at that offset (:func:`expectations_hold`) and
applies all the writes, in order, or none of them. ``SET_IF_VERSION`` sets a key of a map with
versions when its version is the expected one.

A map with expiry keeps, for each key put with a time to live, its deadline (milliseconds since
the epoch). A ``PUT_FOR`` carries the time to live, not a deadline: every replica computes the
deadline as the record's timestamp plus the ttl, so the deadline is on the log's clock (the
leader broker's, on an ops topic with ``LogAppendTime``), whatever the writer's clock says.
The older ``PUT_TTL`` and ``WRITE_MANY_TTL`` carry a deadline the writer computed with its own
clock; they still apply as they always did. A key is expired for an op when its deadline is at
or before the op record's timestamp, which every replica reads alike: the op decides as if the
key were absent. ``EXPIRE`` removes it, once its deadline is at or before that record's own
timestamp and still the key's; an ``EXPIRE`` stamped earlier changes nothing.

>>> put_deadline(OpCode.PUT_FOR, (b"v", 30_000), 1_000_000)
1030000
>>> put_deadline(OpCode.PUT_TTL, (b"v", 5_000), 1_000_000)
5000

A ``COMPUTE`` or ``MERGE`` record may carry a third arg, the room: the most bytes that the key
(store key) and the value the function returns may take together, which the writer derives
from what a record of the map's topics holds. A result over it fails the op on every replica
alike (:class:`~kafkakv.errors.ResultTooLargeError`), where otherwise it would be applied and
then never fit a data record. Records without it (older writers) are decided unbounded.

A map with versions gives each key the version of its last change: the offset of the ops
record that changed it (values written again unchanged keep it). Compared by version, an
update cannot be fooled by a value that changed and changed back.

:func:`decide` is the state machine: given an op and the key's current value it returns the
result for the caller and the new value. It is a pure function of its inputs, so every replica,
applying the same records in the same order, decides the same; a failure (a function that
raises, bytes that do not decode) is an :class:`~kafkakv.errors.OperationFailedError` raised the
same way everywhere, and the caller leaves the state unchanged.

>>> from kafkakv.codecs import codec_for
>>> json = codec_for("json")
>>> decide(OpCode.COMPARE_AND_SET, (b"1", b"2"), b"1", b"k", json, json)
(True, b'2')
>>> decide(OpCode.PUT_IF_ABSENT, (b'"x"',), b'"y"', b"k", json, json)
(b'"y"', <Keep.KEEP: 0>)
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import msgpack
import msgspec

from kafkakv import functions
from kafkakv.codecs import Codec
from kafkakv.errors import (
    DecodeError,
    FunctionError,
    KafkaKVError,
    OperationFailedError,
    RecordTooLargeError,
    ResultTooLargeError,
)
from kafkakv.log.base import new_tuple

__all__ = [
    "BARRIER_VALUE",
    "KEEP",
    "PAIR_SLACK",
    "TTL_MAX_MS",
    "Keep",
    "Op",
    "OpCode",
    "Transaction",
    "decide",
    "decode_op",
    "encode_fields",
    "encode_op",
    "expectations_hold",
    "pair_fits",
    "put_deadline",
    "sent_op",
    "transaction_args",
    "write_many_args",
    "write_many_chunks",
]


class OpCode(enum.IntEnum):
    """What an ops record asks for. Values are part of the on-log format: never renumber."""

    PUT = 1
    PUT_IF_ABSENT = 2
    REPLACE = 3
    COMPARE_AND_SET = 4
    REMOVE = 5
    REMOVE_IF = 6
    COMPUTE = 7  # args (function name, msgpack of its extra args[, room])
    MERGE = 8  # args (function name, value[, room])
    WRITE_MANY = 9  # args (store keys, values): a batch of puts and removes, one offset
    TRANSACT = 10  # args (expected keys, values, versioned keys, versions, keys, values)
    SET_IF_VERSION = 11  # args (expected version or nil, new value)
    PUT_TTL = 12  # args (value, deadline): a put that expires at deadline (ms since epoch)
    WRITE_MANY_TTL = 13  # args (store keys, values, deadline): WRITE_MANY whose puts expire
    EXPIRE = 14  # args (deadline,): remove the key if it still expires at deadline
    # args (value, ttl) or (store keys, values, ttl): a put, or a WRITE_MANY whose puts, that
    # expire ttl ms after the record's timestamp (deadline = timestamp + ttl on every replica)
    PUT_FOR = 15
    BARRIER = 16  # no key, no args: "how far does the log reach now"
    FLUSHED = 17  # no key, args (covered ops offset[, update ids]): a flush covering it landed

    @property
    def control(self) -> bool:
        return self >= OpCode.BARRIER


class Keep(enum.Enum):
    """The state is left as it is (distinct from ``None``, which removes the key)."""

    KEEP = 0


KEEP = Keep.KEEP


class Op(NamedTuple):
    code: OpCode
    origin: bytes
    seq: int
    args: tuple[Any, ...]


_encode = msgspec.msgpack.Encoder().encode  # the bytes msgpack's Packer writes, 3x faster


def encode_op(code: OpCode, origin: bytes, seq: int, args: Sequence[Any] = ()) -> bytes:
    """The value bytes of an ops record: the msgpack array ``[code, origin, seq, *args]``."""
    return _encode((code, origin, seq, *args))  # an IntEnum packs as its int


encode_fields: Callable[[tuple[Any, ...]], bytes] = _encode
"""``encode_fields((code, origin, seq, *args))`` is :func:`encode_op` of those, with no call
in between: for a loop that encodes an op per row (the Spark data source's writes)."""

BARRIER_VALUE = encode_op(OpCode.BARRIER, b"", 0)
"""The value of a barrier record (no key): appended to learn how far the log reaches."""


def decode_op(data: bytes | None) -> Op:
    """Parse an ops record value; raises :class:`~kafkakv.errors.DecodeError` for anything that
    is not a well-formed op (a record another program wrote, a newer format)."""
    if data is None:
        raise DecodeError("an ops record without a value")
    try:
        items = msgpack.unpackb(data, raw=False, use_list=False)
        opcode = _CODES[items[0]]
        origin, seq, args = items[1], items[2], items[3:]
    except Exception as exc:  # not msgpack, not an array, too short, unknown code...
        raise DecodeError(f"not an ops record ([code, origin, seq, ...]): {exc!r}") from None
    if type(origin) is not bytes or type(seq) is not int:
        raise DecodeError("an ops record with a malformed origin or sequence number")
    if len(args) not in _ARITY[opcode]:
        takes = " or ".join(map(str, sorted(_ARITY[opcode])))
        raise DecodeError(f"{opcode.name} takes {takes} arguments, not {len(args)}")
    return new_tuple(Op, (opcode, origin, seq, args))


def sent_op(code: OpCode, origin: bytes, seq: int, args: Sequence[Any]) -> Op | None:
    """What :func:`decode_op` returns for ``encode_op(code, origin, seq, args)``, without the
    round trip, when that is sure to be these very values; None when only decoding can say
    (an argument of another type, such as a ``bytearray`` that decodes as ``bytes``, an array
    holding one or another array; an arity that decoding refuses). An array (list or tuple)
    of verbatim items decodes as a tuple of the same items: a ``WRITE_MANY``'s keys and values.

    The writer applies its own record with it (:meth:`ReplicaEngine.apply_until`): every other
    replica decodes the bytes, so the op it decides must be exactly the decoded one.
    """
    if type(code) is not OpCode or type(origin) is not bytes or type(seq) is not int:
        return None
    if len(args) not in _ARITY[code]:
        return None
    arrays = False
    for arg in args:
        if type(arg) not in _VERBATIM:
            if type(arg) not in _ARRAYS or not _VERBATIM.issuperset(map(type, arg)):
                return None
            arrays = True
    if arrays:
        args = [tuple(arg) if type(arg) in _ARRAYS else arg for arg in args]
    return new_tuple(Op, (code, origin, seq, tuple(args)))


_CODES = {int(c): c for c in OpCode}
#: How many args each op takes (a COMPUTE or MERGE with its room or without).
_ARITY = {
    OpCode.PUT: frozenset({1}),
    OpCode.PUT_IF_ABSENT: frozenset({1}),
    OpCode.REPLACE: frozenset({1}),
    OpCode.COMPARE_AND_SET: frozenset({2}),
    OpCode.REMOVE: frozenset({0}),
    OpCode.REMOVE_IF: frozenset({1}),
    OpCode.COMPUTE: frozenset({2, 3}),
    OpCode.MERGE: frozenset({2, 3}),
    OpCode.WRITE_MANY: frozenset({2}),
    OpCode.TRANSACT: frozenset({6}),
    OpCode.SET_IF_VERSION: frozenset({2}),
    OpCode.PUT_TTL: frozenset({2}),
    OpCode.WRITE_MANY_TTL: frozenset({3}),
    OpCode.EXPIRE: frozenset({1}),
    OpCode.PUT_FOR: frozenset({2, 3}),
    OpCode.BARRIER: frozenset({0}),
    OpCode.FLUSHED: frozenset({1, 2}),
}


_BYTES_OR_NIL = frozenset({bytes, type(None)})
#: Argument types that msgpack gives back as the same type and value (a str comes back a str:
#: ops are decoded with ``raw=False``).
_VERBATIM = frozenset({bytes, str, int, bool, float, type(None)})
_ARRAYS = frozenset({list, tuple})  # msgpack arrays: they decode as tuples

MANY_PAIRS = 4096
"""Pairs in one ``WRITE_MANY`` record at most."""
MANY_BYTES = 512 << 10
"""Bytes of one ``WRITE_MANY`` record at most (unless one pair needs more), below the topic's
record limit."""
_MANY_HEAD = 64  # a WRITE_MANY record's bytes besides its pairs (and its record key), at most
_PAIR_HEAD = 10  # msgpack's bytes around one key and value, at most


PAIR_SLACK = _MANY_HEAD + _PAIR_HEAD
"""A ``WRITE_MANY`` record's bytes besides one pair's key (twice: the record key repeats it)
and value, at most."""


def pair_fits(key: bytes, value: bytes | None, room: int) -> bool:
    """Whether the pair fits a ``WRITE_MANY`` record of its own, ``room`` as for
    :func:`write_many_chunks`."""
    return 2 * len(key) + len(value or b"") <= room - PAIR_SLACK


def write_many_chunks(
    keys: list[bytes], values: list[bytes | None], room: int
) -> Iterator[tuple[list[bytes], list[bytes | None]]]:
    """``keys`` and ``values`` cut, in order, into the pairs of ``WRITE_MANY`` records: at most
    :data:`MANY_PAIRS` pairs and :data:`MANY_BYTES` bytes each, a larger pair alone. ``room``
    is the bytes a record's key and value may take (the topic's limit less the map prefix,
    which the record key repeats with the first key). Raises
    :class:`~kafkakv.errors.RecordTooLargeError` for a pair that does not fit a record of its
    own, before yielding anything.

    >>> [len(k) for k, _ in write_many_chunks([b"k"] * 5000, [b"v"] * 5000, 1 << 20)]
    [4096, 904]
    """
    hard = room - _MANY_HEAD
    soft = min(MANY_BYTES, hard)
    longest_key = max(map(len, keys), default=0)
    largest = longest_key + max(map(len, filter(None, values)), default=0)
    if 2 * largest + _PAIR_HEAD > hard:  # maybe too large: look at each pair
        for k, v in zip(keys, values, strict=True):
            if not pair_fits(k, v, room):
                size = 2 * len(k) + len(v or b"") + _PAIR_HEAD
                raise RecordTooLargeError(
                    f"an update of about {size} bytes is over the {room + _MANY_HEAD} bytes "
                    "an ops record may hold here (max.message.bytes less the log's framing); "
                    "nothing of the batch was sent"
                )
    for start in range(0, len(keys), MANY_PAIRS):
        ks, vs = keys[start : start + MANY_PAIRS], values[start : start + MANY_PAIRS]
        # As many pairs as large as the largest fit: no need to count (the common case).
        if len(ks) * (largest + _PAIR_HEAD) + longest_key <= soft:
            yield ks, vs
            continue
        size = sum(map(len, ks)) + sum(map(len, filter(None, vs))) + _PAIR_HEAD * len(ks)
        if size + len(ks[0]) <= soft:
            yield ks, vs
            continue
        # Too big together: cut by size, pair by pair.
        first, size = 0, 0
        for i, (k, v) in enumerate(zip(ks, vs, strict=True)):
            pair = len(k) + len(v or b"") + _PAIR_HEAD
            if i > first and size + pair + len(ks[first]) > soft:
                yield ks[first:i], vs[first:i]
                first, size = i, 0
            size += pair
        yield ks[first:], vs[first:]


TTL_MAX_MS = 10**12
"""The longest time to live a ``PUT_FOR`` may carry, in ms (about 31 years): a deadline of
timestamp + ttl then stays well inside the 8 bytes of a flushed deadline."""


def put_deadline(code: OpCode, args: tuple[Any, ...], stamp: int) -> int:
    """The deadline (ms since the epoch) that a ``PUT_TTL``, ``PUT_FOR`` or ``WRITE_MANY_TTL``
    record stamped ``stamp`` gives the keys it puts: for ``PUT_FOR`` the stamp plus its ttl
    (the log's clock), for the older two the deadline they carry (the writer's clock). Raises
    :class:`~kafkakv.errors.OperationFailedError` when it is not an int (a ttl: from 1 to
    :data:`TTL_MAX_MS`), the same on every replica."""
    last = args[-1]
    if type(last) is not int:
        raise OperationFailedError(f"{code.name} needs an int {_TTL_ARG[code]}")
    if code is not OpCode.PUT_FOR:
        return last
    if not 0 < last <= TTL_MAX_MS:
        raise OperationFailedError(f"PUT_FOR needs a ttl from 1 to {TTL_MAX_MS} ms, not {last}")
    return stamp + last


_TTL_ARG = {
    OpCode.PUT_TTL: "deadline",
    OpCode.WRITE_MANY_TTL: "deadline",
    OpCode.PUT_FOR: "ttl",
}


def write_many_args(args: tuple[Any, ...]) -> tuple[list[bytes], list[bytes | None]]:
    """The store keys and values of a ``WRITE_MANY`` op. Raises
    :class:`~kafkakv.errors.OperationFailedError` for a malformed one (every replica alike).

    >>> write_many_args(((b"a", b"b"), (b"1", None)))
    ([b'a', b'b'], [b'1', None])
    """
    keys, values = args
    if type(keys) is not tuple or type(values) is not tuple or len(keys) != len(values):
        raise OperationFailedError("WRITE_MANY needs two arrays of the same length")
    if not {bytes}.issuperset(map(type, keys)) or not _BYTES_OR_NIL.issuperset(map(type, values)):
        raise OperationFailedError("WRITE_MANY keys must be bytes, values bytes or nil")
    return list(keys), list(values)


def transaction_args(args: tuple[Any, ...]) -> Transaction:
    """The parts of a ``TRANSACT`` op. Raises :class:`~kafkakv.errors.OperationFailedError`
    for a malformed one.

    >>> transaction_args(((b"a",), (None,), (b"c",), (7,), (b"b",), (b"1",))).versions
    [7]
    """
    expected_keys, expected = write_many_args(args[:2])
    keys, values = write_many_args(args[4:])
    versioned, versions = args[2:4]
    if (
        type(versioned) is not tuple
        or type(versions) is not tuple
        or len(versioned) != len(versions)
        or not {bytes}.issuperset(map(type, versioned))
        or not _INT_OR_NIL.issuperset(map(type, versions))
    ):
        raise OperationFailedError("TRANSACT versions must be keys and ints or nil")
    return Transaction(expected_keys, expected, list(versioned), list(versions), keys, values)


class Transaction(NamedTuple):
    """The parts of a ``TRANSACT`` op (see :func:`transaction_args`)."""

    expected_keys: list[bytes]
    expected: list[bytes | None]
    versioned: list[bytes]
    versions: list[int | None]
    keys: list[bytes]
    values: list[bytes | None]


_INT_OR_NIL = frozenset({int, type(None)})


def expectations_hold(
    expected: Sequence[bytes | None], current: Sequence[bytes | None], values: Codec[Any]
) -> bool:
    """Whether each current value is the expected one (None: absent), as compare-and-set
    compares them. Raises :class:`~kafkakv.errors.OperationFailedError` when a value to
    compare does not decode.

    >>> from kafkakv.codecs import codec_for
    >>> expectations_hold([b'{"a":1,"b":2}', None], [b'{"b":2,"a":1}', None], codec_for("json"))
    True
    >>> expectations_hold([None], [b"1"], codec_for("json"))
    False
    """
    try:
        for want, have in zip(expected, current, strict=True):
            if want is None or have is None:
                if want is not have:
                    return False
            elif not _equal(have, want, values):
                return False
    except DecodeError as exc:
        raise OperationFailedError(f"TRANSACT failed: {exc}") from exc
    return True


def _bytes_arg(value: Any, what: str) -> bytes:
    if not isinstance(value, bytes):
        raise DecodeError(f"{what} must be bytes in the record, not {type(value).__name__}")
    return value


def _equal(a: bytes, b: bytes, values: Codec[Any]) -> bool:
    """Value equality: equal bytes, or equal objects after decoding (msgpack dicts, for
    instance, may encode equal dicts in two orders)."""
    return a == b or values.decode(a) == values.decode(b)


def decide(
    code: OpCode,
    args: tuple[Any, ...],
    current: bytes | None,
    key: bytes,
    keys: Codec[Any],
    values: Codec[Any],
) -> tuple[Any, bytes | Keep | None]:
    """Decide one update against ``current``; return ``(result, new)``.

    ``new`` is the key's next value, ``None`` to remove it or :data:`KEEP`. ``result`` is what
    the writer's call returns, still encoded: the previous value's bytes (or ``None``) for put,
    put-if-absent, replace and remove; a bool for compare-and-set and remove-if; the new value's
    bytes (or ``None``) for compute and merge. Raises
    :class:`~kafkakv.errors.OperationFailedError`, identically on every replica.
    """
    try:
        if code is OpCode.PUT:
            return current, _bytes_arg(args[0], "the value")
        if code is OpCode.PUT_IF_ABSENT:
            return current, (_bytes_arg(args[0], "the value") if current is None else KEEP)
        if code is OpCode.REPLACE:
            return current, (KEEP if current is None else _bytes_arg(args[0], "the value"))
        if code is OpCode.REMOVE:
            return current, (KEEP if current is None else None)
        if code is OpCode.COMPARE_AND_SET:
            expected, new = args
            new = _bytes_arg(new, "the new value")
            if expected is None:
                ok = current is None
            else:
                ok = current is not None and _equal(
                    current, _bytes_arg(expected, "the expected value"), values
                )
            return ok, (new if ok else KEEP)
        if code is OpCode.REMOVE_IF:
            expected = _bytes_arg(args[0], "the expected value")
            ok = current is not None and _equal(current, expected, values)
            return ok, (None if ok else KEEP)
        if code is OpCode.COMPUTE:
            return _compute(args, current, key, keys, values)
        if code is OpCode.MERGE:
            return _merge(args, current, key, values)
    except OperationFailedError:
        raise
    except DecodeError as exc:
        raise OperationFailedError(f"{code.name} failed: {exc}") from exc
    raise OperationFailedError(f"{code.name} is not an update")


def _call(name: Any, *call_args: Any) -> Any:
    if not isinstance(name, str):
        raise DecodeError("a function name must be a str")
    fn = functions.lookup(name)  # UnknownFunctionError is an OperationFailedError
    try:
        return fn(*call_args)
    except KafkaKVError:
        raise
    except Exception as exc:
        raise FunctionError(name, exc) from exc


def _compute(
    args: tuple[Any, ...], current: bytes | None, key: bytes, keys: Codec[Any], values: Codec[Any]
) -> tuple[Any, bytes | Keep | None]:
    name, packed = args[:2]
    try:
        extra = msgpack.unpackb(_bytes_arg(packed, "the arguments"), raw=False)
    except DecodeError:
        raise
    except Exception as exc:
        raise DecodeError(f"compute arguments that are not msgpack: {exc}") from exc
    if type(extra) is not list:  # the writer packs a list: a str or a map would spread too
        raise DecodeError(f"compute arguments must be a msgpack array, not {type(extra).__name__}")
    old = None if current is None else values.decode(current)
    result = _call(name, keys.decode(key), old, *extra)
    return _settle(result, current, key, values, name, args[2:])


def _merge(
    args: tuple[Any, ...], current: bytes | None, key: bytes, values: Codec[Any]
) -> tuple[Any, bytes | Keep | None]:
    name, given = args[:2]
    given = _bytes_arg(given, "the value")
    if current is None:
        _check_room(key, given, name, args[2:])
        return given, given
    result = _call(name, values.decode(current), values.decode(given))
    return _settle(result, current, key, values, name, args[2:])


def _settle(
    result: Any,
    current: bytes | None,
    key: bytes,
    values: Codec[Any],
    name: str,
    room: tuple[Any, ...],
) -> tuple[Any, bytes | Keep | None]:
    """A function's result as the key's new value; ``room`` is the op's optional room arg."""
    if result is None:
        return None, (KEEP if current is None else None)
    try:
        encoded = values.encode(result)
    except KafkaKVError as exc:
        raise FunctionError(name, exc) from exc
    _check_room(key, encoded, name, room)
    return encoded, encoded


def _check_room(key: bytes, value: bytes, name: str, room: tuple[Any, ...]) -> None:
    """Raise :class:`~kafkakv.errors.ResultTooLargeError` when ``key`` and ``value`` take
    more than the op's room (``room``: its optional last arg; none, no limit)."""
    if not room:
        return
    limit = room[0]
    if type(limit) is not int:
        raise DecodeError("the room of a computed value must be an int")
    if len(key) + len(value) > limit:
        raise ResultTooLargeError(
            f"{name!r} gave a value of {len(value)} bytes: with its key's {len(key)} that is "
            f"over the {limit} bytes a record of the map may hold; nothing changed"
        )
