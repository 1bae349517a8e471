"""Kernel-level compute from CUPTI (issue 27, item 5) without a GPU: the accounting on synthetic
activity records, and the glue against a fake ``cupti.cupti`` with cupti-python's names
(subscribe, activity_register_callbacks, activity_enable, external correlation, flush), including
CUPTI taken by another subscriber, the PyTorch profiler on, and the package missing."""

from __future__ import annotations

import itertools
import logging
import math
from types import SimpleNamespace

import pytest

from laggard.integrations.cupti import KernelAccumulator, KernelTimer, is_nccl_kernel


def test_nccl_kernels_are_left_out_as_nvrx_does():
    assert is_nccl_kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL")
    assert is_nccl_kernel("ncclKernel_AllGather_RING_LL_Sum_int8_t")
    assert not is_nccl_kernel("ampere_sgemm_128x64_nn")
    assert not is_nccl_kernel("void at::native::vectorized_elementwise_kernel<4>")


def test_kernel_time_is_summed_per_step_whichever_half_arrives_first():
    acc = KernelAccumulator()
    acc.add_correlation(1, step=10)
    acc.add_kernel(1, "sgemm", 1_000, 4_000)             # 3 us, step 10
    acc.add_kernel(2, "elementwise", 5_000, 6_000)       # 1 us, its correlation comes later
    acc.add_kernel(3, "ncclDevKernel_AllReduce", 0, 10**9)  # communication: left out
    acc.add_correlation(2, step=10)
    acc.add_correlation(4, step=11)
    acc.add_kernel(4, "sgemm", 0, 2_000)
    acc.add_kernel(5, "bad", 10, 5)                       # end before start
    assert acc.take(before_step=11) == {10: (pytest.approx(4e-6), 2)}
    assert acc.take(before_step=12) == {11: (pytest.approx(2e-6), 1)}
    assert acc.take(before_step=12) == {}
    assert acc.stats == {"kernels": 3, "nccl_kernels": 1, "unmatched": 0, "bad_records": 1}


def test_unmatched_halves_are_bounded():
    acc = KernelAccumulator(max_unmatched=4)
    for c in range(10):
        acc.add_kernel(c, "k", 0, 1)
    assert acc.stats["unmatched"] == 6 and len(acc._waiting) == 4


# ------------------------------------------------------------------ a fake cupti-python
class CuptiError(Exception):
    """``cupti.cupti.cuptiError``."""


class FakeCupti:
    """``cupti.cupti`` as laggard calls it; ``launch(name, ns)`` is a kernel launch of the job."""

    ActivityKind = SimpleNamespace(CONCURRENT_KERNEL=10, KERNEL=3, RUNTIME=5, DRIVER=4,
                                   EXTERNAL_CORRELATION=21)
    ExternalCorrelationKind = SimpleNamespace(CUSTOM0=3, CUSTOM1=4)
    cuptiError = CuptiError

    def __init__(self, taken: bool = False) -> None:
        self.taken = taken
        self.enabled: set[int] = set()
        self.stack: list[int] = []
        self.buffer: list = []
        self.callbacks = None
        self.subscribers = 0
        self.clock = itertools.count(0, 1000)
        self.correlation = itertools.count(1)

    def subscribe(self, callback, userdata):
        if self.taken:
            raise CuptiError("CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED")
        self.subscribers += 1
        return "subscriber"

    def unsubscribe(self, subscriber) -> None:
        self.subscribers -= 1

    def activity_register_callbacks(self, requested, completed) -> None:
        assert requested() == (8 << 20, 0)
        self.callbacks = (requested, completed)

    def activity_enable(self, kind: int) -> None:
        self.enabled.add(kind)

    def activity_disable(self, kind: int) -> None:
        self.enabled.discard(kind)

    def activity_push_external_correlation_id(self, kind, external_id: int) -> None:
        assert kind == self.ExternalCorrelationKind.CUSTOM1
        self.stack.append(external_id)

    def activity_pop_external_correlation_id(self, kind) -> int:
        return self.stack.pop()

    def activity_flush_all(self, flag: int) -> None:
        records, self.buffer = self.buffer, []
        if records:
            self.callbacks[1](records[::-1])  # any order: kernels before their correlations

    def launch(self, name: str, duration_ns: int) -> None:
        k = self.ActivityKind
        if k.CONCURRENT_KERNEL not in self.enabled:
            return
        corr = next(self.correlation)
        if self.stack and k.EXTERNAL_CORRELATION in self.enabled and k.RUNTIME in self.enabled:
            self.buffer.append(SimpleNamespace(kind=k.EXTERNAL_CORRELATION, correlation_id=corr,
                                               external_id=self.stack[-1]))
        start = next(self.clock)
        self.buffer.append(SimpleNamespace(kind=k.CONCURRENT_KERNEL, correlation_id=corr,
                                           name=name, start=start, end=start + duration_ns))


