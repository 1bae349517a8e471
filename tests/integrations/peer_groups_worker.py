"""One rank of a real 4-rank gloo job with two peer groups of different work; launched by
test_peer_groups_job.py with ``python -m torch.distributed.run``. Writes ``rank<R>.json`` into
the directory in argv[1].

Ranks 0, 1 form group 0 and ranks 2, 3 group 1, each with its own gradient all-reduce (a
pipeline's data-parallel groups). Group 1's forward does 1.5x group 0's work per step (a heavier
stage), and rank 1 is 1.3x slower than its peer. The work is a sleep, so the 2-core machine's
scheduler cannot blur it. The monitor runs with ``Config(peer_groups=...)``. Before that the
same ranks build ``init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "dp"))`` and a monitor
with ``mesh=``, and check that both ways of giving groups at once raise.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from laggard.integrations.monitor import TrainingMonitor

GROUPS = [[0, 1], [2, 3]]
WINDOW_STEPS = 4
STEPS = 4 * 16
WORK_SECONDS = {0: 0.012, 1: 0.018}  # per group: group 1 is the heavier stage
SLOW_RANK, SLOW_FACTOR = 1, 1.3


def quiet_config(**kwargs: object) -> TrainingMonitor.Config:
    return TrainingMonitor.Config(agent_address="", heartbeat_seconds=0, hang_store_seconds=0,
                                  **kwargs)


def mesh_checks() -> dict:
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "dp"))
    monitor = TrainingMonitor(quiet_config(detect=False), mesh=mesh)
    groups = monitor.peer_groups
    out = {"groups": [list(g) for g in groups.groups], "names": list(groups.names),
           "stages": list(groups.stages), "source": groups.source}
    monitor.close()
    try:
        TrainingMonitor(quiet_config(detect=False, peer_groups=GROUPS), mesh=mesh)
        out["both"] = "accepted"
    except ValueError as exc:
        out["both"] = str(exc)
    return out


def main(out_dir: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = mesh_checks()
    # every rank creates every group, in the same order (new_group is collective)
    pgs = [dist.new_group(g, backend="gloo") for g in GROUPS]
    group = 0 if rank in GROUPS[0] else 1
    work = WORK_SECONDS[group] * (SLOW_FACTOR if rank == SLOW_RANK else 1.0)
    monitor = TrainingMonitor(quiet_config(window_steps=WINDOW_STEPS, peer_groups=GROUPS,
                                           phase_clock="wall"))
    torch.manual_seed(rank)
    weight = torch.randn(64, 64)
    grad = torch.zeros(64, 64)
    for _ in range(STEPS):
        with monitor.step():
            with monitor.phase("forward"):
                time.sleep(work)
                grad.copy_(weight @ weight.T)
            with monitor.phase("collective_wait"):
                dist.all_reduce(grad, group=pgs[group])
    monitor.wait_analysed()  # rank 0 analyses on a thread: its last window too
    participant = monitor.participant("straggler")
    result = {
        "rank": rank, "mesh": mesh,
        "findings": [f.to_dict() for f in monitor.findings],
        "detectors": sorted(participant.detectors),
        "errors": monitor.stats.internal_errors + monitor.stats.gather_errors,
    }
    monitor.close()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.barrier()
    for pg in pgs:
        dist.destroy_process_group(pg)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
    sys.stdout.flush()  # torn down: now skip the C++ static destructors, where gloo's
    os._exit(0)  # threads abort a rank 1 run in 20 (ENVIRONMENT.md; demo/worker.py)
