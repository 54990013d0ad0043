"""A process whose wall clock is off by a given skew, for tests of clocks that disagree.

:func:`skewed_env` gives the environment of a child process whose wall clock runs ``skew``
seconds ahead (or behind, negative) of the machine's: ``LD_PRELOAD`` loads a small C library
(:func:`shim_library`, built once with ``gcc`` and cached) that shifts what
``clock_gettime(CLOCK_REALTIME)``, ``clock_gettime(CLOCK_REALTIME_COARSE)``,
``gettimeofday`` and ``time`` return by the skew in :data:`SKEW_ENV`. Every other clock is
left alone: ``CLOCK_MONOTONIC`` above all, which timers go by. Timed waits that take an
absolute time of the wall clock (``cnd_timedwait``, ``mtx_timedlock``,
``pthread_cond_timedwait``, ``pthread_mutex_timedlock``, ``sem_timedwait``) get it shifted
back, since the kernel compares it with its own clock: librdkafka computes its waits so, and
without this a client 30 s behind spins and one 30 s ahead stalls 30 s on each wait (then
its metadata requests time out; Debian's ``faketime`` stalls librdkafka likewise). An
absolute time below 1e9 s (2001) is one of the monotonic clock, as a condition variable
set to ``CLOCK_MONOTONIC`` takes (Python's): left alone. :func:`run_skewed` starts a
command so. Built for glibc on x86-64 (``pthread_cond_timedwait`` is looked up at its
version ``GLIBC_2.3.2``, else unversioned).

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
   $KAFKAKV_CLOCK_SKEW seconds; every other clock is the kernel's. Timed waits that take an
   absolute time of CLOCK_REALTIME get it shifted back, so that they wait as long as meant. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdlib.h>
#include <sys/time.h>
#include <threads.h>
#include <time.h>

static long long skew_ns;
static int (*next_clock_gettime)(clockid_t, struct timespec *);

__attribute__((constructor)) static void setup(void) {
    const char *text = getenv("KAFKAKV_CLOCK_SKEW");
    skew_ns = text == NULL ? 0 : (long long)(strtod(text, NULL) * 1e9);
    next_clock_gettime = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
}

static void add_ns(struct timespec *ts, long long delta) {
    long long ns = (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec + delta;
    long long sec = ns / 1000000000LL, rest = ns % 1000000000LL;
    if (rest < 0) {
        rest += 1000000000LL;
        sec -= 1;
    }
    ts->tv_sec = (time_t)sec;
    ts->tv_nsec = (long)rest;
}

static int read_clock(clockid_t id, struct timespec *ts) {
    if (next_clock_gettime == NULL) setup();
    int rc = next_clock_gettime(id, ts);
    if (rc == 0 && skew_ns != 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE))
        add_ns(ts, skew_ns);
    return rc;
}

/* An absolute time the caller computed from the shifted wall clock, as the kernel's clock
   reads it. One of the monotonic clock (seconds since boot: a condition variable set to
   CLOCK_MONOTONIC, as Python's are) lies far below 1e9 s, the year 2001: left alone. */
static const struct timespec *unshifted(const struct timespec *at, struct timespec *out) {
    if (skew_ns == 0 || at == NULL || at->tv_sec < 1000000000) return at;
    *out = *at;
    add_ns(out, -skew_ns);
    return out;
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

static void *next_symbol(const char *name, const char *version) {
    void *found = version == NULL ? NULL : dlvsym(RTLD_NEXT, name, version);
    return found != NULL ? found : dlsym(RTLD_NEXT, name);
}

/* librdkafka waits with C11's cnd_timedwait (glibc's calls its pthread twin internally,
   where no preload reaches) on an absolute time from gettimeofday. */
int cnd_timedwait(cnd_t *restrict cond, mtx_t *restrict mutex, const struct timespec *restrict at) {
    static int (*next)(cnd_t *, mtx_t *, const struct timespec *);
    struct timespec real;
    if (next == NULL) next = next_symbol("cnd_timedwait", NULL);
    return next(cond, mutex, unshifted(at, &real));
}

int mtx_timedlock(mtx_t *restrict mutex, const struct timespec *restrict at) {
    static int (*next)(mtx_t *, const struct timespec *);
    struct timespec real;
    if (next == NULL) next = next_symbol("mtx_timedlock", NULL);
    return next(mutex, unshifted(at, &real));
}

int pthread_cond_timedwait(pthread_cond_t *restrict cond, pthread_mutex_t *restrict mutex,
                           const struct timespec *restrict at) {
    static int (*next)(pthread_cond_t *, pthread_mutex_t *, const struct timespec *);
    struct timespec real;
    /* dlsym alone finds the condition variables of glibc 2.2.5, another layout */
    if (next == NULL) next = next_symbol("pthread_cond_timedwait", "GLIBC_2.3.2");
    return next(cond, mutex, unshifted(at, &real));
}

int pthread_mutex_timedlock(pthread_mutex_t *restrict mutex, const struct timespec *restrict at) {
    static int (*next)(pthread_mutex_t *, const struct timespec *);
    struct timespec real;
    if (next == NULL) next = next_symbol("pthread_mutex_timedlock", NULL);
    return next(mutex, unshifted(at, &real));
}

int sem_timedwait(sem_t *restrict sem, const struct timespec *restrict at) {
    static int (*next)(sem_t *, const struct timespec *);
    struct timespec real;
    if (next == NULL) next = next_symbol("sem_timedwait", NULL);
    return next(sem, unshifted(at, &real));
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
        command = [gcc, "-shared", "-fPIC", "-O2", "-Wall", "-o", str(built), str(source)]
        command += ["-ldl", "-lpthread"]
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
