"""The crash-state explorer, bounded: every workload's crash states, a spread sample of them
opened after a simulated reboot (see tests/log/crash_explorer.py for the checks).

``KAFKAKV_CRASH_STATES`` sets how many states each workload opens (default 250; 0 opens all).
``python benchmarks/crash_explorer.py`` opens all of them and prints the counts.
"""

from __future__ import annotations

import os

import pytest

from tests.log.crash_explorer import explore
from tests.log.crash_workloads import WORKLOADS

_LIMIT = int(os.environ.get("KAFKAKV_CRASH_STATES", "250")) or None


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_every_crash_state_recovers_with_what_was_acknowledged(name: str) -> None:
    recording = WORKLOADS[name]()
    assert recording.ops, "the workload recorded no file-system effects"
    outcome = explore(recording, limit=_LIMIT)
    print(f"{name}: {outcome.states} distinct crash states, {outcome.opened} opened")
    assert outcome.opened == min(outcome.states, _LIMIT or outcome.states) > 0
    assert not outcome.violations, "\n".join(outcome.violations[:10])


def test_the_workloads_acknowledge_durable_records() -> None:
    """A workload that acknowledged nothing would check nothing: the ones that sync must
    acknowledge records, and states from before and after each acknowledgement exist."""
    for name in ("appends-always", "appends-interval", "transaction-always", "recovery"):
        recording = WORKLOADS[name]()
        assert recording.durable, name
        last = max(at for at, _, _ in recording.durable)
        assert 0 <= last <= len(recording.ops), name


def test_the_recorder_sees_each_kind_of_effect() -> None:
    """Every kind of effect the engine makes reaches the recording, with the right file."""
    kinds: dict[str, set[str]] = {}
    for name in ("appends-always", "compaction-always", "recovery", "transaction-always"):
        for op in WORKLOADS[name]().ops:
            kinds.setdefault(op.kind, set()).add(op.path.rsplit("/", 1)[-1])
    expected = {"mkdir", "create", "write", "truncate", "fsync", "dirsync", "rename", "link"}
    assert expected <= set(kinds) and "unlink" in kinds, sorted(kinds)
    assert "kafkakv-log.json" in {n.split(".tmp")[0] for n in kinds["link"]}
    assert any(n.endswith(".log") for n in kinds["fsync"])  # fdatasync of a segment
    assert {"topics", "0"} <= kinds["dirsync"]  # the topics directory, a partition's
