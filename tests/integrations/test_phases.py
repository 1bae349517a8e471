"""The phase arithmetic of one step, with plain numbers (no torch, no clock, no socket)."""

from dataclasses import dataclass

import pytest

from laggard.integrations.phases import step_times


@dataclass
class Collectives:
    exposed_seconds: float
    total_seconds: float
    bytes: int


def test_ddp_exposed_wait_comes_out_of_the_phase_it_fell_in_on_the_wall_clock():
    # backward runs 1.0-1.5 s; the last bucket was ready at 1.3 and completed at 1.45
    intervals = [("data", 0.0, 0.1), ("forward", 0.1, 1.0), ("backward", 1.0, 1.5),
                 ("optimizer", 1.5, 1.6)]
    times = step_times(intervals, step_seconds=1.6, collectives=Collectives(0.15, 0.4, 4096),
                       exposed_interval=(1.3, 1.45))
    assert times.phases["backward"] == pytest.approx(0.35)
    assert times.compute_seconds == pytest.approx(0.9 + 0.35 + 0.1)
    assert times.data_seconds == pytest.approx(0.1)
    assert times.collective_wait_seconds == 0.15
    assert (times.collective_seconds, times.comm_bytes) == (0.4, 4096)


def test_a_cpu_clock_does_not_advance_while_waiting_so_nothing_is_taken_out():
    intervals = [("forward", 0.0, 0.2), ("backward", 0.2, 0.5)]
    times = step_times(intervals, step_seconds=0.9, collectives=Collectives(0.3, 0.4, 1),
                       exposed_interval=(0.3, 0.6), wall_clock=False)
    assert times.phases == {"forward": pytest.approx(0.2), "backward": pytest.approx(0.3)}
    assert times.compute_seconds == pytest.approx(0.5)
    assert times.collective_wait_seconds == 0.3


def test_the_loops_own_collective_wait_phase_is_the_wait_and_never_a_phase():
    intervals = [("forward", 0.0, 0.2), ("collective_wait", 0.2, 0.3), ("data", 0.3, 0.35)]
    times = step_times(intervals, step_seconds=0.35)
    assert "collective_wait" not in times.phases
    assert times.collective_wait_seconds == pytest.approx(0.1)
    assert times.compute_seconds == pytest.approx(0.2)
    assert times.collective_seconds == pytest.approx(0.1)
    # with a timer, the timer's exposed time is the wait; the loop's phase is still no compute
    timed = step_times(intervals, step_seconds=0.35, collectives=Collectives(0.05, 0.1, 8))
    assert timed.collective_wait_seconds == 0.05 and "collective_wait" not in timed.phases
    assert timed.compute_seconds == pytest.approx(0.2)


def test_blocking_collectives_seen_only_by_the_tracer_come_off_compute():
    # FSDP2 on gloo: synchronous all-gathers of 0.2 s sat inside forward
    intervals = [("forward", 0.0, 0.5), ("backward", 0.5, 1.0)]
    times = step_times(intervals, step_seconds=1.0, collectives=Collectives(0.2, 0.2, 64),
                       blocking_collectives=True)
    assert times.compute_seconds == pytest.approx(0.8)
    cpu = step_times(intervals, step_seconds=1.0, collectives=Collectives(0.2, 0.2, 64),
                     blocking_collectives=True, wall_clock=False)
    assert cpu.compute_seconds == pytest.approx(1.0)


def test_no_phase_timed_makes_the_step_minus_the_wait_compute():
    times = step_times([], step_seconds=0.5, collectives=Collectives(0.1, 0.2, 0))
    assert times.compute_seconds == pytest.approx(0.4) and times.data_seconds == 0
    assert list(times.columns()) == ["compute_seconds", "data_seconds",
                                     "collective_wait_seconds", "transfer_seconds",
                                     "step_seconds", "collective_seconds", "comm_bytes"]


def test_phases_never_go_negative_and_repeated_names_add_up():
    intervals = [("backward", 0.0, 0.1), ("backward", 0.2, 0.3)]
    times = step_times(intervals, step_seconds=0.5, collectives=Collectives(0.4, 0.4, 0),
                       exposed_interval=(0.0, 0.4))
    assert times.phases == {"backward": 0.0}
    assert step_times(intervals, step_seconds=0.3).phases["backward"] == pytest.approx(0.2)
