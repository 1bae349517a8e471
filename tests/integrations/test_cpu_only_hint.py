"""A CPU-only job's compute finding does not send the reader to "that GPU's clocks" (issue 35,
part 4): the monitor tells the straggler participant the job has no CUDA device."""

from __future__ import annotations

import numpy as np

from laggard.detectors.straggler import CPU_COMPUTE_HINT, GPU_COMPUTE_HINT, StragglerDetector
from laggard.detectors.window import WindowRecord
from laggard.integrations.participants import MonitorContext, StragglerParticipant

WORLD = 8


def window(index: int, slow_rank: int = 5, factor: float = 1.2) -> WindowRecord:
    rng = np.random.default_rng(index)
    compute = 0.1 * rng.lognormal(0, 0.01, WORLD)
    compute[slow_rank] *= factor
    data = np.full(WORLD, 0.002)
    wait = compute.max() - compute + 0.002
    return WindowRecord(step=20 * index + 19, ranks=np.arange(WORLD), world_size=WORLD,
                        columns={"compute_seconds": compute, "data_seconds": data,
                                 "collective_wait_seconds": wait,
                                 "transfer_seconds": np.full(WORLD, np.nan),
                                 "step_seconds": np.full(WORLD, compute.max() + 0.005)})


def compute_messages(participant: StragglerParticipant) -> list[str]:
    participant.attach(MonitorContext(
        rank=0, world_size=WORLD, node="n0", local_rank=0, window_steps=20,
        group=lambda: None, log_once=lambda *a: None, count_error=lambda where, exc: None))
    messages = []
    for i in range(16):
        outcome = participant.on_window(window(i))
        messages += [f.message for f in (outcome.findings if outcome else [])
                     if f.kind == "compute" and not f.cleared]
    return messages


def test_a_cpu_only_job_is_told_to_check_the_ranks_cpu() -> None:
    (message, *_) = compute_messages(StragglerParticipant(cpu_only=True))
    assert "rank 5" in message and CPU_COMPUTE_HINT in message
    assert "GPU" not in message


def test_a_gpu_job_keeps_the_gpu_hint_and_a_hint_of_ones_own_is_kept() -> None:
    (message, *_) = compute_messages(StragglerParticipant())
    assert GPU_COMPUTE_HINT in message
    own = StragglerDetector.Config(compute_hint="check the demo's injection")
    (message, *_) = compute_messages(StragglerParticipant(own, cpu_only=True))
    assert "check the demo's injection" in message and CPU_COMPUTE_HINT not in message
