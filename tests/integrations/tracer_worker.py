"""One rank of a real 3-rank gloo job traced by CollectiveTracer; launched by test_tracer.py with
``python -m torch.distributed.run``. Writes ``rank<R>.json`` into the directory in argv[1].

Trains the same small model twice from the same seed, FSDP2 (``fully_shard``) without and with
the tracer (and a TrainingMonitor with a 4-step window), and compares the losses bitwise. From
step 2 the last rank sleeps before each forward, so the others wait for it in the first
all-gather: it must arrive last. Also times a DDP job through ``CommTimer(tracer=...)``, an
``async_op=True`` all-reduce through ``track``, and feeds the tracer bad input: a group created
after it and a group this rank is not in.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel

from laggard.integrations.comm_timing import CommTimer, allreduce_timing_hook
from laggard.integrations.monitor import TrainingMonitor
from laggard.integrations.trace_sources import attach, instrument_fsdp
from laggard.integrations.tracer import CollectiveTracer

STEPS = 8
DELAY = 0.05


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                               torch.nn.ReLU(), torch.nn.Linear(64, 4))


def train_fsdp(tracer: CollectiveTracer | None, monitor: TrainingMonitor | None) -> list[float]:
    rank, world = dist.get_rank(), dist.get_world_size()
    model = make_model()
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    if tracer is not None:
        assert instrument_fsdp(model, tracer) == 4
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for step in range(STEPS):
        x = torch.randn(8, 32, generator=torch.Generator().manual_seed(100 * step + rank))
        if step >= 2 and rank == world - 1:
            time.sleep(DELAY)
        if monitor is not None:
            with monitor.step():
                with monitor.phase("forward"):
                    loss = model(x).square().mean()
                with monitor.phase("backward"):
                    loss.backward()
                with monitor.phase("optimizer"):
                    opt.step()
                    opt.zero_grad()
        else:
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
        losses.append(loss.item())
    return losses


def main(out_dir: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    pair = dist.new_group([0, 1])  # rank 2 is not in it
    tracer = CollectiveTracer(groups=None)
    sources = attach(tracer)
    baseline = train_fsdp(None, None)
    monitor = TrainingMonitor(TrainingMonitor.Config(agent_address="", window_steps=4),
                              tracer=tracer)
    traced_steps = []
    traced = train_fsdp(tracer, monitor)
    monitor.wait_analysed()  # rank 0 analyses on a thread: the last window's group waits
    trace = monitor.participant("trace")
    last = trace.last_step
    traced_steps.append({"ops": {c.op: [c.seconds, c.bytes] for c in last.collectives},
                         "exposed": last.exposed_seconds, "total": last.total_seconds})
    groups = [(label, gw.ranks.tolist(), gw.arrived_last.tolist(), gw.steps)
              for label, gw in trace.groups]
    probe = monitor.participant("link_probe").seconds

    # DDP through CommTimer(tracer=...)
    timer = CommTimer(tracer=tracer)
    ddp = DistributedDataParallel(make_model(), bucket_cap_mb=0.01)
    ddp.register_comm_hook(timer, allreduce_timing_hook)
    ddp(torch.randn(4, 32)).sum().backward()
    timer.take_step()
    ddp_step = tracer.take_step()

    # an async collective's Work future, and bad input
    work = dist.all_reduce(torch.ones(1000), async_op=True)
    tracer.track(work, "allreduce", None, 8000)
    work.wait()
    time.sleep(0.05)
    late = dist.new_group([0, 1, 2])
    dist.all_reduce(torch.ones(10), group=late)
    tracer.track(dist.all_reduce(torch.ones(10), group=late, async_op=True), "allreduce", late, 80)
    outsider = CollectiveTracer(groups=[pair])  # rank 2: NON_GROUP_MEMBER
    async_step = tracer.take_step()
    result = {
        "rank": rank, "world": world, "baseline": baseline, "traced": traced,
        "sources": sources, "groups_watched": [list(g.ranks) for g in tracer.groups],
        "last_step": traced_steps[-1], "group_waits": groups, "probe": probe,
        "findings": [f.to_dict() for f in monitor.findings],
        "ddp_ops": {c.op: c.bytes for c in ddp_step.collectives},
        "async_ops": {c.op: c.bytes for c in async_step.collectives},
        "stats": tracer.stats, "outsider_stats": outsider.stats,
        "monitor_errors": monitor.stats.internal_errors + monitor.stats.gather_errors,
    }
    monitor.close()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    # Every rank done with every group before any is destroyed: without it gloo aborts a rank
    # at exit now and then ("terminate called without an active exception", ENVIRONMENT.md).
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
    sys.stdout.flush()  # torn down: now skip the C++ static destructors, where gloo's
    os._exit(0)  # threads abort a rank 1 run in 20 (ENVIRONMENT.md; demo/worker.py)
