"""The wall-clock shim (kafkakv.dev.clock): a child's wall clocks are shifted, its monotonic
clock is not."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kafkakv.dev.clock import SKEW_ENV, run_skewed, shim_library, skewed_env

_CHILD = r"""
import ctypes, datetime, json, time
libc = ctypes.CDLL(None)

class Timeval(ctypes.Structure):
    _fields_ = [("sec", ctypes.c_long), ("usec", ctypes.c_long)]

def waited(wait, *objects):
    # A timed wait until 0.2 s from now by the (shifted) wall clock, as librdkafka waits.
    at = time.time() + 0.2
    when = Timeval(int(at), int(at % 1 * 1e9))  # a timespec: seconds, nanoseconds
    started = time.monotonic()
    wait(*objects, ctypes.byref(when))
    return time.monotonic() - started

tv = Timeval()
libc.gettimeofday(ctypes.byref(tv), None)
cond, mutex = ctypes.create_string_buffer(64), ctypes.create_string_buffer(64)  # zero: init
libc.pthread_mutex_lock(mutex)
cnd, mtx = ctypes.create_string_buffer(64), ctypes.create_string_buffer(64)
libc.mtx_init(mtx, 0)
libc.cnd_init(cnd)
libc.mtx_lock(mtx)
print(json.dumps({
    "pthread_cond_timedwait": waited(libc.pthread_cond_timedwait, cond, mutex),
    "cnd_timedwait": waited(libc.cnd_timedwait, cnd, mtx),
    "time": time.time(),
    "coarse": time.clock_gettime(getattr(time, "CLOCK_REALTIME_COARSE", 5)),
    "libc_time": libc.time(None),
    "gettimeofday": tv.sec + tv.usec / 1e6,
    "datetime": datetime.datetime.now(datetime.timezone.utc).timestamp(),
    "monotonic": time.monotonic(),
}))
"""


@pytest.mark.parametrize("skew", [30.0, -30.0, 0.0, -86_400.25])
def test_a_child_reads_its_wall_clocks_shifted_and_its_monotonic_clock_not(
    skew: float, tmp_path: Path
) -> None:
    mono_before, wall_before = time.monotonic(), time.time()
    child = run_skewed(
        [sys.executable, "-c", _CHILD],
        skew,
        env=skewed_env(skew, cache_root=tmp_path),
        stdout=subprocess.PIPE,
        text=True,
    )
    out, _ = child.communicate(timeout=30)
    mono_after, wall_after = time.monotonic(), time.time()
    assert child.returncode == 0
    seen = json.loads(out)
    for clock, slack in [
        ("time", 0.0),
        ("datetime", 0.0),
        ("gettimeofday", 0.0),
        ("coarse", 0.01),  # a tick behind at most
        ("libc_time", 1.0),  # whole seconds
    ]:
        assert wall_before + skew - slack <= seen[clock] <= wall_after + skew, clock
    assert mono_before <= seen["monotonic"] <= mono_after
    for wait in ("pthread_cond_timedwait", "cnd_timedwait"):  # librdkafka's waits
        assert 0.19 <= seen[wait] < 2.0, wait


def test_the_shim_is_built_once_and_goes_first_in_ld_preload(tmp_path: Path) -> None:
    library = shim_library(tmp_path)
    built = library.stat().st_mtime_ns
    assert shim_library(tmp_path) == library and library.stat().st_mtime_ns == built
    env = skewed_env(-1.5, {"LD_PRELOAD": "/other.so", "PATH": "/bin"}, cache_root=tmp_path)
    assert env["LD_PRELOAD"] == f"{library} /other.so" and env[SKEW_ENV] == "-1.5"
    assert env["PATH"] == "/bin"
    again = skewed_env(2.0, env, cache_root=tmp_path)  # the skew is replaced, not added
    assert again["LD_PRELOAD"] == f"{library} /other.so" and again[SKEW_ENV] == "2.0"
