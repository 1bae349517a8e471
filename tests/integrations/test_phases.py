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
                                     "step_seconds", "collective_seconds", "comm_bytes",
                                     "gc_seconds", "p2p_wait_seconds"]


def test_garbage_collection_leaves_the_phase_it_fell_in_for_a_gc_phase():
    intervals = [("data", 0.0, 0.1), ("forward", 0.1, 0.4), ("backward", 0.4, 0.9)]
    times = step_times(intervals, step_seconds=1.0,
                       gc_by_phase={"forward": 0.05, "data": 0.02, "step": 0.01})
    assert times.phases == pytest.approx({"data": 0.08, "forward": 0.25, "backward": 0.5,
                                          "gc": 0.07})
    # gc is compute: the pause still counts against the rank, under its own name; the
    # collection between two phases ("step") was in no phase and stays out
    assert times.compute_seconds == pytest.approx(0.82)
    assert times.data_seconds == pytest.approx(0.08)
    assert times.gc_seconds == pytest.approx(0.07)
    assert times.columns()["gc_seconds"] == pytest.approx(0.07)


def test_a_phase_never_loses_more_than_it_had_and_unmeasured_gc_is_nan():
    times = step_times([("forward", 0.0, 0.1)], step_seconds=0.2,
                       gc_by_phase={"forward": 0.5, "optimizer": 0.1})
    assert times.phases == pytest.approx({"forward": 0.0, "gc": 0.1})
    assert times.gc_seconds == pytest.approx(0.1)
    assert step_times([("forward", 0.0, 0.1)], step_seconds=0.2).gc_seconds != \
        step_times([("forward", 0.0, 0.1)], step_seconds=0.2).gc_seconds  # NaN


def test_without_timed_phases_or_on_the_device_clock_gc_is_only_reported():
    # no phase: compute is the whole step, every collection is in it
    bare = step_times([], step_seconds=0.5, gc_by_phase={"step": 0.1})
    assert bare.compute_seconds == pytest.approx(0.5) and bare.gc_seconds == pytest.approx(0.1)
    # the device clock's phases are device time: nothing moves
    device = step_times([("forward", 0.0, 0.3)], step_seconds=0.4,
                        gc_by_phase={"forward": 0.1}, move_gc=False)
    assert device.phases == pytest.approx({"forward": 0.3})
    assert device.gc_seconds == pytest.approx(0.1)


def test_the_loops_own_gc_phase_keeps_its_time_and_counts_its_collections():
    times = step_times([("forward", 0.0, 0.2), ("gc", 0.2, 0.3)], step_seconds=0.3,
                       gc_by_phase={"gc": 0.09, "forward": 0.05})
    assert times.phases == pytest.approx({"forward": 0.15, "gc": 0.15})
    assert times.gc_seconds == pytest.approx(0.14)


def test_phases_never_go_negative_and_repeated_names_add_up():
    intervals = [("backward", 0.0, 0.1), ("backward", 0.2, 0.3)]
    times = step_times(intervals, step_seconds=0.5, collectives=Collectives(0.4, 0.4, 0),
                       exposed_interval=(0.0, 0.4))
    assert times.phases == {"backward": 0.0}
    assert step_times(intervals, step_seconds=0.3).phases["backward"] == pytest.approx(0.2)


# -- the device clock's arithmetic (device marks as plain numbers) -----------------------------

from laggard.integrations.phases import (  # noqa: E402
    BUCKET_READY,
    PHASE_END,
    PHASE_START,
    STALL_END,
    STALL_START,
    SYNC_END,
    device_phases,
    device_step_times,
)


def _phase(name, start, end):
    return [(PHASE_START, name, start), (PHASE_END, name, end)]


def test_ddp_device_wait_runs_from_the_last_bucket_ready_to_backwards_end():
    # forward 0-0.030 on the device; backward 0.030-0.100, buckets ready at 0.05, 0.07, 0.08
    marks = (_phase("forward", 0.0, 0.030)
             + [(PHASE_START, "backward", 0.030)]
             + [(BUCKET_READY, "", t) for t in (0.05, 0.07, 0.08)]
             + [(PHASE_END, "backward", 0.100)])
    dev = device_phases(marks)
    assert dev.seconds == {"forward": pytest.approx(0.03), "backward": pytest.approx(0.07)}
    assert dev.waits == {"backward": pytest.approx(0.02)} and dev.wait_marks == 3
    # the CPU only launched: 2 ms forward, 5 ms backward, no exposed wait seen
    cpu = step_times([("forward", 0.0, 0.002), ("backward", 0.002, 0.007)], step_seconds=0.1,
                     collectives=Collectives(0.0, 0.001, 4096))
    times = device_step_times(cpu, marks)
    assert times.compute_device_seconds == pytest.approx(0.03 + 0.05)
    assert times.compute_seconds == pytest.approx(0.08)  # max(device, cpu) per phase
    assert times.compute_cpu_seconds == pytest.approx(0.007)
    assert times.collective_wait_seconds == pytest.approx(0.02)
    assert times.collective_wait_device_seconds == pytest.approx(0.02)


