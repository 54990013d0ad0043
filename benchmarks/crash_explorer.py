"""Open every crash state of every workload of the crash-state explorer and print the counts.

    python benchmarks/crash_explorer.py [WORKLOAD ...]

For each workload (tests/log/crash_workloads.py): the file-system effects it recorded, the
distinct crash states they allow (tests/log/crash_states.py), how many were opened, how many a
typed error refused (never one with a durable record at stake: that is a violation), the
violations, and the time taken. Exits 1 if any state violates a check. The suite runs the
same exploration on a spread sample (tests/log/test_crash_explorer.py).
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from tests.log.crash_explorer import explore
from tests.log.crash_workloads import WORKLOADS


def main(names: list[str]) -> int:
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        print(f"unknown workloads {unknown}; known: {', '.join(WORKLOADS)}", file=sys.stderr)
        return 2
    print(f"{'workload':<22}{'ops':>6}{'states':>9}{'refused':>9}{'violations':>12}{'seconds':>9}")
    states = violations = 0
    for name in names or list(WORKLOADS):
        start = time.perf_counter()
        recording = WORKLOADS[name]()
        outcome = explore(recording)
        took = time.perf_counter() - start
        print(
            f"{name:<22}{len(recording.ops):>6}{outcome.opened:>9}{outcome.refused:>9}"
            f"{len(outcome.violations):>12}{took:>9.1f}",
            flush=True,
        )
        for v in outcome.violations[:5]:
            print(f"    {v}")
        states += outcome.opened
        violations += len(outcome.violations)
    print(f"{'total':<22}{'':>6}{states:>9}{'':>9}{violations:>12}")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
