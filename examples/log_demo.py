"""A guided, self-checking tour of kafkakv's embedded log.

It shows, on a real log directory and with real operating-system processes:

1. a compacted topic ``accounts`` with 3 partitions and tiny segments;
2. 3 writer processes appending keyed records at the same time while 2 tailer processes
   follow every partition with ``wait()``/``read()`` — every tailer must see exactly the
   appended records, in offset order, none lost and none twice;
3. compaction — records and bytes before and after, only the newest value of each key left,
   and the offsets of the survivors unchanged;
4. a writer (using ``fsync="always"``) killed with SIGKILL in the middle of appending — after
   reopening, ``check()`` finds nothing wrong, every acknowledged batch is there and whole, the
   log ends exactly at a batch boundary, and appending simply continues.

Each claim is checked as it is shown. The demo prints "demo ok: ..." and exits 0 when all of
them hold, and exits 1 (keeping the log directory for inspection) when any does not.

Run it from the project root::

    .venv/bin/python examples/log_demo.py              # in a fresh temporary directory
    .venv/bin/python examples/log_demo.py --keep       # ... and keep that directory
    .venv/bin/python examples/log_demo.py --dir /tmp/my-log   # in an empty or new directory
"""

from __future__ import annotations

import contextlib
import itertools
import json
import multiprocessing as mp
import queue
import random
import signal
import sys
import time
from collections import Counter
from collections.abc import Iterable
from multiprocessing.connection import Connection
from multiprocessing.context import SpawnProcess
from multiprocessing.synchronize import Event
from typing import Any

from _tour import (
    DemoFailure,
    Inbox,
    Verdicts,
    console,
    kill_mid_stream,
    plural,
    report_child_error,
    run_tour,
    tour_main,
)
from rich.table import Table

from kafkakv import EmbeddedLog, Record, partition_for

TOPIC = "accounts"
PARTITIONS = 3
TOPIC_CONFIG: dict[str, object] = {
    "cleanup.policy": "compact",
    "segment.bytes": 4096,
    "min.cleanable.dirty.ratio": 0.01,
}
JOURNAL = "journal"
JOURNAL_CONFIG: dict[str, object] = {"cleanup.policy": "delete", "segment.bytes": 8192}

WRITERS = 3
TAILERS = 2
RECORDS_PER_WRITER = 3000
KEYS = 150  # distinct account keys, so compaction has plenty to remove
ROUND = 12  # records generated per round; each round becomes one batch per partition
KILL_AFTER_ACKS = 300  # acknowledged batches to wait for before the SIGKILL
CHILD_TIMEOUT_S = 20.0

# Shapes of the data passed around (plain tuples: they cross process boundaries by pickle).
Entry = tuple[int, bytes | None, bytes | None]
"""``(offset, key, value)`` of one record as read back."""
AppendedBatch = tuple[int, int, list[tuple[bytes, bytes]]]
"""``(partition, first offset, [(key, value), ...])`` as acknowledged by ``append()``."""
Expected = dict[int, dict[int, tuple[bytes, bytes]]]
"""partition -> offset -> ``(key, value)``: everything the writers were told they appended."""


# -- small helpers ------------------------------------------------------------------------


def offset_of(record: Record) -> int:
    """The offset of a record read back (always set on reads)."""
    if record.offset is None:
        raise DemoFailure(f"a record came back from read() without an offset: {record!r}")
    return record.offset


def read_all(log: EmbeddedLog, topic: str, partition: int) -> list[Entry]:
    """Every record of one partition, from its start offset to its end offset."""
    entries: list[Entry] = []
    offset = log.start_offset(topic, partition)
    end = log.end_offset(topic, partition)
    while offset < end:
        records = log.read(topic, partition, offset, max_records=1000)
        if not records:
            raise DemoFailure(f"read({topic}-{partition}, {offset}) was empty below end {end}")
        entries.extend((offset_of(r), r.key, r.value) for r in records)
        offset = offset_of(records[-1]) + 1
    return entries


def account_key(rng: random.Random) -> bytes:
    return f"acct-{rng.randrange(KEYS)}".encode()


# -- child processes (module level so that the 'spawn' start method can find them) ----------


