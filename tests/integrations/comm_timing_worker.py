"""One rank of a real gloo DDP job timed by CommTimer; launched by test_monitor.py through
``python -m torch.distributed.run``. Writes ``rank<R>.json`` into the directory given as argv[1].

From step 2 on, the last rank sleeps ``DELAY`` seconds between forward and backward, so the other
ranks' collectives must wait for it: their exposed communication time must contain the delay and
the late rank's must not. Each rank also checks DDP's averaged gradients against the mean of
every rank's local gradients, computed here without DDP.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from laggard.integrations.comm_timing import CommTimer, allreduce_timing_hook

DELAY = 0.3
STEPS = 5


def batch(rank: int, step: int) -> torch.Tensor:
    return torch.randn(16, 32, generator=torch.Generator().manual_seed(1000 * step + rank))


def main(out_dir: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 8),
    )
    local = [p.detach().clone() for p in model.parameters()]
    # bucket_cap_mb small enough that the ~0.3 MB of gradients spread over several buckets
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.1)
    timer = CommTimer()
    ddp.register_comm_hook(timer, allreduce_timing_hook)
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    steps = []
    for step in range(STEPS):
        ddp.zero_grad(set_to_none=True)
        # expected gradient: the mean over ranks of each rank's local gradient
        expected = [torch.zeros_like(p) for p in local]
        for r in range(world):
            params = [p.clone().requires_grad_(True) for p in local]
            x = batch(r, step)
            for i in range(0, len(params), 2):
                x = torch.nn.functional.linear(x, params[i], params[i + 1])
                if i + 2 < len(params):
                    x = torch.relu(x)
            x.square().mean().backward()
            for e, p in zip(expected, params, strict=True):
                e += p.grad / world
        loss = ddp(batch(rank, step)).square().mean()
        if step >= 2 and rank == world - 1:
            time.sleep(DELAY)
        loss.backward()
        comm = timer.take_step()
        grads_match = all(
            torch.allclose(p.grad, e, rtol=1e-5, atol=1e-7)
            for p, e in zip(model.parameters(), expected, strict=True)
        )
        steps.append({
            "collectives": [[c.op, c.seconds, c.bytes] for c in comm.collectives],
            "total": comm.total_seconds, "exposed": comm.exposed_seconds,
            "hidden": comm.hidden_seconds, "bytes": comm.bytes, "raw_bytes": comm.raw_bytes,
            "grads_match": grads_match,
        })
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.01 * p.grad
        local = [p.detach().clone() for p in model.parameters()]
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "world_size": world, "grad_bytes": grad_bytes,
                   "dropped": timer.dropped, "steps": steps}, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
    sys.stdout.flush()  # torn down: now skip the C++ static destructors, where gloo's
    os._exit(0)  # threads abort a rank 1 run in 20 (ENVIRONMENT.md; demo/worker.py)
