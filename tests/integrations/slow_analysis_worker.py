"""One rank of a real 4-rank gloo job whose rank-0 analysis is slow on purpose; launched by
test_window_analysis_job.py through ``python -m torch.distributed.run``.

Usage: ``slow_analysis_worker.py OUT_DIR``. After an untimed warm-up, three phases, each with
a monitor of its own built at the same point on every rank, the same steps (a matmul, then an
``all_reduce`` that makes every rank wait for the slowest, as a data-parallel job's gradient
sync does):

* ``base``: the monitor with no participant of the test's own;
* ``thread``: a :class:`SlowParticipant` whose ``on_window`` sleeps ``3 x`` a window's
  duration (rank 0's base median step ``x window_steps``) on rank 0, run on rank 0's analysis
  thread; rank :data:`NAN_RANK` sends a row of NaNs at window :data:`NAN_WINDOW`;
* ``inline``: the same participant marked ``inline``: the analysis back on the training thread,
  the control that shows the step-time ratio can fail.

Each rank writes ``rank-R.json``: per phase, the loop's wall seconds and each step's (the
gather and what runs on the training thread after it fall in the window's last step); rank 0
adds its monitor's counters and findings per phase.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from laggard.detectors.finding import Finding, Severity
from laggard.detectors.window import WindowRecord
from laggard.integrations.monitor import TrainingMonitor
from laggard.integrations.participants import WindowOutcome, WindowParticipant

STEPS = 60
WINDOW = 5
NAN_RANK = 2
NAN_WINDOW = 3
SIZE = 160


class SlowParticipant(WindowParticipant):
    """Sleeps ``seconds`` in ``on_window`` on rank 0 and reports one finding per window it
    analysed (kind ``slow_analysis``)."""

    name = "slow"

    def __init__(self, seconds: float, inline: bool) -> None:
        super().__init__()
        self.seconds = seconds
        self.inline = inline

    def on_window(self, record: WindowRecord) -> WindowOutcome | None:
        if self.context is None or self.context.rank != 0:
            return None
        time.sleep(self.seconds)
        return WindowOutcome(findings=[Finding(
            detector="slow", kind="slow_analysis", severity=Severity.INFO, step=record.step,
            message=f"analysed window {record.step} after {self.seconds:.3f} s")])


def run_phase(phase: str, sleep: float) -> tuple[float, list[float], TrainingMonitor]:
    """Every rank: one monitored loop; returns its wall seconds, its step seconds, the
    (closed) monitor."""
    participants = [] if phase == "base" else [SlowParticipant(sleep, phase == "inline")]
    monitor = TrainingMonitor(TrainingMonitor.Config(
        agent_address="", window_steps=WINDOW, heartbeat_seconds=0, hang_store_seconds=0,
        gc_timing=False), participants=participants)
    rank = dist.get_rank()
    if phase == "thread" and rank == NAN_RANK:
        table, real = monitor._table, monitor._table.summary  # noqa: SLF001 - a broken rank
        table.summary = lambda: (  # type: ignore[method-assign]
            {k: math.nan for k in real()} if monitor.step_index == NAN_WINDOW * WINDOW
            else real())
    a, b = torch.randn(SIZE, SIZE), torch.randn(SIZE, SIZE)
    grad = torch.zeros(1024)
    steps: list[float] = []
    dist.barrier()
    start = time.perf_counter()
    for _ in range(STEPS):
        t0 = time.perf_counter()
        with monitor.step():
            with monitor.phase("forward"):
                for _ in range(4):
                    a = torch.tanh(a @ b)
            with monitor.phase("collective_wait"):
                dist.all_reduce(grad)
        steps.append(time.perf_counter() - t0)
    wall = time.perf_counter() - start
    dist.barrier()
    monitor.close()
    return wall, steps, monitor


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    rank = dist.get_rank()
    doc: dict[str, object] = {}
    sleep = 0.0
    run_phase("base", sleep)  # warm-up: the first loop's allocations and gloo's first calls
    for phase in ("base", "thread", "inline"):
        wall, steps, monitor = run_phase(phase, sleep)
        entry: dict[str, object] = {"wall_seconds": wall, "step_seconds": steps}
        if phase == "base":
            # the slow analysis takes three windows' time: two in three windows coalesced
            sleep = 3 * WINDOW * sorted(steps)[len(steps) // 2]
            entry["sleep"] = sleep
        if rank == 0:
            stats = monitor.stats
            entry.update(
                windows=stats.windows, analysed=stats.windows_analysed,
                coalesced=stats.windows_coalesced, bad_rows=stats.bad_rows,
                internal_errors=stats.internal_errors,
                analysis_seconds=stats.analysis_seconds,
                findings=[f.to_dict() for f in monitor.findings],
                kept_windows=len(monitor.windows), summaries=len(monitor.window_summaries))
        doc[phase] = entry
    (out / f"rank-{rank}.json").write_text(json.dumps(doc, indent=1))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    sys.stdout.flush()  # torn down: now skip the C++ static destructors, where gloo's
    os._exit(0)  # threads abort a rank 1 run in 20 (ENVIRONMENT.md; demo/worker.py)