def writer_main(path: str, writer_id: int, count: int, events: Any, go: Event) -> None:
    """Append ``count`` keyed records to ``accounts`` and report every acknowledged batch."""
    who = f"writer {writer_id}"
    try:
        rng = random.Random(writer_id)
        appended: list[AppendedBatch] = []
        with EmbeddedLog(path, background_cleaner=False) as log:
            events.put(("ready", who))
            if not go.wait(CHILD_TIMEOUT_S):
                raise DemoFailure("never told to start")
            n = 0
            while n < count:
                rounds: dict[int, list[Record]] = {}
                for _ in range(min(ROUND, count - n)):
                    key = account_key(rng)
                    value = json.dumps(
                        {"writer": writer_id, "n": n, "balance": rng.randrange(100_000)}
                    ).encode()
                    rounds.setdefault(partition_for(key, PARTITIONS), []).append(Record(key, value))
                    n += 1
                for partition, records in sorted(rounds.items()):
                    first = log.append(TOPIC, partition, records)
                    pairs = [(r.key, r.value) for r in records if r.key and r.value]
                    appended.append((partition, first, pairs))
        events.put(("wrote", writer_id, appended))
    except BaseException:
        report_child_error(events, who)


def tailer_main(path: str, tailer_id: int, events: Any, targets: Any) -> None:
    """Follow every partition of ``accounts`` until the end offsets in ``targets`` are reached."""
    who = f"tailer {tailer_id}"
    try:
        seen: dict[int, list[Entry]] = {p: [] for p in range(PARTITIONS)}
        positions = [0] * PARTITIONS
        goal: dict[int, int] | None = None
        wakeups = 0
        turn = 0
        deadline = time.monotonic() + CHILD_TIMEOUT_S
        with EmbeddedLog(path, background_cleaner=False) as log:
            events.put(("ready", who))
            while time.monotonic() < deadline:
                progressed = False
                for p in range(PARTITIONS):
                    records = log.read(TOPIC, p, positions[p], max_records=1000)
                    if records:
                        seen[p].extend((offset_of(r), r.key, r.value) for r in records)
                        positions[p] = offset_of(records[-1]) + 1
                        progressed = True
                if goal is None:
                    with contextlib.suppress(queue.Empty):
                        goal = targets.get_nowait()
                if goal is not None and all(positions[p] >= goal[p] for p in range(PARTITIONS)):
                    break
                if not progressed:
                    turn = (turn + 1) % PARTITIONS
                    if log.wait(TOPIC, turn, positions[turn], 0.05):
                        wakeups += 1
        events.put(("saw", tailer_id, seen, wakeups))
    except BaseException:
        report_child_error(events, who)


def crash_writer_main(path: str, acks: Connection) -> None:
    """Append batches to ``journal`` as fast as possible, acknowledging each through ``acks``.

    It uses ``fsync="always"``: each append then waits for the disk between writing its batch
    and publishing it, which makes it likely that the kill lands in that window and leaves a
    written but unpublished (torn) tail behind. Batch ``i`` holds ``size`` records whose values say ``i:j:size:`` for j = 0..size-1, so a
    reader can tell a whole batch from a piece of one. Runs until it is killed.
    """
    with EmbeddedLog(path, fsync="always", background_cleaner=False) as log:
        acks.send(("ready", -1, 0))
        i = 0
        while True:
            size = 1 + (i * 7) % 40
            records = [
                Record(f"batch-{i}".encode(), journal_value(i, j, size)) for j in range(size)
            ]
            first = log.append(JOURNAL, 0, records)
            acks.send(("ack", i, first, size))
            i += 1


def journal_value(batch: int, index: int, size: int) -> bytes:
    return f"{batch}:{index}:{size}:".encode() + b"." * 24


# -- the parent's side of the child processes -------------------------------------------------


# -- step 1 -----------------------------------------------------------------------------------


def step_create(v: Verdicts, log: EmbeddedLog) -> None:
    console.rule("[bold]Step 1 · a compacted topic")
    log.create_topic(TOPIC, PARTITIONS, TOPIC_CONFIG)
    config = log.topic_config(TOPIC)
    console.print(
        f"Created topic [bold]{TOPIC}[/] with {PARTITIONS} partitions in {log.path}: "
        f"cleanup.policy={config['cleanup.policy']}, segment.bytes={config['segment.bytes']} "
        f"(tiny, so the partitions roll over into many segments), "
        f"min.cleanable.dirty.ratio={config['min.cleanable.dirty.ratio']}."
    )
    v.expect(log.topics() == [TOPIC], f"the log lists exactly one topic, {TOPIC!r}")
    v.expect(log.partitions(TOPIC) == PARTITIONS, f"{TOPIC!r} has {PARTITIONS} partitions")
    v.expect(
        all(log.end_offset(TOPIC, p) == 0 for p in range(PARTITIONS)),
        "every partition starts empty (end offset 0)",
    )


