"""One rank of a real 4-rank gloo DDP job whose host gets busy mid-run; launched by
test_host_context.py through ``python -m torch.distributed.run``.

Usage: ``host_contention_worker.py OUT_DIR``. After :data:`WARM_WINDOWS` windows rank 0 writes
``OUT_DIR/warm`` and waits (bounded) for the test to start CPU hogs beside the job and write
``OUT_DIR/hogs`` (the other ranks wait in the next collective); then every rank runs
:data:`HOG_WINDOWS` more windows. Phases are timed on the wall clock (the default on CPU), so
the CPU the hogs take shows as a slower job. Rank 0 writes ``result.json``: the findings raised
and every window's host columns and median compute per rank.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from laggard.detectors.host_contention import HOST_CONTEXT_COLUMN_NAMES
from laggard.integrations.comm_timing import CommTimer, allreduce_timing_hook
from laggard.integrations.monitor import TrainingMonitor

WINDOW = 10
#: Windows before the hogs: the detector's warm-up (5) and a clean baseline.
WARM_WINDOWS = 10
#: Windows with the hogs: the slowdown needs 3 windows over its threshold once its history of
#: 5 windows has moved.
HOG_WINDOWS = 12
#: Ceiling of rank 0's wait for the test's hogs (scaled by the test's load factor, passed in).
HOG_WAIT_SECONDS = 60.0


def main(out: Path, wait_scale: float) -> None:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(name)s %(levelname)s %(message)s")
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 256))
    ddp = DistributedDataParallel(model)
    timer = CommTimer()
    ddp.register_comm_hook(timer, allreduce_timing_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    monitor = TrainingMonitor(TrainingMonitor.Config(
        agent_address="", window_steps=WINDOW, heartbeat_seconds=0, hang_store_seconds=0),
        comm_timer=timer)
    x = torch.randn(64, 256)
    for step in range((WARM_WINDOWS + HOG_WINDOWS) * WINDOW):
        if step == WARM_WINDOWS * WINDOW and rank == 0:
            (out / "warm").write_text(str(step))
            deadline = time.monotonic() + HOG_WAIT_SECONDS * wait_scale
            while not (out / "hogs").exists() and time.monotonic() < deadline:
                time.sleep(0.01)
        with monitor.step():
            with monitor.phase("forward"):
                loss = F.mse_loss(ddp(x), x)
            with monitor.phase("backward"):
                loss.backward()
            with monitor.phase("optimizer"):
                opt.step()
                opt.zero_grad(set_to_none=True)
    monitor.wait_analysed()
    if rank == 0:
        doc = {
            "raised": [f.to_dict() for f in monitor.findings],
            "host_stats": dict(monitor.participant("host_context").stats),
            "windows": [{"step": w.step, "nodes": list(w.nodes or []),
                         **{name: [None if v != v else float(v) for v in w[name]]
                            for name in (*HOST_CONTEXT_COLUMN_NAMES, "compute_seconds")}}
                        for w in monitor.windows],
        }
        (out / "result.json").write_text(json.dumps(doc, indent=1))
    monitor.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), float(sys.argv[2]))
    sys.stdout.flush()  # torn down: now skip the C++ static destructors, where gloo's
    os._exit(0)  # threads abort a rank 1 run in 20 (ENVIRONMENT.md; demo/worker.py)
