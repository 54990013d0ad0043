"""The estimate of the log's clock (kafkakv.map.logclock): a lower bound, whatever the delays.

Hypothesis draws a log whose clock is some offset from this process's monotonic clock, records
stamped by it and applied here after delays of any length, and checks that the estimate is
never ahead of the log's clock (a reaper going by it is late, never early) and that it is
as late as the shortest delay seen, no later.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kafkakv.map.logclock import LogClock

SETTINGS = settings(max_examples=200, derandomize=True, deadline=None)


@SETTINGS
@given(
    st.integers(1, 2 * 10**12),  # stamps are ms since the epoch: above 0
    st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 5_000)), min_size=1, max_size=40),
)
def test_the_estimate_is_a_lower_bound_as_late_as_the_shortest_delay(
    offset: int, records: list[tuple[int, int]]
) -> None:
    """``offset``: the log's clock minus the monotonic clock; each record is stamped at
    monotonic ``at`` and applied ``delay`` ms later."""
    clock = LogClock()
    for at, delay in sorted(records):
        clock.observe(0, at + offset, at + delay)
    shortest = min(delay for _, delay in records)
    for probe in (0.0, 1e6, 1e9):
        now = clock.now(0, probe)
        assert now is not None
        assert now <= probe + offset  # never ahead of the log's clock
        assert now == probe + offset - shortest
    assert clock.earliest(5.0) == clock.now(0, 5.0)
    assert clock.now(1, 5.0) is None and not clock.fresh(0)


def test_a_contradiction_takes_the_later_sample_and_asks_for_a_measurement() -> None:
    """The log's clock stepped back by 1 s (a leader whose clock is behind): an EXPIRE by the
    old estimate was stamped too early; its sample is the estimate now, and the partition is
    measured again before the next proposal."""
    clock = LogClock()
    clock.measured(0, 10_000, 100.0)
    assert clock.fresh(0) and clock.now(0, 200.0) == 10_100.0
    clock.contradicted(0, 9_150, 250.0)  # stamped 9,150 where the estimate said 10,150
    assert not clock.fresh(0) and clock.now(0, 250.0) == 9_150.0
    clock.observe(0, 9_000, 250.0)  # an older, lower sample changes nothing
    clock.measured(0, 9_200, 290.0)
    assert clock.fresh(0) and clock.now(0, 300.0) == 9_210.0


def test_reads_go_by_the_partition_whose_clock_is_furthest_behind() -> None:
    clock = LogClock()
    assert clock.earliest(0.0) is None
    clock.observe(0, 5_000, 0.0)
    clock.observe(1, 4_000, 0.0)
    clock.observe(0, 0, 0.0)  # no timestamp: nothing learned
    assert clock.earliest(10.0) == 4_010.0 and clock.now(0, 10.0) == 5_010.0
    clock.observe(1, 6_000, 0.0)
    assert clock.earliest(10.0) == 5_010.0