# -- step 2 -----------------------------------------------------------------------------------


def step_concurrent(v: Verdicts, log: EmbeddedLog, children: list[SpawnProcess]) -> Expected:
    console.rule("[bold]Step 2 · 3 writers and 2 tailers, all separate processes")
    ctx = mp.get_context("spawn")
    events = ctx.Queue()
    go = ctx.Event()
    goals = [ctx.Queue() for _ in range(TAILERS)]
    tailers = [
        ctx.Process(target=tailer_main, args=(log.path, t, events, goals[t]), name=f"tailer-{t}")
        for t in range(TAILERS)
    ]
    writers = [
        ctx.Process(
            target=writer_main,
            args=(log.path, w, RECORDS_PER_WRITER, events, go),
            name=f"writer-{w}",
        )
        for w in range(WRITERS)
    ]
    children.extend(tailers + writers)
    for proc in tailers + writers:
        proc.start()
    inbox = Inbox(events, tailers + writers, CHILD_TIMEOUT_S)
    inbox.take("ready", TAILERS + WRITERS)
    console.print(
        f"{TAILERS} tailers are following all partitions and {WRITERS} writers are ready; "
        f"each writer now appends {RECORDS_PER_WRITER:,} records for {KEYS} account keys "
        f"(acct-0 … acct-{KEYS - 1}), sending each key to partition_for(key, {PARTITIONS})."
    )
    started = time.monotonic()
    go.set()

    # What the writers were told they appended.
    expected: Expected = {p: {} for p in range(PARTITIONS)}
    collisions = 0
    writer_rows: list[tuple[str, Counter[int], int]] = []
    for _, writer_id, appended in sorted(inbox.take("wrote", WRITERS), key=lambda m: m[1]):
        per_partition: Counter[int] = Counter()
        for partition, first, pairs in appended:
            for i, pair in enumerate(pairs):
                if first + i in expected[partition]:
                    collisions += 1
                expected[partition][first + i] = pair
            per_partition[partition] += len(pairs)
        writer_rows.append((f"writer {writer_id}", per_partition, len(appended)))
    write_s = time.monotonic() - started
    ends = {p: log.end_offset(TOPIC, p) for p in range(PARTITIONS)}
    for q in goals:
        q.put(ends)
    saw = sorted(inbox.take("saw", TAILERS), key=lambda m: m[1])
    follow_s = time.monotonic() - started
    for proc in tailers + writers:
        proc.join(timeout=10)

    table = Table(title="who appended / saw how many records")
    table.add_column("process")
    for p in range(PARTITIONS):
        table.add_column(f"partition {p}", justify="right")
    table.add_column("total", justify="right")
    table.add_column("batches / wake-ups", justify="right")
    for name, per_partition, batches in writer_rows:
        cells = [f"{per_partition[p]:,}" for p in range(PARTITIONS)]
        table.add_row(name, *cells, f"{per_partition.total():,}", f"{batches:,} batches")
    for _, tailer_id, seen, wakeups in saw:
        cells = [f"{len(seen[p]):,}" for p in range(PARTITIONS)]
        total = sum(len(s) for s in seen.values())
        table.add_row(f"tailer {tailer_id}", *cells, f"{total:,}", f"{wakeups:,} wake-ups")
    console.print(table)
    total = sum(len(e) for e in expected.values())
    console.print(
        f"The writers finished in {write_s:.2f} s; the tailers had caught up by {follow_s:.2f} s. "
        "A wake-up is a wait() that returned because another process appended."
    )

    v.expect(
        all(proc.exitcode == 0 for proc in tailers + writers),
        "all 5 child processes exited cleanly",
    )
    v.expect(
        total == WRITERS * RECORDS_PER_WRITER and collisions == 0,
        f"append() acknowledged all {total:,} records, and no two of them got the same offset",
        f"append() acknowledged {total:,} records with {collisions} offset collisions",
    )
    v.expect(
        all(sorted(expected[p]) == list(range(ends[p])) for p in range(PARTITIONS)),
        "each partition's offsets run 0, 1, 2, … up to its end offset, without a gap",
        f"offsets do not cover 0..end exactly (end offsets {ends})",
    )
    v.expect(
        all(partition_for(k, PARTITIONS) == p for p in expected for k, _ in expected[p].values()),
        "every record sits in the partition partition_for() chose for its key",
    )
    for _, tailer_id, seen, _ in saw:
        problems = []
        for p in range(PARTITIONS):
            want = [(o, *expected[p][o]) for o in sorted(expected[p])]
            if seen[p] != want:
                offsets = [e[0] for e in seen[p]]
                dupes = len(offsets) - len(set(offsets))
                missing = len(set(expected[p]) - set(offsets))
                disorder = sum(1 for a, b in itertools.pairwise(offsets) if b <= a)
                altered = sum(
                    1 for e in seen[p] if e[0] in expected[p] and e[1:] != expected[p][e[0]]
                )
                problems.append(
                    f"partition {p}: {missing} missing, {dupes} duplicated, "
                    f"{disorder} out of order, {altered} with other contents"
                )
        v.expect(
            not problems,
            f"tailer {tailer_id} saw every appended record exactly once, in offset order, "
            "with the same key and value",
            f"tailer {tailer_id} saw something else: {'; '.join(problems)}",
        )
    return expected


