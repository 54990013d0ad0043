"""The replica lock goes to the threads waiting for it, not to the thread that takes it back
to back: an applier is not shut out by a reader in a loop, nor a reader by appliers
(kafkakv.map.replicalock)."""

from __future__ import annotations

import statistics
import threading
import time

from kafkakv.map.replicalock import STEP_ASIDE, ReplicaLock


def _busy(seconds: float) -> None:
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass


def _spin(enter: object, stop: threading.Event, hold: float) -> threading.Thread:
    def run() -> None:
        while not stop.is_set():
            with enter:  # type: ignore[attr-defined]
                _busy(hold)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_an_applier_gets_the_lock_from_a_reader_that_takes_it_back_to_back() -> None:
    lock, stop = ReplicaLock(), threading.Event()
    reader = _spin(lock, stop, 0.002)  # len(m) in a loop, 2 ms a call
    waits = []
    try:
        time.sleep(0.05)
        for _ in range(30):
            start = time.monotonic()
            assert lock.acquire(timeout=1.0), "the applier waited 1 s for a spinning reader"
            waits.append(time.monotonic() - start)
            lock.release()
            time.sleep(0.001)
    finally:
        stop.set()
        reader.join(5)
    assert statistics.median(waits) < 0.02, waits
    assert lock.waiting == 0


def test_readers_take_their_turn_while_appliers_keep_coming() -> None:
    lock, stop = ReplicaLock(), threading.Event()
    appliers = [_spin(lock, stop, 0.001) for _ in range(2)]
    try:
        time.sleep(0.05)
        for _ in range(20):
            start = time.monotonic()
            with lock:
                pass
            assert time.monotonic() - start < STEP_ASIDE + 0.5, "appliers kept a reader out"
    finally:
        stop.set()
        for thread in appliers:
            thread.join(5)


def test_a_reader_holding_the_lock_takes_it_again_while_an_applier_waits() -> None:
    lock, applied = ReplicaLock(), threading.Event()

    def apply() -> None:
        with lock:
            applied.set()

    with lock:
        applier = threading.Thread(target=apply)
        applier.start()
        while not lock.waiting:
            time.sleep(0.001)
        start = time.monotonic()
        with lock:  # reentrant: no stepping aside for an applier that waits for us
            pass
        assert time.monotonic() - start < STEP_ASIDE / 2
        assert not applied.is_set()
    applier.join(5)
    assert applied.is_set() and lock.waiting == 0
