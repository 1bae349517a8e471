"""One rank of a real 4-rank gloo DDP job monitored as the README shows (wall clock,
``CommTimer``), with a fault shape injected from step :data:`ONSET` on; launched by
test_blame_job.py (and the source of tests/fixtures/blame/) through ``torch.distributed.run``.

Usage: ``stall_worker.py OUT_DIR SHAPE STEPS`` with SHAPE one of

* ``clean``;
* ``stall:R:N:S``: rank R sleeps S seconds in its forward on every N-th step (a host daemon, a
  data-loader hiccup, a GPU stalling: a wait the others spend at the collective);
* ``two:R1,R2:N:S``: ranks R1 and R2 each sleep S once every N steps, half a period apart;
* ``burst:R:K:M:S``: rank R sleeps S seconds on K consecutive steps of every M.

Ranks 2r and 2r + 1 are on node ``node-r`` (``Config(node=...)``). Rank 0 writes
``result.json`` (the findings raised and cleared) and ``windows.jsonl`` (its gathered windows).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from laggard.integrations import CommTimer, TrainingMonitor, allreduce_timing_hook

ONSET = 100
WINDOW = 20


def pause(shape: str, rank: int, step: int) -> float:
    """Seconds rank ``rank`` sleeps at ``step`` under ``shape`` (module docstring)."""
    kind, *a = shape.split(":")
    if step < ONSET or kind == "clean":
        return 0.0
    if kind == "stall":
        return float(a[2]) if rank == int(a[0]) and step % int(a[1]) == 0 else 0.0
    if kind == "two":
        first, second = (int(r) for r in a[0].split(","))
        every = int(a[1])
        hit = (rank == first and step % every == 0) or \
            (rank == second and step % every == every // 2)
        return float(a[2]) if hit else 0.0
    if kind == "burst":
        return float(a[3]) if rank == int(a[0]) and step % int(a[2]) < int(a[1]) else 0.0
    raise ValueError(f"unknown shape {shape!r}")


def main(out: str, shape: str, steps: int) -> None:
    logging.basicConfig(level=logging.WARNING)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 256))
    ddp = DistributedDataParallel(model)
    timer = CommTimer()
    ddp.register_comm_hook(timer, allreduce_timing_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    monitor = TrainingMonitor(TrainingMonitor.Config(
        agent_address="", window_steps=WINDOW, node=f"node-{rank // 2}",
        heartbeat_seconds=0, hang_store_seconds=0,
        windows_path=f"{out}/windows.jsonl" if rank == 0 else None), comm_timer=timer)
    for step in range(steps):
        with monitor.step():
            with monitor.phase("data"):
                x = torch.randn(64, 256)
            with monitor.phase("forward"):
                seconds = pause(shape, rank, step)
                if seconds:
                    time.sleep(seconds)
                loss = ddp(x).pow(2).mean()
            with monitor.phase("backward"):
                loss.backward()
            with monitor.phase("optimizer"):
                opt.step()
                opt.zero_grad()
    monitor.wait_analysed()
    if rank == 0:
        doc = {"raised": [f.to_dict() for f in monitor.findings],
               "cleared": [f.to_dict() for f in monitor.cleared]}
        with open(f"{out}/result.json", "w") as f:
            json.dump(doc, f, default=str)
    monitor.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
    sys.stdout.flush()  # torn down: now skip the C++ static destructors, where gloo's
    os._exit(0)  # threads abort a rank now and then ("terminate called"; ENVIRONMENT.md)