# -- step 3 -----------------------------------------------------------------------------------


def latest_per_key(entries: Iterable[tuple[int, bytes, bytes]]) -> dict[bytes, tuple[int, bytes]]:
    """key -> (offset, value) of its newest record."""
    latest: dict[bytes, tuple[int, bytes]] = {}
    for offset, key, value in sorted(entries):
        latest[key] = (offset, value)
    return latest


def compaction_boundary(
    entries: list[tuple[int, bytes, bytes]], survivors: set[int], end: int
) -> int | None:
    """The offset ``a`` at which compaction stopped, if the survivors fit that model.

    Kafka's cleaner never touches the active segment, so after a full compaction a partition
    holds, for each key, its newest record below the active segment's first offset ``a``, plus
    every record from ``a`` on. Returns the ``a`` that explains ``survivors``; None if none does.
    """
    removed = {o for o, _, _ in entries} - survivors
    for a in range(max(removed, default=-1) + 1, end + 1):
        below = latest_per_key(e for e in entries if e[0] < a)
        if survivors == {o for o, _ in below.values()} | set(range(a, end)):
            return a
    return None


def step_compaction(v: Verdicts, log: EmbeddedLog, expected: Expected) -> dict[int, list[Entry]]:
    console.rule("[bold]Step 3 · compaction")
    before = {p: read_all(log, TOPIC, p) for p in range(PARTITIONS)}
    started = time.monotonic()
    results = log.compact(TOPIC)
    compact_s = time.monotonic() - started
    after = {p: read_all(log, TOPIC, p) for p in range(PARTITIONS)}

    table = Table(title=f"compact({TOPIC!r}) took {compact_s * 1000:.0f} ms")
    table.add_column("partition")
    table.add_column("records before → after", justify="right")
    table.add_column("keys", justify="right")
    table.add_column("segments cleaned → written", justify="right")
    table.add_column("bytes cleaned → written", justify="right")
    for p, r in enumerate(results):
        keys = len({k for _, k, _ in after[p]})
        table.add_row(
            str(p),
            f"{len(before[p]):,} → {len(after[p]):,}",
            str(keys),
            f"{r.segments_in} → {r.segments_out}",
            f"{r.bytes_in:,} → {r.bytes_out:,}",
        )
    console.print(table)

    all_latest: dict[bytes, bytes] = {}
    for p in range(PARTITIONS):
        entries = [(o, k, val) for o, (k, val) in expected[p].items()]
        survivors = {o: (k, val) for o, k, val in after[p]}
        latest = latest_per_key(entries)
        all_latest.update({k: val for k, (_, val) in latest.items()})
        end = log.end_offset(TOPIC, p)
        reread = {k: val for _, k, val in after[p] if k is not None and val is not None}
        v.expect(
            before[p] == [(o, *expected[p][o]) for o in sorted(expected[p])],
            f"partition {p}: before compaction it read back exactly what was appended",
        )
        v.expect(
            all(expected[p].get(o) == kv for o, kv in survivors.items()),
            f"partition {p}: every surviving record keeps its offset, key and value",
            f"partition {p}: some surviving records changed offset or contents",
        )
        boundary = compaction_boundary(entries, set(survivors), end)
        v.expect(
            boundary is not None,
            f"partition {p}: below offset {boundary or 0:,} only the newest record of each key "
            f"is left; the {end - (boundary or 0):,} records from there on (the segment still "
            "open for appends, which the cleaner leaves alone, as in Kafka) are untouched",
            f"partition {p}: the {len(survivors)} survivors are not 'newest of each key below "
            "some offset, everything above it'",
        )
        v.expect(
            reread == {k: val for k, (_, val) in latest.items()},
            f"partition {p}: reading it back gives exactly the latest value of its "
            f"{len(latest)} keys",
        )
        r = results[p]
        v.expect(
            r.records_in - r.records_out == len(before[p]) - len(after[p]) > 0,
            f"partition {p}: the cleaner's own count of removed records "
            f"({r.records_in - r.records_out:,}) matches what reads show",
        )
    console.print(
        f"Across the topic {len(all_latest)} keys remain, each with its latest balance, e.g. "
        f"acct-7 → {all_latest.get(b'acct-7', b'?').decode()}"
    )
    again = log.compact(TOPIC)
    segments = (sum(r.segments_in for r in again), sum(r.segments_out for r in again))
    v.expect(
        all(r.records_in == r.records_out for r in again)
        and all(read_all(log, TOPIC, p) == after[p] for p in range(PARTITIONS)),
        "a second compaction removes nothing more (it only merges the small cleaned "
        f"segments: {segments[0]} → {segments[1]}), and the topic reads back the same",
    )
    problems = log.check()
    v.expect(not problems, "check() finds no problem after compaction", f"check(): {problems}")
    return after


