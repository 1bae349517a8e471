"""Write real PyTorch profiler (Kineto) traces of a small gloo DDP job, one file per rank.

Run as ``python kineto_gloo_worker.py OUT_DIR WORLD SLOW_RANK PORT [SECONDS] [GZIP]``: WORLD
ranks train an MLP with DDP on gloo under ``torch.profiler`` (schedule: 1 wait, 1 warm-up, 6
active steps); SLOW_RANK (-1: none) waits SECONDS for each batch (a slow data loader, in a
``record_function("data_wait")`` range): its gradients arrive last and the others wait for it
in the all-reduce. A sleep, not extra compute, because this machine has fewer cores than
ranks: compute added on one rank would steal the others' CPU and slow them too. Traces are
written in ``tensorboard_trace_handler``'s naming (``rank<r>.pt.trace.json``, gzipped when
GZIP is 1).
"""

from __future__ import annotations

import os
import sys


def run(rank: int, world: int, out: str, slow_rank: int, seconds: float, port: int,
        gz: bool) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import time

    import torch
    import torch.distributed as dist
    from torch import nn

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                          nn.Linear(512, 10))
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
    delay = seconds if rank == slow_rank else 0.0

    def handler(prof: torch.profiler.profile) -> None:
        name = os.path.join(out, f"rank{rank}.pt.trace.json" + (".gz" if gz else ""))
        prof.export_chrome_trace(name)

    schedule = torch.profiler.schedule(wait=1, warmup=1, active=6)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                schedule=schedule, on_trace_ready=handler) as prof:
        for _ in range(8):
            opt.zero_grad()
            if delay:
                with torch.profiler.record_function("data_wait"):
                    time.sleep(delay)
            loss = nn.functional.cross_entropy(ddp(x), y)
            loss.backward()
            opt.step()
            prof.step()
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    out, world, slow_rank, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), \
        int(sys.argv[4])
    seconds = float(sys.argv[5]) if len(sys.argv) > 5 else 0.05
    gz = len(sys.argv) > 6 and sys.argv[6] == "1"
    os.makedirs(out, exist_ok=True)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch.multiprocessing as mp

    mp.spawn(run, args=(world, out, slow_rank, seconds, port, gz), nprocs=world, join=True)


if __name__ == "__main__":
    main()
