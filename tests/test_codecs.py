"""Codecs: what they refuse to encode, and checks that agree with decoding."""

from __future__ import annotations

import random
from collections.abc import Callable
from itertools import pairwise
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafkakv.codecs import Codec, codec_for
from kafkakv.errors import DecodeError, EncodeError


@pytest.mark.parametrize(
    "value",
    [float("nan"), [float("nan")], {"x": 1e309}, {"a": [1, {"b": float("-inf")}]}, (1.0, 1e400)],
)
def test_json_refuses_nan_and_infinity_at_any_depth(value: Any) -> None:
    with pytest.raises(EncodeError, match="NaN or infinity"):
        codec_for("json").encode(value)


def test_json_still_writes_null_and_finite_floats() -> None:
    json = codec_for("json")
    assert json.encode([None, 1.5, {"a": None}]) == b'[null,1.5,{"a":null}]'


def _mutations(seed: int, bases: list[bytes], count: int) -> list[bytes]:
    """Valid records with a few bytes changed, inserted or removed: most no longer decode."""
    rnd = random.Random(seed)
    alphabet = b'{}[]",:\\ue0123456789.-+truefalsn \xc3\xa9\xff\x00'
    out = []
    for _ in range(count):
        data = bytearray(rnd.choice(bases))
        for _ in range(rnd.randint(1, 3)):
            pos = rnd.randrange(len(data) + 1)
            char = alphabet[rnd.randrange(len(alphabet))]
            roll = rnd.random()
            if roll < 0.4 and pos < len(data):
                data[pos] = char
            elif roll < 0.7:
                data.insert(pos, char)
            elif pos < len(data):
                del data[pos]
        out.append(bytes(data))
    return out


def _accepts(read: Callable[[bytes], object], data: bytes) -> bool:
    try:
        read(data)
    except DecodeError:
        return False
    return True


@pytest.mark.parametrize("name", ["json", "str", "int", "msgpack", "bytes"])
def test_check_and_undecodable_agree_with_decode(name: str) -> None:
    """A replica stores what check() passes and reads it with decode(): check() must never
    pass bytes decode() refuses; undecodable() must name exactly the items check() refuses,
    whichever way the batch is made up (seed printed for replay)."""
    seed = random.randrange(1 << 30)
    print("seed", seed)
    codec = codec_for(name)
    bases = [
        codec.encode(v)
        for v in ({"a": [1, 2.5, "xé", None, True], "b": {"c": "d"}}, "hello", [1, 2], 12)
        if _encodable(codec, v)
    ] or [b"x" * 8]
    items = _mutations(seed, bases, 20_000)
    for data in items:
        try:
            codec.check(data)
        except DecodeError:
            continue
        assert _accepts(codec.decode, data), data
    rnd = random.Random(seed)
    for _ in range(300):
        batch = rnd.sample(items, rnd.randint(0, 40)) + rnd.sample(bases, 1)
        expected = [i for i, d in enumerate(batch) if not _accepts(codec.check, d)]
        assert codec.undecodable(batch) == expected, batch


def _encodable(codec: Codec[Any], value: Any) -> bool:
    try:
        codec.encode(value)
    except EncodeError:
        return False
    return True


def test_json_reads_a_number_beyond_float_range_as_infinity_like_the_stdlib() -> None:
    json = codec_for("json")
    json.check(b"[1e400]")
    assert json.decode(b"[1e400]") == [float("inf")]


@settings(max_examples=300, derandomize=True, deadline=None)
@given(
    text=st.lists(st.sampled_from(["a", "é", "€", "𝄞", '"', ",", "1", " "]), max_size=24),
    cuts=st.lists(st.integers(0, 100), max_size=8),
)
def test_a_batch_check_finds_items_that_cut_a_character_in_two(
    text: list[str], cuts: list[int]
) -> None:
    """Items cut from one UTF-8 text at any byte: together they make valid UTF-8 again, but
    an item that ends or starts inside a character does not decode, and the batch check must
    name it as checking the item alone does."""
    data = "".join(text).encode()
    bounds = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    items = [data[a:b] for a, b in pairwise(bounds)]
    for name in ("str", "json", "msgpack", "int", "bytes"):
        codec = codec_for(name)
        for batch in (items, [b'"' + i + b'"' for i in items]):
            expected = [i for i, d in enumerate(batch) if not _accepts(codec.check, d)]
            assert codec.undecodable(batch) == expected, (name, batch)


@pytest.mark.parametrize(
    "batch",
    [
        [b"[1", b"2]", b"3,4"],  # as many pieces as items, but other spans: [1,2] 3 4
        [b'"a', b'",', b'"b"'],  # "a","   ,"b": two strings, one empty piece apart
        [b" 1", b"2 ", b"\t3\n"],  # whitespace around values: valid, pieces shorter
        [b"{}", b"[]", b'""', b"0"],
    ],
)
def test_the_json_batch_check_names_the_items_a_check_of_each_refuses(batch: list[bytes]) -> None:
    """The batch check parses the items joined as one array and compares the pieces with the
    items by length: any batch whose pieces do not span exactly the items goes item by item."""
    json = codec_for("json")
    expected = [i for i, d in enumerate(batch) if not _accepts(json.check, d)]
    assert json.undecodable(batch) == expected