# -- step 4 -----------------------------------------------------------------------------------


def step_crash(
    v: Verdicts, path: str, accounts: dict[int, list[Entry]], children: list[SpawnProcess]
) -> tuple[int, int]:
    console.rule("[bold]Step 4 · kill -9 a writer in mid-stream, then reopen")
    with EmbeddedLog(path, background_cleaner=False) as log:
        log.create_topic(JOURNAL, 1, JOURNAL_CONFIG)
    console.print(
        f"Closed the log, created topic [bold]{JOURNAL}[/] (1 partition, segment.bytes="
        f"{JOURNAL_CONFIG['segment.bytes']}), and started a writer process that appends batches "
        "of 1 to 40 records as fast as it can (fsync=always), reporting each acknowledged batch "
        "through a pipe."
    )
    ctx = mp.get_context("spawn")
    receiver, sender = ctx.Pipe(duplex=False)
    writer = ctx.Process(target=crash_writer_main, args=(path, sender), name="crash-writer")
    children.append(writer)
    writer.start()
    sender.close()  # the child holds the only write end: EOF once it is dead

    acks: dict[int, tuple[int, int]] = {}  # batch number -> (first offset, size)

    def receive(timeout: float) -> bool:
        if not receiver.poll(timeout):
            return False
        try:
            message = receiver.recv()
        except EOFError:
            return False
        if message[0] == "ack":
            acks[message[1]] = (message[2], message[3])
        return True

    kill_mid_stream(
        writer, receiver, receive, acks, KILL_AFTER_ACKS, CHILD_TIMEOUT_S, "the crash writer"
    )
    acked_records = sum(size for _, size in acks.values())
    console.print(
        f"Sent SIGKILL a few milliseconds after the {KILL_AFTER_ACKS}th acknowledgement; the "
        f"writer had acknowledged {plural(len(acks), 'batch', 'batches')} "
        f"({acked_records:,} records) when it died. Now reopening the log."
    )
    v.expect(writer.exitcode == -signal.SIGKILL, "the writer really died of SIGKILL")

    with EmbeddedLog(path, background_cleaner=False) as log:
        problems = log.check()
        v.expect(
            not problems, "check() on the reopened log finds no problem", f"check(): {problems}"
        )
        entries = read_all(log, JOURNAL, 0)
        end = log.end_offset(JOURNAL, 0)
        batches, broken = split_batches(entries)
        v.expect(not broken, "the journal holds only whole batches", f"torn batches: {broken}")
        v.expect(
            all(batches.get(i) == ack for i, ack in acks.items()),
            f"all {len(acks):,} acknowledged batches are present at the offsets append() "
            "returned, every record intact",
            f"acknowledged batches missing or moved: "
            f"{[i for i, ack in acks.items() if batches.get(i) != ack][:10]}",
        )
        numbers = sorted(batches)
        contiguous = numbers == list(range(len(numbers))) and all(
            batches[i][0] == (batches[i - 1][0] + batches[i - 1][1] if i else 0) for i in numbers
        )
        v.expect(contiguous, "the batches follow one another with no gap and no overlap")
        extra = len(batches) - len(acks)
        v.expect(
            extra in (0, 1),
            f"beyond the acknowledged ones the log holds {plural(extra, 'batch', 'batches')} "
            "(one that was published just before the kill, whose acknowledgement never left)"
            if extra
            else "the log holds nothing beyond the acknowledged batches",
            f"the log holds {extra} unexpected extra batches",
        )
        last = batches[numbers[-1]] if numbers else (0, 0)
        v.expect(
            end == last[0] + last[1],
            f"the end offset {end:,} is exactly the end of the last whole batch: whatever the "
            "writer was half-way through was cleaned away",
            f"the end offset {end} is not the end of the last whole batch ({last[0] + last[1]})",
        )
        v.expect(
            all(read_all(log, TOPIC, p) == accounts[p] for p in range(PARTITIONS)),
            f"the compacted {TOPIC!r} topic reads back exactly as before the reopen",
        )

        size = 5
        resumed = [
            Record(b"after-crash", journal_value(len(numbers), j, size)) for j in range(size)
        ]
        first = log.append(JOURNAL, 0, resumed)
        back = log.read(JOURNAL, 0, first)
        v.expect(
            first == end and [r.value for r in back] == [r.value for r in resumed],
            f"appending again continues at offset {first:,} and reads back intact",
            f"the new batch went to offset {first} (expected {end}) or read back wrong",
        )
        problems = log.check()
        v.expect(not problems, "check() is still clean afterwards", f"check(): {problems}")
    return len(acks), len(numbers)


