"""Stateful property test: the embedded log against a plain in-memory model.

Hypothesis prints the failing sequence of steps; re-run with the printed seed
(``--hypothesis-seed=N``) to replay it.
"""

from __future__ import annotations

import shutil
import tempfile

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kafkakv.log import EmbeddedLog, Record
from tests.records import offset_of

KEYS = st.sampled_from([b"a", b"b", b"c", b"d", b"e", b"f"])
VALUES = st.one_of(st.none(), st.binary(min_size=0, max_size=300))


class LogModel(RuleBasedStateMachine):
    """The model is, per partition, every record ever appended; compaction may remove any
    record except the latest of each key and the records of the active segment."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="kafkakv-model-")
        self.log = EmbeddedLog(self.dir, background_cleaner=False)
        self.log.create_topic(
            "m",
            2,
            {
                "cleanup.policy": "compact",
                "segment.bytes": 1024,
                "index.interval.bytes": 128,
                "delete.retention.ms": 3_600_000,
            },
        )
        self.appended: list[dict[int, Record]] = [{}, {}]
        self.compacted = [False, False]

    def teardown(self) -> None:
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    @rule(p=st.integers(0, 1), batch=st.lists(st.tuples(KEYS, VALUES), min_size=1, max_size=8))
    def append(self, p: int, batch: list[tuple[bytes, bytes | None]]) -> None:
        first = self.log.append("m", p, [Record(k, v) for k, v in batch])
        assert first == len(self.appended[p])
        for i, (k, v) in enumerate(batch):
            self.appended[p][first + i] = Record(k, v, (), None, p, first + i)

    @rule(p=st.integers(0, 1))
    def compact(self, p: int) -> None:
        self.log.compact("m", p)
        self.compacted[p] = True

    @rule(p=st.integers(0, 1))
    def reopen(self, p: int) -> None:
        self.log.close()
        self.log = EmbeddedLog(self.dir, background_cleaner=False)

    @precondition(lambda self: any(self.appended))
    @rule(p=st.integers(0, 1), data=st.data())
    def read_from_anywhere(self, p: int, data: st.DataObject) -> None:
        end = len(self.appended[p])
        if end == 0:
            return
        offset = data.draw(st.integers(0, end - 1))
        limit = data.draw(st.integers(1, 20))
        got = self.log.read("m", p, offset, max_records=limit)
        assert 1 <= len(got) <= limit
        assert offset_of(got[0]) >= offset
        for r in got:
            want = self.appended[p][offset_of(r)]
            assert (r.key, r.value) == (want.key, want.value)
        if not self.compacted[p]:
            assert [r.offset for r in got] == list(range(offset, min(end, offset + limit)))

    @invariant()
    def whole_partitions_match_the_model(self) -> None:
        for p in (0, 1):
            got = self.log.read("m", p, 0, max_records=10**6, max_bytes=1 << 30)
            model = self.appended[p]
            assert self.log.end_offset("m", p) == len(model)
            offsets = [offset_of(r) for r in got]
            assert offsets == sorted(set(offsets))
            for r in got:
                want = model[offset_of(r)]
                assert (r.key, r.value) == (want.key, want.value)
            # The latest record of every key always survives (tombstones are kept for an hour).
            latest = {}
            for off in sorted(model):
                latest[model[off].key] = off
            assert set(latest.values()) <= set(offsets)
            # Nothing of the active segment is ever removed.
            active_base = self.log._partition("m", p).published().active_base
            assert [o for o in offsets if o >= active_base] == list(range(active_base, len(model)))

    @invariant()
    def check_finds_nothing(self) -> None:
        assert self.log.check() == []


LogModel.TestCase.settings = settings(
    max_examples=40,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_log_model = LogModel.TestCase
