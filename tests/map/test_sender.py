"""The engine's concurrency parts on their own: the sender of async updates, the slots that
bound them, and the barriers readers share. Real threads, no log."""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable

import pytest

from kafkakv.errors import OperationTimeoutError
from kafkakv.log.base import Record
from kafkakv.map.barriers import SharedBarriers
from kafkakv.map.sender import Outgoing, Sender, Slots


def _record(item: Outgoing) -> Record:
    """The ops record of an update on its way (these tests queue records only)."""
    assert isinstance(item[1], Record)
    return item[1]


def test_the_sender_sends_everything_in_order_in_batches_and_drains() -> None:
    batches: list[list[Outgoing]] = []
    sender = Sender(batches.append, batch=100)
    thread = threading.Thread(target=sender.run)
    thread.start()
    for i in range(1000):
        sender.outbox.append((i % 3, Record(None, str(i).encode())))
        if sender.idle:
            sender.wake()
    assert sender.drain(time.monotonic() + 10, thread.is_alive)
    sent = [int(_record(item).value or b"") for batch in batches for item in batch]
    assert sent == list(range(1000))
    assert max(len(b) for b in batches) <= 100 and len(batches) < 1000  # batched
    sender.stop()
    assert sender.take_unsent() == []
    thread.join(5)
    assert not thread.is_alive()


def test_a_stopped_sender_hands_back_what_it_never_sent() -> None:
    sender = Sender(lambda batch: None)
    sender.outbox.append((0, Record(None, b"x")))
    assert sender.drain(time.monotonic() + 0.2, lambda: True) is False  # no thread: times out
    sender.stop()
    assert sender.take_unsent() == [(0, Record(None, b"x"))]


def test_an_update_is_either_sent_or_handed_back_never_both() -> None:
    """close() stops the sender while its thread takes a batch: what it hands back as never
    sent must not also be in that batch (it was reported as "never reached the log" while
    the batch carried it there)."""
    sent: list[Outgoing] = []
    sender = Sender(sent.extend, batch=1000, linger=0)
    handed_back: list[Outgoing] = []

    def close() -> None:
        sender.stop()
        handed_back.extend(sender.take_unsent())

    closer = threading.Thread(target=close)

    class SlowOutbox(collections.deque[Outgoing]):
        """Lets close() in after the thread took a few updates of its batch."""

        taken = 0

        def popleft(self) -> Outgoing:
            self.taken += 1
            if self.taken == 3:
                closer.start()
                closer.join(0.2)  # in the middle of taking the batch
            return super().popleft()

    sender.outbox = SlowOutbox((0, Record(None, str(i).encode())) for i in range(100))
    thread = threading.Thread(target=sender.run)
    thread.start()
    thread.join(10)
    closer.join(10)
    assert not thread.is_alive() and not closer.is_alive()
    assert len(sent) + len(handed_back) == 100
    values = {_record(item).value for item in sent}
    assert not values & {_record(item).value for item in handed_back}


def test_slots_bound_the_updates_in_flight() -> None:
    slots = Slots(2)
    assert slots.take(0) and slots.take(0)
    started = time.monotonic()
    assert not slots.take(0.1)  # full: the ticket goes back after the timeout
    assert time.monotonic() - started >= 0.09
    threading.Timer(0.05, slots.give, args=(1,)).start()
    assert slots.take(5)  # woken by the give
    slots.give(2)
    assert slots.take(0) and slots.take(0) and not slots.take(0)


def test_readers_at_once_share_a_few_barriers() -> None:
    barriers = SharedBarriers([0])
    runs: list[float] = []

    def barrier() -> None:
        runs.append(time.monotonic())
        time.sleep(0.05)

    done: list[float] = []

    def reader() -> None:
        barriers.join(0, time.monotonic() + 10, barrier, lambda: None, "p0")
        done.append(time.monotonic())

    threads = [threading.Thread(target=reader) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(done) == 20
    assert 1 <= len(runs) <= 3  # the first leader's barrier, then one for those who came later


def test_the_leaders_error_reaches_its_group_and_timeouts_hold() -> None:
    barriers = SharedBarriers([0])
    gate = threading.Event()

    def failing() -> None:
        gate.wait(5)
        raise OSError("the log failed")

    errors: list[BaseException] = []

    def member() -> None:
        try:
            barriers.join(0, time.monotonic() + 10, failing, lambda: None, "p0")
        except OSError as exc:
            errors.append(exc)

    leader = threading.Thread(target=member)
    leader.start()
    time.sleep(0.05)  # the leader runs; these join the next group
    followers = [threading.Thread(target=member) for _ in range(3)]
    for t in followers:
        t.start()
    time.sleep(0.05)
    gate.set()
    for t in [leader, *followers]:
        t.join(10)
    assert len(errors) == 4
    slow = SharedBarriers([0])
    hold = threading.Event()
    busy = threading.Thread(
        target=slow.join, args=(0, time.monotonic() + 10, lambda: hold.wait(5), lambda: None, "p0")
    )
    busy.start()
    time.sleep(0.05)
    started = time.monotonic()
    with pytest.raises(OperationTimeoutError, match="p0"):
        slow.join(0, time.monotonic() + 0.1, lambda: None, lambda: None, "p0")
    assert time.monotonic() - started < 2
    hold.set()
    busy.join(5)


def test_wait_sent_waits_for_what_was_queued_before_it_only() -> None:
    """An update that waits goes to the log after the async ones queued before it: wait_sent
    returns once those were sent (the send returned), not when the outbox is empty, which a
    steady stream of async updates may never leave it."""
    gate, inside = threading.Event(), threading.Event()
    then_ran: list[int] = []

    def send(batch: list[Outgoing]) -> Callable[[], None]:
        inside.set()
        assert gate.wait(10)
        return lambda: then_ran.append(len(batch))

    sender = Sender(send, batch=1, linger=0)
    thread = threading.Thread(target=sender.run)
    thread.start()
    assert sender.wait_sent(time.monotonic() + 1)  # nothing queued: at once
    sender.outbox.append((0, Record(None, b"a")))
    sender.wake()
    assert inside.wait(10) and sender.busy()
    assert not sender.wait_sent(time.monotonic() + 0.1)  # held in send: out of time
    waited: list[bool] = []
    waiter = threading.Thread(target=lambda: waited.append(sender.wait_sent(time.monotonic() + 10)))
    waiter.start()
    sender.outbox.append((0, Record(None, b"b")))  # queued after the wait began
    gate.set()
    waiter.join(10)
    assert waited == [True]
    assert sender.drain(time.monotonic() + 10, thread.is_alive) and then_ran == [1, 1]
    sender.stop()
    thread.join(5)
