"""One rank of a real 2-rank gloo pipeline (``PipelineStage`` + ``Schedule1F1B``, 4
microbatches) traced by :func:`~laggard.integrations.trace_sources.instrument_pipeline`;
launched by test_pipeline_trace.py with ``python -m torch.distributed.run``. Writes
``rank<R>.json`` into the directory in argv[1].

Stage 0 sleeps ``DELAY`` seconds in each microbatch's forward, so stage 1 waits for every
activation: its exposed P2P wait is at least ``MICROBATCHES * DELAY`` per step, for peer 0. The
job trains twice from the same seed, traced (with a TrainingMonitor on the wall clock) and
after ``undo()`` untraced, and the losses are compared bitwise.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, schedules

from laggard.integrations.monitor import TrainingMonitor
from laggard.integrations.trace_sources import instrument_pipeline
from laggard.integrations.tracer import CollectiveTracer

STEPS = 6
MICROBATCHES = 4
DELAY = 0.02


class Sleepy(torch.nn.Module):
    """Stage 0: a linear layer that sleeps before it computes."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(16, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(DELAY)
        return torch.relu(self.lin(x))


def stage_module(stage: int) -> torch.nn.Module:
    torch.manual_seed(stage)
    return Sleepy() if stage == 0 else torch.nn.Linear(32, 4)


def train(pp: dist.ProcessGroup, stage: int, monitor: TrainingMonitor | None) -> list[float]:
    module = stage_module(stage)
    pipe = PipelineStage(module, stage, 2, torch.device("cpu"), group=pp)
    schedule = Schedule1F1B(pipe, n_microbatches=MICROBATCHES,
                            loss_fn=lambda out, y: (out - y).square().mean())
    opt = torch.optim.SGD(module.parameters(), lr=0.05)
    losses: list[float] = []
    for step in range(STEPS):
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
        if monitor is not None:
            with monitor.step():
                with monitor.phase("forward_backward"):
                    losses += _step(schedule, stage, x, y)
                with monitor.phase("optimizer"):
                    opt.step()
                    opt.zero_grad()
        else:
            losses += _step(schedule, stage, x, y)
            opt.step()
            opt.zero_grad()
    return losses


def _step(schedule: Schedule1F1B, stage: int, x: torch.Tensor, y: torch.Tensor) -> list[float]:
    if stage == 0:
        schedule.step(x)
        return []
    out: list[torch.Tensor] = []
    schedule.step(target=y, losses=out)
    return [float(v) for v in out]


def main() -> int:
    out_dir = sys.argv[1]
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("pp",))
    pp = mesh["pp"].get_group()
    originals = (schedules._batch_p2p, schedules._wait_batch_p2p)
    tracer = CollectiveTracer()  # after the mesh: it watches the pipeline's group
    handle = instrument_pipeline(tracer)
    again = instrument_pipeline(tracer)
    installed = (bool(handle), bool(again))
    wrapped = (schedules._batch_p2p, schedules._wait_batch_p2p)
    monitor = TrainingMonitor(TrainingMonitor.Config(window_steps=3, phase_clock="wall"),
                              tracer=tracer)
    steps = []
    original_take = tracer.take_step

    def take_step():  # keep every step's summary for the test
        step = original_take()
        steps.append({"p2p_wait": step.p2p_wait_seconds,
                      "by_peer": {str(k): v for k, v in step.p2p_wait_by_peer.items()},
                      "ops": {op: [int(c), s, int(b)] for g in step.groups.values()
                              for op, (c, s, b) in g.by_op.items()},
                      "p2p_seconds": step.p2p_seconds, "total": step.total_seconds,
                      "group_seconds": sum(g.seconds for g in step.groups.values())})
        return step

    tracer.take_step = take_step  # type: ignore[method-assign]
    traced = train(pp, mesh["pp"].get_local_rank(), monitor)
    monitor.close()
    undone = handle.undo()
    restored = (schedules._batch_p2p, schedules._wait_batch_p2p)
    baseline = train(pp, mesh["pp"].get_local_rank(), None)
    names = list(monitor.windows[0].columns) if monitor.windows else []
    doc = {
        "rank": rank,
        "installed": installed[0], "again_installed": installed[1],
        "wrapped_once": wrapped[0] is not originals[0]
        and getattr(wrapped[0], "__wrapped__", None) is originals[0],
        "undone": undone, "restored": restored == originals,
        "traced": traced, "baseline": baseline,
        "steps": steps,
        "stats": dict(tracer.stats),
        "progress": [[p.group, p.peer, p.issued, p.completed, p.op] for p in tracer.progress()],
        "monitor_errors": monitor.stats.internal_errors,
        "windows": [{n: w.table([n])[:, 0].tolist() for n in names
                     if n in ("p2p_wait_seconds", "compute_seconds", "step_seconds")}
                    for w in monitor.windows],
    }
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(doc, f)
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