def _steps(timer: KernelTimer, cupti: FakeCupti, steps: range) -> None:
    for step in steps:
        timer.begin_step(step)
        cupti.launch("ampere_sgemm", 300_000)
        cupti.launch("ncclDevKernel_AllReduce_Sum", 5_000_000)
        cupti.launch("elementwise", 100_000)
        timer.end_step()


def test_sampled_steps_get_their_non_nccl_kernel_time_one_window_late():
    cupti = FakeCupti()
    timer = KernelTimer(sample_every=2, cupti=cupti, profiler_on=lambda: False)
    assert timer.start() and timer.running and cupti.subscribers == 1
    _steps(timer, cupti, range(0, 5))
    assert cupti.ActivityKind.CONCURRENT_KERNEL not in cupti.enabled  # only during a sample
    got = timer.take(before_step=5)
    assert got == {0: (pytest.approx(4e-4), 2), 2: (pytest.approx(4e-4), 2),
                   4: (pytest.approx(4e-4), 2)}
    assert timer.stats["sampled"] == 3 and timer.accumulator.stats["nccl_kernels"] == 3
    timer.stop()
    assert cupti.subscribers == 0 and not timer.running


def test_cupti_taken_by_another_subscriber_refuses_clearly_once(caplog):
    timer = KernelTimer(cupti=FakeCupti(taken=True), profiler_on=lambda: False)
    with caplog.at_level(logging.WARNING):
        assert not timer.start() and not timer.start()
    assert "another subscriber" in timer.refused
    assert len([r for r in caplog.records if "CUPTI" in r.getMessage()]) == 1
    timer.begin_step(0)
    timer.end_step()
    assert timer.take(before_step=10) == {}


def test_the_pytorch_profiler_on_refuses_at_start_and_skips_sampled_steps():
    assert not KernelTimer(cupti=FakeCupti(), profiler_on=lambda: True).start()
    profiling = [False]
    cupti = FakeCupti()
    timer = KernelTimer(sample_every=1, cupti=cupti, profiler_on=lambda: profiling[0])
    assert timer.start()
    profiling[0] = True
    _steps(timer, cupti, range(3))
    assert timer.stats["skipped_profiler"] == 3 and timer.take(before_step=3) == {}


def test_without_cupti_python_the_timer_refuses_and_events_stay(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_cupti(name, *args, **kwargs):
        if name == "cupti":
            raise ImportError("No module named 'cupti'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_cupti)
    timer = KernelTimer(profiler_on=lambda: False)
    assert not timer.start() and "not installed" in timer.refused


def test_cupti_failing_mid_run_is_counted_never_raised():
    cupti = FakeCupti()
    timer = KernelTimer(sample_every=1, cupti=cupti, profiler_on=lambda: False)
    assert timer.start()

    def broken(*args):
        raise CuptiError("CUPTI_ERROR_UNKNOWN")

    cupti.activity_push_external_correlation_id = broken
    cupti.activity_flush_all = broken
    timer.begin_step(0)
    timer.end_step()
    assert timer.take(before_step=1) == {}
    timer._buffer_completed([SimpleNamespace(kind="garbage")])
    assert timer.stats["errors"] == 2 and timer.accumulator.stats["bad_records"] == 1
    with pytest.raises(ValueError):
        KernelTimer(sample_every=0)


def test_the_participant_puts_kernel_time_in_the_window_record_one_window_late():
    from laggard.integrations.cupti import KERNEL_COLUMN, KernelTimeParticipant
    from laggard.integrations.monitor import TrainingMonitor

    cupti = FakeCupti()
    timer = KernelTimer(sample_every=2, cupti=cupti, profiler_on=lambda: False)
    participant = KernelTimeParticipant(timer=timer)
    monitor = TrainingMonitor(TrainingMonitor.Config(agent_address="", detect=False,
                                                     window_steps=4, phase_clock="wall"),
                              rank=0, world_size=1, participants=[participant])
    assert KERNEL_COLUMN in monitor.layout and timer.running
    values = []
    for step in range(12):
        with monitor.step():
            cupti.launch("ampere_sgemm", 300_000 if step < 4 else 600_000)
            cupti.launch("ncclDevKernel_AllReduce_Sum", 5_000_000)
        if (step + 1) % 4 == 0:
            values.append(participant.contribute(step))
    # window 0: nothing older than itself; window 1 carries window 0's sampled steps (0, 2)
    assert math.isnan(values[0][KERNEL_COLUMN]) and values[0]["kernel_sampled_steps"] == 0
    assert values[1][KERNEL_COLUMN] == pytest.approx(3e-4)
    assert values[1]["kernel_sampled_steps"] == 2
    assert values[2][KERNEL_COLUMN] == pytest.approx(6e-4)  # the slower kernels of window 1
    monitor.close()
    timer.stop()
