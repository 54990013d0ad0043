"""Damage every file of a closed embedded log, one way at a time, and read it all back.

Each case must end in a typed kafkakv error or in the data as written: never a raw
``UnicodeDecodeError`` or ``KeyError``, never a record at an offset it was not written at, and
never a clean ``check()`` over data that reads back short. Seeded; the seed is printed and
``KAFKAKV_SEED=<n>`` replays it.
"""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Callable
from pathlib import Path

from kafkakv.errors import KafkaKVError
from kafkakv.log import EmbeddedLog, Record
from kafkakv.log.base import Problem
from tests.records import offset_of

Mutation = Callable[[Path, random.Random], None]
Contents = dict[tuple[str, int], dict[int, tuple[bytes | None, bytes | None]]]


def _flip(path: Path, rnd: random.Random) -> None:
    data = bytearray(path.read_bytes())
    if data:
        data[rnd.randrange(len(data))] ^= 1 << rnd.randrange(8)
        path.write_bytes(bytes(data))


def _truncate(path: Path, rnd: random.Random) -> None:
    size = path.stat().st_size
    os.truncate(path, rnd.randrange(size) if size else 0)


def _delete(path: Path, rnd: random.Random) -> None:
    path.unlink()


def _junk(path: Path, rnd: random.Random) -> None:
    with open(path, "ab") as f:
        f.write(rnd.randbytes(rnd.randint(1, 64)))


MUTATIONS: list[tuple[str, Mutation]] = [
    *[("flip", _flip)] * 4,  # a byte flipped lands in a header, an index entry or a record
    ("truncate", _truncate),
    ("delete", _delete),
    ("junk", _junk),
]


def _build(path: Path) -> Contents:
    """A small closed log: a plain topic of two partitions and a compacted topic, both over
    several segments, the compacted one cleaned, and a committed transaction."""
    with EmbeddedLog(path, background_cleaner=False) as log:
        log.create_topic("plain", 2, {"segment.bytes": 2048, "index.interval.bytes": 256})
        log.create_topic(
            "compacted",
            1,
            {
                "cleanup.policy": "compact",
                "segment.bytes": 2048,
                "index.interval.bytes": 256,
                "min.cleanable.dirty.ratio": 0.01,
            },
        )
        for i in range(120):
            log.append("plain", i % 2, [Record(b"k%d" % i, b"value-%d" % i * 4)])
            log.append("compacted", 0, [Record(b"k%d" % (i % 7), b"v%d" % i * 8)])
        log.compact("compacted")
        with log.writer("w") as w:
            w.append({("plain", 0): [Record(b"tx", b"committed")]})
        return {
            (t, p): {offset_of(r): (r.key, r.value) for r in _read_all(log, t, p)}
            for t, p in (("plain", 0), ("plain", 1), ("compacted", 0))
        }


def _read_all(log: EmbeddedLog, topic: str, partition: int) -> list[Record]:
    out: list[Record] = []
    offset, end = log.start_offset(topic, partition), log.end_offset(topic, partition)
    while offset < end:
        got = log.read(topic, partition, offset, max_records=9)
        if not got:
            break
        out += got
        offset = offset_of(got[-1]) + 1
    return out


def _outcome(path: Path, expected: Contents) -> str:
    """Open, read everything, check; raise AssertionError for an outcome that is neither
    a typed error nor the data as written. Returns a short description of what happened."""
    complete = True
    try:
        with EmbeddedLog(path, background_cleaner=False) as log:
            for (topic, partition), records in expected.items():
                try:
                    got = _read_all(log, topic, partition)
                except KafkaKVError:
                    complete = False
                    continue
                for r in got:
                    assert records.get(offset_of(r)) == (r.key, r.value), (topic, partition, r)
                complete = complete and len(got) == len(records)
            problems: list[Problem] | None = None
            try:
                problems = log.check()
            except KafkaKVError:
                return "check raised"
            assert complete or problems, "reads came back short and check() found nothing"
            return f"{len(problems)} problems" if problems else "intact"
    except KafkaKVError as exc:
        return type(exc).__name__


def test_every_damage_to_a_closed_log_ends_in_a_typed_error_or_the_data(tmp_path: Path) -> None:
    seed = int(os.environ.get("KAFKAKV_SEED") or random.randrange(1 << 32))
    print(f"seed: {seed} (replay with KAFKAKV_SEED={seed})")
    rnd = random.Random(seed)
    template = tmp_path / "template"
    expected = _build(template)
    files = sorted(p.relative_to(template) for p in template.rglob("*") if p.is_file())
    assert any(f.name.endswith(".log") for f in files) and len(files) > 20
    failures = []
    case = 0
    for rel in files:
        for name, mutate in MUTATIONS:
            case += 1
            work = tmp_path / f"case{case}"
            shutil.copytree(template, work)
            mutate(work / rel, rnd)
            try:
                _outcome(work, expected)
            except Exception as exc:  # an untyped error or wrong data: collect them all
                failures.append(f"{rel} {name}: {type(exc).__name__}: {exc}")
            shutil.rmtree(work)
    assert not failures, f"seed {seed}:\n" + "\n".join(failures)
