"""Running a pytest of its own from a test (to test the suite's plugins)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_pytest(
    tmp_path: Path, args: Sequence[str], env: Mapping[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m pytest args`` from the repository's root, with ``tmp_path`` as its
    root directory and its own base temporary directory under it.

    That base directory matters: a pytest left to choose its own resets
    ``/tmp/pytest-of-<user>`` to mode 700 at its start, which takes the search bit from every
    test directory of the outer run, and a PostgreSQL server running there as its own system
    user (as root, see :mod:`kafkakv.dev.postgres`) loses its data directory.
    """
    where = ["--rootdir", str(tmp_path), "--basetemp", str(tmp_path / "inner-tmp")]
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *where, *args],
        cwd=ROOT,
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