def test_max_of_device_and_cpu_keeps_a_launch_bound_or_data_bound_rank_visible():
    marks = _phase("data", 0.0, 0.001) + _phase("forward", 0.001, 0.004)
    cpu = step_times([("data", 0.0, 0.050), ("forward", 0.05, 0.06)], step_seconds=0.06)
    times = device_step_times(cpu, marks)
    assert times.data_seconds == pytest.approx(0.050)  # the CPU's data loading shows
    assert times.compute_seconds == pytest.approx(0.010)  # the launch took longer than the GPU
    assert times.compute_device_seconds == pytest.approx(0.003)


def test_no_sync_steps_have_no_wait_mark_everything_is_compute():
    marks = _phase("forward", 0.0, 0.03) + _phase("backward", 0.03, 0.09)
    cpu = step_times([("forward", 0.0, 0.001), ("backward", 0.001, 0.002)], step_seconds=0.09)
    times = device_step_times(cpu, marks)
    assert times.compute_device_seconds == pytest.approx(0.09)
    assert times.collective_wait_seconds == 0.0 and times.collective_wait_device_seconds == 0.0


def test_several_models_each_wait_in_their_own_phase():
    # a GAN-like step: two DDP models, each backward in a phase of its own
    marks = (_phase("forward", 0.0, 0.01)
             + [(PHASE_START, "backward_d", 0.01), (BUCKET_READY, "", 0.03),
                (PHASE_END, "backward_d", 0.04)]
             + [(PHASE_START, "backward_g", 0.04), (BUCKET_READY, "", 0.05),
                (BUCKET_READY, "", 0.06), (PHASE_END, "backward_g", 0.09)])
    dev = device_phases(marks)
    assert dev.waits == {"backward_d": pytest.approx(0.01), "backward_g": pytest.approx(0.03)}


def test_buffer_broadcast_and_fsdp_stalls_are_waits_nested_stalls_counted_once():
    marks = ([(PHASE_START, "forward", 0.0), (SYNC_END, "", 0.004),
              (STALL_START, "foreach_all_gather_copy_out", 0.010),
              (STALL_END, "foreach_all_gather_copy_out", 0.015),
              (PHASE_END, "forward", 0.040)]
             + [(PHASE_START, "backward", 0.040),
                (STALL_START, "post_backward", 0.060),
                (STALL_START, "_wait_for_post_backward", 0.061),
                (STALL_END, "_wait_for_post_backward", 0.070),
                (STALL_END, "post_backward", 0.072),
                (PHASE_END, "backward", 0.100)])
    dev = device_phases(marks)
    assert dev.waits["forward"] == pytest.approx(0.004 + 0.005)
    assert dev.waits["backward"] == pytest.approx(0.012)  # 0.060-0.072, the inner one inside
    cpu = step_times([("forward", 0, 0.001), ("backward", 0.001, 0.002)], step_seconds=0.1)
    times = device_step_times(cpu, dev)
    assert times.compute_device_seconds == pytest.approx(0.1 - 0.009 - 0.012)
    assert times.collective_wait_seconds == pytest.approx(0.021)


def test_marks_outside_every_phase_and_phases_without_device_time():
    marks = [(BUCKET_READY, "", 0.5)] + _phase("forward", 0.0, 0.02)
    dev = device_phases(marks)
    assert dev.unplaced_marks == 1 and dev.wait_marks == 0 and dev.waits == {}
    # a phase the device did not time keeps its CPU time; device compute is then unknown
    cpu = step_times([("forward", 0, 0.01), ("optimizer", 0.01, 0.03)], step_seconds=0.03)
    times = device_step_times(cpu, dev)
    assert times.compute_seconds == pytest.approx(0.02 + 0.02)
    assert times.compute_device_seconds != times.compute_device_seconds  # NaN
