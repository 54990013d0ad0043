"""benchmarks/profile_visibility.py, small: it times its stages through internal hooks of the
embedded log and the map (the compiled append, the notifier's poll, the follower's read), so a
change that moves one of them must show here, not in a profile that silently reports nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "profile_visibility.py"
STAGES = (
    "before append",
    "append",
    "wake",
    "read",
    "apply + listener",
    "total",
    "bare wake",
    "bare protocol",
)


def test_the_visibility_profile_times_every_stage_of_every_update(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--updates", "150", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout.strip().splitlines()[-1])
    stages = result["stages"]
    assert tuple(stages) == STAGES  # a hook that stopped firing leaves its stage out
    for name in STAGES:
        assert 0 < stages[name]["p50_us"] <= stages[name]["p99_us"] < 1e6, name
    # The parts of one update add up to its whole, and each is inside it.
    parts = sum(stages[name]["p50_us"] for name in STAGES[:5])
    assert max(stages[name]["p50_us"] for name in STAGES[:5]) <= stages["total"]["p99_us"]
    assert 0.5 * stages["total"]["p50_us"] <= parts <= 2 * stages["total"]["p99_us"]
    for mode in ("back to back", "2 ms asleep", "2 ms spinning"):
        figures = result["cold"][mode]
        assert all(figures[part] > 0 for part in ("before", "append", "after")), mode
        assert figures["put"] >= max(figures["before"], figures["append"], figures["after"])
    assert os.listdir(tmp_path) == []  # its scratch directory is gone
