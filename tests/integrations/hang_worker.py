"""One rank of a real gloo job that hangs (or is merely slow) on purpose; started by
test_hang_jobs.py, one process per rank (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT`` in the environment).

Usage: ``hang_worker.py OUT_DIR CONFIG_JSON`` with CONFIG keys ``scenario`` (``data``: the hung
rank blocks in its data loading; ``python``: it spins in pure Python in its forward; ``skip``:
it skips one all-reduce of the traced metrics group; ``long``: every rank spends ``long_seconds``
in a checkpoint phase once, and the job finishes), ``rank`` and ``step`` (who hangs, when),
``steps``, ``hang_seconds``, ``store_seconds``, ``agent`` (the intake the monitor sends to, ""
for none), ``step_sleep`` (seconds of emulated compute per step).

Rank 0's ``on_hang`` writes ``report.json``; the hung rank writes ``hang_start.json`` (wall
clock) before hanging; a job that finishes writes ``rank<R>.json`` with the heartbeat's stats.
The test kills every process at the end.
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
from torch.nn.parallel import DistributedDataParallel

from laggard.integrations.comm_timing import CommTimer, allreduce_timing_hook
from laggard.integrations.monitor import TrainingMonitor
from laggard.integrations.tracer import CollectiveTracer


def main(out: Path, cfg: dict) -> None:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(name)s %(levelname)s %(message)s")
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    metrics = dist.new_group(backend="gloo", group_desc="metrics")
    tracer = CollectiveTracer()
    scenario, hung_rank, hung_step = cfg["scenario"], cfg["rank"], cfg["step"]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    ddp = DistributedDataParallel(model)
    # skip: only the metrics group is traced, so the skipped all-reduce is the one behind
    timer = CommTimer(tracer=None if scenario == "skip" else tracer)
    ddp.register_comm_hook(timer, allreduce_timing_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)

    def on_hang(report) -> None:
        doc = {"time": time.time(), "ranks": list(report.ranks), "message": report.message,
               "step": report.step, "seconds_since_progress": report.seconds_since_progress,
               "culprits": [{"rank": c.rank, "kind": c.kind, "group": c.group, "seq": c.seq,
                             "op": c.op} for c in report.verdict.culprits]}
        tmp = out / "report.tmp"
        tmp.write_text(json.dumps(doc))
        tmp.rename(out / "report.json")

    config = TrainingMonitor.Config(
        agent_address=cfg["agent"], window_steps=5, run="hang-test", node=f"node{rank}",
        hang_store_seconds=cfg["store_seconds"], hang_seconds=cfg["hang_seconds"],
        on_hang=on_hang)
    monitor = TrainingMonitor(config, comm_timer=timer, tracer=tracer)

    def hang_here() -> None:
        (out / "hang_start.json").write_text(json.dumps({"time": time.time(), "pid": os.getpid()}))

    for step in range(cfg["steps"]):
        with monitor.step():
            with monitor.phase("data"):
                if scenario == "data" and rank == hung_rank and step == hung_step:
                    hang_here()
                    time.sleep(3600)  # a data loader that never returns
                x = torch.randn(8, 16, generator=torch.Generator().manual_seed(step * 7 + rank))
            with monitor.phase("forward"):
                if scenario == "python" and rank == hung_rank and step == hung_step:
                    hang_here()
                    spins = 0
                    while True:  # pure Python: the GIL is released every switch interval
                        spins += 1
                time.sleep(cfg["step_sleep"])
                loss = ddp(x).square().mean()
            with monitor.phase("backward"):
                loss.backward()
            with monitor.phase("optimizer"):
                opt.step()
                opt.zero_grad()
            if scenario == "skip":
                with monitor.phase("metrics"):
                    if rank == hung_rank and step == hung_step:
                        hang_here()  # skips this one; blocks in the next step's DDP all-reduce
                    else:
                        value = loss.detach().reshape(1).clone()
                        work = dist.all_reduce(value, group=metrics, async_op=True)
                        tracer.track(work, "allreduce", metrics, value.nbytes)
                        work.wait()
            if scenario == "long" and step == hung_step:
                with monitor.phase("checkpoint"):
                    time.sleep(cfg["long_seconds"])  # every rank: a long save, not a hang
    monitor.close()
    stats = monitor.stats.heartbeat
    (out / f"rank{rank}.json").write_text(json.dumps({
        "hangs_reported": stats.hangs_reported, "classifications": stats.classifications,
        "store_writes": stats.store_writes, "store_reads": stats.store_reads,
        "store_errors": stats.store_errors, "bad_keys": stats.bad_keys,
        "typical": monitor.typical_step_seconds()}))
    dist.barrier()
    dist.destroy_process_group(metrics)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), json.loads(sys.argv[2]))
