"""A process whose wall clock is off by a given skew, for tests of clocks that disagree.

:func:`skewed_env` gives the environment of a child process whose wall clock runs ``skew``
seconds ahead (or behind, negative) of the machine's: ``LD_PRELOAD`` loads a small C library
(:func:`shim_library`, built once with ``gcc`` and cached) that shifts what
``clock_gettime(CLOCK_REALTIME)``, ``clock_gettime(CLOCK_REALTIME_COARSE)``,
``gettimeofday`` and ``time`` return by the skew in :data:`SKEW_ENV`. Every other clock is
left alone: ``CLOCK_MONOTONIC`` above all, which timed waits, librdkafka's timers among
them, go by. (Debian's ``faketime`` shifts those too, and librdkafka's waits then stall.)
:func:`run_skewed` starts a command so.

Python's ``time.time()``, ``datetime.now()`` and librdkafka's ``CreateTime`` stamps in the
child are shifted; ``time.monotonic()`` is not. The child's kernel, and every other process,
keep the true time: file times, Kafka's ``LogAppendTime`` stamps. A statically linked
program, or one that reads the vDSO itself, escapes the shim.

Example (not run as a doctest: it compiles)::

    proc = run_skewed([sys.executable, "-c", "import time; print(time.time())"], 30.0,
                      stdout=subprocess.PIPE)
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kafkakv.dev.errors import ClockShimError
from kafkakv.dev.jars import default_cache_root

__all__ = ["SKEW_ENV", "run_skewed", "shim_library", "skewed_env"]

SKEW_ENV = "KAFKAKV_CLOCK_SKEW"
"""The environment variable the shim reads: the skew in seconds (a float, may be negative)."""

_SOURCE = r"""
/* kafkakv's wall-clock shim: shifts CLOCK_REALTIME(_COARSE), gettimeofday and time by
   $KAFKAKV_CLOCK_SKEW seconds; every other clock is the kernel's. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>

static long long skew_ns;
static int (*next_clock_gettime)(clockid_t, struct timespec *);

__attribute__((constructor)) static void setup(void) {
    const char *text = getenv("KAFKAKV_CLOCK_SKEW");
    skew_ns = text == NULL ? 0 : (long long)(strtod(text, NULL) * 1e9);
    next_clock_gettime = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
}

static int read_clock(clockid_t id, struct timespec *ts) {
    if (next_clock_gettime == NULL) setup();
    int rc = next_clock_gettime(id, ts);
    if (rc == 0 && skew_ns != 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) {
        long long ns = (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec + skew_ns;
        long long sec = ns / 1000000000LL, rest = ns % 1000000000LL;
        if (rest < 0) {
            rest += 1000000000LL;
            sec -= 1;
        }
        ts->tv_sec = (time_t)sec;
        ts->tv_nsec = (long)rest;
    }
    return rc;
}

int clock_gettime(clockid_t id, struct timespec *ts) { return read_clock(id, ts); }

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    struct timespec ts;
    int rc = read_clock(CLOCK_REALTIME, &ts);
    (void)tz;
    if (rc == 0) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return rc;
}

time_t time(time_t *out) {
    struct timespec ts;
    if (read_clock(CLOCK_REALTIME, &ts) != 0) return (time_t)-1;
    if (out != NULL) *out = ts.tv_sec;
    return ts.tv_sec;
}
"""


def shim_library(cache_root: Path | None = None) -> Path:
    """The shim's shared library, built with ``gcc`` on first use and cached under
    ``<cache root>/clockshim-<hash of its source>/`` (default root: ``$KAFKAKV_CACHE`` or
    ``~/.cache/kafkakv``); concurrent builders each write their own file and rename it into
    place. Raises :class:`~kafkakv.dev.errors.ClockShimError` when ``gcc`` is missing or
    fails (the message ends with its output). Cost: a compile of about 0.1 s, once."""
    digest = hashlib.sha256(_SOURCE.encode()).hexdigest()[:16]
    folder = (cache_root or default_cache_root()) / f"clockshim-{digest}"
    library = folder / "libkafkakv_clockshim.so"
    if library.exists():
        return library
    gcc = shutil.which("gcc")
    if gcc is None:
        raise ClockShimError("gcc is not installed: the clock shim cannot be built")
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as work:
        source = Path(work) / "clockshim.c"
        source.write_text(_SOURCE)
        built = Path(work) / library.name
        command = [gcc, "-shared", "-fPIC", "-O2", "-Wall", "-o", str(built), str(source), "-ldl"]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise ClockShimError(f"gcc could not build the clock shim: {done.stderr[-2000:]}")
        os.replace(built, library)
    return library


def skewed_env(
    skew: float, env: Mapping[str, str] | None = None, *, cache_root: Path | None = None
) -> dict[str, str]:
    """A copy of ``env`` (default: this process's environment) in which a child's wall clock
    runs ``skew`` seconds ahead of the machine's (behind when negative): the shim first in
    ``LD_PRELOAD``, and :data:`SKEW_ENV`. Builds the shim if need be (:func:`shim_library`)."""
    out = dict(os.environ if env is None else env)
    library = str(shim_library(cache_root))
    # A shim already there (an env made by this function) goes: its skew is replaced.
    others = [p for p in out.get("LD_PRELOAD", "").split() if not _is_shim(p)]
    out["LD_PRELOAD"] = " ".join([library, *others])
    out[SKEW_ENV] = repr(float(skew))
    return out


def _is_shim(path: str) -> bool:
    return Path(path).name == "libkafkakv_clockshim.so"


def run_skewed(
    args: Sequence[str], skew: float, *, env: Mapping[str, str] | None = None, **popen: Any
) -> subprocess.Popen[Any]:
    """Start ``args`` with its wall clock ``skew`` seconds off (see :func:`skewed_env`);
    ``popen``: the rest of :class:`subprocess.Popen`'s arguments. The caller waits for it
    (or kills it), as for any Popen."""
    return subprocess.Popen(list(args), env=skewed_env(skew, env), **popen)
