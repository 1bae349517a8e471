"""One rank of a real 3-rank gloo DDP job whose rank :data:`SLOW_RANK` does twice the compute,
sending to a node agent's socket; launched by test_agent_restart.py through
``python -m torch.distributed.run``.

Usage: ``level_worker.py SOCKET STOP_FILE RUN_ID``. The job trains until ``STOP_FILE`` exists
(rank 0 looks, every rank learns it through an all-reduce, so all stop at the same step), then
closes its monitor (rank 0's close tells the agent the run ended) and exits 0. Phases are timed
in thread CPU time: the ranks share the machine's cores, and CPU time is the work each did.
"""

from __future__ import annotations

import logging
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from laggard.demo.worker import detector_config
from laggard.integrations.comm_timing import CommTimer, allreduce_timing_hook
from laggard.integrations.monitor import TrainingMonitor

SLOW_RANK = 1
#: Steps to a window: short, so a window passes in well under a second on an idle machine.
WINDOW = 10
#: Seconds after which the job stops even with no stop file (a test that died left it).
MAX_SECONDS = 900.0


def main(socket_path: str, stop_file: str, run_id: str) -> None:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(name)s %(levelname)s %(message)s")
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 64))
    ddp = DistributedDataParallel(model)
    timer = CommTimer()
    ddp.register_comm_hook(timer, allreduce_timing_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    monitor = TrainingMonitor(
        TrainingMonitor.Config(agent_address=f"unix:{socket_path}", window_steps=WINDOW,
                               phase_clock="thread_cpu", run=run_id,
                               straggler=detector_config()),
        comm_timer=timer)
    repeats = 2 if rank == SLOW_RANK else 1
    generator = torch.Generator().manual_seed(rank)
    started = time.monotonic()
    stop = torch.zeros(1)
    while True:
        with monitor.step():
            with monitor.phase("data"):
                x = torch.randn(64, 64, generator=generator)
            with monitor.phase("forward"):
                for _ in range(repeats - 1):  # the slow rank's extra work: a forward more
                    with torch.no_grad():
                        model(x)
                loss = ddp(x).square().mean()
            with monitor.phase("backward"):
                loss.backward()
            with monitor.phase("optimizer"):
                opt.step()
                opt.zero_grad(set_to_none=True)
        stop.fill_(float(rank == 0 and (os.path.exists(stop_file)
                                        or time.monotonic() - started > MAX_SECONDS)))
        dist.all_reduce(stop)
        if stop.item():
            break
    monitor.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:4])
