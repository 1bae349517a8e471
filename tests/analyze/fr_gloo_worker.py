"""Make a real flight-recorder dump set from a gloo job with one rank held up.

Run as ``python fr_gloo_worker.py OUT_DIR SCENARIO PORT`` (4 ranks, spawned here). Every rank
records with ``TORCH_FR_BUFFER_SIZE``, runs a few steps of collectives on the default group and
a subgroup (or a pipeline of sends/receives), then the culprit rank stops issuing while the
others issue the next operation asynchronously; every rank then writes its recorder with
``torch._C._distributed_c10d._dump_fr_trace`` to ``OUT_DIR/rank_<r>`` (PyTorch's own naming:
``TORCH_FR_DUMP_TEMP_FILE`` + rank), and the culprit finally issues its part so the job exits
cleanly.

Scenarios: ``hung_cpu`` (rank 2 stops before an all-reduce of the default group),
``subgroup`` (rank 3 stops before an all-gather of the group {1, 3}), ``pipeline`` (a 4-stage
send/recv chain; stage 2 stops receiving).
"""

from __future__ import annotations

import os
import sys
import time

from laggard.demo.harness import scaled

WORLD = 4
STEPS = 5


def _barrier_files(out: str, rank: int, name: str) -> None:
    # A file barrier: the recorder must be dumped while the others' operation is pending,
    # and a collective barrier would itself be recorded (and block on the held-up rank).
    open(os.path.join(out, f".{name}.{rank}"), "w").close()
    deadline = time.time() + scaled(60)
    while time.time() < deadline:
        if all(os.path.exists(os.path.join(out, f".{name}.{r}")) for r in range(WORLD)):
            return
        time.sleep(0.05)
    raise TimeoutError(name)


def _dump(out: str, rank: int, settled: bool = False) -> None:
    """Write this rank's recorder; with ``settled``, first wait (up to 20 s) until every
    collective it issued shows as completed: gloo marks completion from another thread, and on
    a loaded machine the held-up rank's last finished all-reduce could still read as pending."""
    import torch

    deadline = time.time() + scaled(20)
    while True:
        data = torch._C._distributed_c10d._dump_fr_trace(includeCollectives=True,
                                                         includeStackTraces=False)
        if not settled or _all_completed(data) or time.time() > deadline:
            break
        time.sleep(0.1)
    with open(os.path.join(out, f"rank_{rank}"), "wb") as f:
        f.write(data)


def _all_completed(data: bytes) -> bool:
    import pickle

    status = pickle.loads(data).get("pg_status", {})
    return all(s.get("last_enqueued_collective") == s.get("last_completed_collective")
               for s in status.values())


def run(rank: int, out: str, scenario: str, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                      TORCH_FR_BUFFER_SIZE="2000")
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    sub = dist.new_group([1, 3], group_desc="EXPERT_GROUP")
    x = torch.ones(256)
    culprit = {"hung_cpu": 2, "subgroup": 3, "pipeline": 2}[scenario]
    for _ in range(STEPS):
        if scenario == "pipeline":
            _pipeline_step(rank, x, dist, hold=False)
        else:
            dist.all_reduce(x)
            if rank in (1, 3):
                dist.all_gather_single(torch.empty(512), x, group=sub)
    pending = None
    if rank != culprit:
        if scenario == "hung_cpu":
            pending = [dist.all_reduce(x, async_op=True)]
        elif scenario == "subgroup" and rank == 1:
            pending = [dist.all_gather_single(torch.empty(512), x, group=sub,
                                                   async_op=True)]
        elif scenario == "pipeline":
            pending = _pipeline_step(rank, x, dist, hold=True)
    time.sleep(0.5)
    _dump(out, rank, settled=rank == culprit)
    _barrier_files(out, rank, "dumped")
    if rank == culprit:  # let go: issue what the others wait for
        if scenario == "hung_cpu":
            dist.all_reduce(x)
        elif scenario == "subgroup":
            dist.all_gather_single(torch.empty(512), x, group=sub)
        else:
            _pipeline_step(rank, x, dist, hold=False)
    for work in pending or []:
        work.wait()
    dist.barrier()
    dist.destroy_process_group()


def _pipeline_step(rank: int, x, dist, hold: bool) -> list:
    # stage r receives from r-1 and sends to r+1; with hold, stage 2 issues nothing
    works = []
    if rank > 0:
        works.append(dist.irecv(x, src=rank - 1))
    if rank < WORLD - 1:
        works.append(dist.isend(x.clone(), dst=rank + 1))
    if not hold:
        for w in works:
            w.wait()
        return []
    return works


def main() -> None:
    out, scenario, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    os.makedirs(out, exist_ok=True)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch.multiprocessing as mp

    mp.spawn(run, args=(out, scenario, port), nprocs=WORLD, join=True)


if __name__ == "__main__":
    main()