def split_batches(entries: list[Entry]) -> tuple[dict[int, tuple[int, int]], list[str]]:
    """Group journal records into batches: batch number -> (first offset, size).

    Also returns a description of every batch that is not whole and in order.
    """
    batches: dict[int, tuple[int, int]] = {}
    broken: list[str] = []
    members: dict[int, list[tuple[int, int, int]]] = {}
    for offset, key, value in entries:
        batch, index, size = (int(x) for x in (value or b"?:?:?:").split(b":")[:3])
        if key != f"batch-{batch}".encode() or value != journal_value(batch, index, size):
            broken.append(f"offset {offset}: unexpected record {key!r}={value!r}")
        members.setdefault(batch, []).append((offset, index, size))
    for batch, rows in members.items():
        first, _, size = rows[0]
        if rows != [(first + j, j, size) for j in range(size)]:
            broken.append(f"batch {batch}: {len(rows)} of {size} records, or out of place")
        batches[batch] = (first, size)
    return batches, broken


# -- main -------------------------------------------------------------------------------------


def run(path: str) -> list[str]:
    """Run every step against the log in ``path``; return the failures (empty when all hold)."""

    def steps(v: Verdicts, children: list[SpawnProcess]) -> tuple[dict[int, list[Entry]], int, int]:
        with EmbeddedLog(path, background_cleaner=False) as log:
            step_create(v, log)
            expected = step_concurrent(v, log, children)
            compacted = step_compaction(v, log, expected)
        acked, present = step_crash(v, path, compacted, children)
        return compacted, acked, present

    def summary(result: tuple[dict[int, list[Entry]], int, int], seconds: float) -> str:
        compacted, acked, present = result
        kept = sum(len(e) for e in compacted.values())
        return (
            f"{WRITERS * RECORDS_PER_WRITER:,} records from {WRITERS} "
            f"writer processes seen exactly by {TAILERS} tailers; compaction kept {kept:,} "
            f"records; all {acked} acknowledged batches survived a SIGKILL (the log holds "
            f"{present}), and check() found nothing wrong; {seconds:.1f} s"
        )

    return run_tour(steps, summary)


def main(argv: list[str] | None = None) -> int:
    return tour_main(
        argv,
        __doc__,
        lambda path, keep: run(path),
        what="log directory",
        prefix="kafkakv-demo-",
    )


if __name__ == "__main__":
    sys.exit(main())
