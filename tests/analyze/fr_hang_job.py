"""A real 8-rank gloo job (TP=2 x PP=2 x DP=2) that hangs one way, dumped by every rank.

Run as ``python fr_hang_job.py OUT_DIR SCENARIO PORT``: it starts the 8 ranks as processes,
waits until the fault has hung the job (or, for ``clean``, until every rank finished), makes
every rank write its flight recorder (``torch._C._distributed_c10d._dump_fr_trace``, the
recorder enabled by ``TORCH_FR_BUFFER_SIZE``) to ``OUT_DIR/rank_<r>`` (PyTorch's naming), then
kills the ranks. Every wait is bounded; a rank that outlives them is killed.

Layout: rank = 4 * stage + 2 * dp + tp; groups made with ``dist.new_group`` in the same order on
every rank: tensor-parallel pairs {0,1} {2,3} {4,5} {6,7} (desc ``tp``), data-parallel {0,2} {1,3}
{4,6} {5,7} (``dp``), pipeline {0,4} {1,5} {2,6} {3,7} (``pp``). A step: the data loader's batch,
a tp all-reduce (forward), the activation sent stage 0 -> 1 and the gradient 1 -> 0 (P2P on the
pp group), a tp all-reduce (backward), a dp all-reduce of the gradients, the optimizer (a sleep of
``OPTIMIZER_S``), an all-reduce of the loss on the default group.

Faults, at step ``FAULT_STEP`` (``SCENARIOS``): ``python`` (rank 1 spins in Python after its
forward: it stops issuing with nothing pending), ``data`` (rank 6's data-loader thread blocks, so
its training thread waits for a batch), ``skip`` (rank 2 skips one dp all-reduce and goes on),
``two`` (both rank 1's and rank 6's faults at once, in different groups), ``clean``.

gloo's recorder lists collectives only (no send/recv entries, and it leaves every ``state`` at
``scheduled``, marking ``retired``), and keys ``pg_config`` by an empty name. So that the set has
what an NCCL job's recorder would list, each rank appends its send/recv operations to its dump as
NCCL's recorder lists them (``send a->b`` / ``recv a<-b`` with group-local ranks, ``is_p2p``,
``p2p_seq_id``, ``retired`` from the real ``Work``), and fills ``pg_config`` with its groups.
The collectives, their counters and their completion are gloo's own.
"""

from __future__ import annotations

import datetime
import os
import pickle
import queue
import sys
import threading
import time

from laggard.demo.harness import scaled

WORLD = 8
STEPS = 2
FAULT_STEP = 2
#: scenario -> {rank: fault}
SCENARIOS: dict[str, dict[int, str]] = {
    "python": {1: "python"}, "data": {6: "data"}, "skip": {2: "skip"},
    "two": {1: "python", 6: "data"}, "clean": {},
}
#: Ceilings against a real hang, idle-machine seconds scaled by the load when the job starts.
JOB_TIMEOUT_S = scaled(150.0)
DUMP_TIMEOUT_S = scaled(60.0)
SETTLE_S = 3.0
#: The optimizer step between the dp all-reduce and the loss's: it orders the skip scenario's
#: waits (the skipping rank waits in the loss all-reduce well after its dp peer began waiting).
OPTIMIZER_S = 1.0
#: Two reads of the recorder this far apart must agree before a rank writes its dump: longer
#: than the optimizer step, so a rank still on its way to its wait is not dumped half-way.
STABLE_S = 1.5


def _touch(path: str) -> None:
    with open(path, "w"):
        pass


def _wait_for(paths: list[str], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(os.path.exists(p) for p in paths):
            return True
        time.sleep(0.05)
    return False


class P2PLog:
    """This rank's send/recv operations, to list them as NCCL's recorder would."""

    def __init__(self) -> None:
        self.ops: list[tuple[object, str, int, int, object, int, list[int], str]] = []
        self.seq: dict[str, int] = {}

    def record(self, group, kind: str, me: int, peer: int, work, sizes: list[int]) -> None:
        name = group.group_name
        self.seq[name] = self.seq.get(name, 0) + 1
        self.ops.append((group, kind, me, peer, work, time.time_ns(), sizes, name))

    def entries(self, first_id: int) -> list[dict]:
        out = []
        for i, (group, kind, me, peer, work, created, sizes, name) in enumerate(self.ops):
            op = f"send {me}->{peer}" if kind == "send" else f"recv {me}<-{peer}"
            out.append({
                "record_id": first_id + i, "pg_id": None,
                "process_group": (name, group.group_desc), "collective_seq_id": 0,
                "p2p_seq_id": i + 1, "op_id": 0, "profiling_name": f"gloo:{op}",
                "time_created_ns": created, "input_sizes": [sizes], "input_dtypes": ["Float"],
                "output_sizes": [sizes], "output_dtypes": ["Float"], "state": "scheduled",
                "retired": bool(work.is_completed()), "is_p2p": True, "timeout_ms": 120000})
        return out


def _snapshot(p2p: P2PLog, groups: dict) -> dict:
    import torch

    raw = pickle.loads(torch._C._distributed_c10d._dump_fr_trace(
        includeCollectives=True, includeStackTraces=False))
    raw["entries"] = list(raw["entries"]) + p2p.entries(len(raw["entries"]))
    raw["pg_config"] = {g.group_name: {"name": g.group_name, "desc": g.group_desc,
                                       "ranks": str(ranks)} for g, ranks in groups.values()}
    return raw


def _progress(raw: dict) -> tuple:
    return (repr(sorted(raw.get("pg_status", {}).items())),
            tuple((e["record_id"], e.get("retired")) for e in raw["entries"]))


def _dump_when_told(out: str, rank: int, p2p: P2PLog, groups: dict) -> None:
    """Dump once the driver says so, when two reads ``STABLE_S`` apart agree (at most 15 s): gloo
    marks completion from its own threads, so a fresh read can still show finished work pending,
    and a rank may still be on its way to the wait it ends in."""
    if not _wait_for([os.path.join(out, ".dump")], JOB_TIMEOUT_S + DUMP_TIMEOUT_S):
        return
    raw = _snapshot(p2p, groups)
    deadline = time.monotonic() + scaled(15)
    while time.monotonic() < deadline:
        time.sleep(STABLE_S)
        again = _snapshot(p2p, groups)
        if _progress(again) == _progress(raw):
            break
        raw = again
    tmp = os.path.join(out, f".rank_{rank}.tmp")
    with open(tmp, "wb") as f:
        pickle.dump(raw, f)
    os.replace(tmp, os.path.join(out, f"rank_{rank}"))


class Loader:
    """A data-loader thread handing out batches; ``block`` stops it before batch ``at``."""

    def __init__(self, block_at: int | None) -> None:
        import torch

        self.batches: queue.Queue = queue.Queue(maxsize=1)
        self._torch = torch
        self._block_at = block_at
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        step = 0
        while True:
            step += 1
            if step == self._block_at:
                threading.Event().wait()  # the loader's storage never answers
            self.batches.put(self._torch.ones(64))

    def next(self):
        return self.batches.get(timeout=JOB_TIMEOUT_S)


def _groups(rank: int, dist) -> dict:
    """Every group, created in the same order on every rank; returns this rank's."""
    mine = {}
    layouts = {"tp": [[0, 1], [2, 3], [4, 5], [6, 7]], "dp": [[0, 2], [1, 3], [4, 6], [5, 7]],
               "pp": [[0, 4], [1, 5], [2, 6], [3, 7]]}
    for desc, layout in layouts.items():
        for ranks in layout:
            group = dist.new_group(ranks, group_desc=desc, use_local_synchronization=True)
            if rank in ranks:
                mine[desc] = (group, ranks)
    mine["world"] = (dist.group.WORLD, list(range(WORLD)))
    return mine


def _spin_in_python() -> None:
    total = 0
    while True:  # a training thread stuck in Python: it never issues the next collective
        total += sum(range(1000))
        time.sleep(0.005)  # leave the shared test machine its cores


def _step(step: int, rank: int, fault: str | None, groups: dict, loader: Loader, p2p: P2PLog,
          dist) -> None:
    stage = rank // 4
    tp, dp, pp = (groups[k][0] for k in ("tp", "dp", "pp"))
    peer = groups["pp"][1][1 - stage]
    x = loader.next()
    hit = step == FAULT_STEP
    if stage == 1:
        _p2p(p2p, dist, "recv", x, peer, pp, stage)
    dist.all_reduce(x, group=tp)
    if stage == 0:
        _p2p(p2p, dist, "send", x, peer, pp, stage)
    if hit and fault == "python":
        _spin_in_python()
    if stage == 0:
        _p2p(p2p, dist, "recv", x, peer, pp, stage)
    dist.all_reduce(x, group=tp)
    if stage == 1:
        _p2p(p2p, dist, "send", x, peer, pp, stage)
    if not (hit and fault == "skip"):
        dist.all_reduce(x, group=dp)
    time.sleep(OPTIMIZER_S)
    dist.all_reduce(x)


def _p2p(p2p: P2PLog, dist, kind: str, x, peer: int, group, stage: int) -> None:
    local_peer = 1 - stage
    work = (dist.isend(x.clone(), peer, group=group) if kind == "send"
            else dist.irecv(x, peer, group=group))
    p2p.record(group, kind, stage, local_peer, work, list(x.shape))
    work.wait()


def rank_main(rank: int, out: str, scenario: str, port: int) -> None:
    """One rank, in a process forked from the driver (which imported torch once: eight
    concurrent imports of torch take minutes on a loaded machine)."""
    log = os.open(os.path.join(out, f".log.{rank}"), os.O_WRONLY | os.O_CREAT, 0o644)
    os.dup2(log, 2)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=JOB_TIMEOUT_S))
    groups = _groups(rank, dist)
    fault = SCENARIOS[scenario].get(rank)
    p2p = P2PLog()
    threading.Thread(target=_dump_when_told, args=(out, rank, p2p, groups),
                     daemon=True).start()
    loader = Loader(FAULT_STEP if fault == "data" else None)
    for step in range(1, STEPS + 1):
        if step == FAULT_STEP and fault is not None:
            _touch(os.path.join(out, f".fault.{rank}"))
        _step(step, rank, fault, groups, loader, p2p, dist)
    _touch(os.path.join(out, f".done.{rank}"))
    _wait_for([os.path.join(out, f"rank_{rank}")], JOB_TIMEOUT_S + DUMP_TIMEOUT_S)
    os._exit(0)  # the driver kills the hung ranks; nothing to tear down cleanly


def drive(out: str, scenario: str, port: int) -> list[str]:
    """Run the job, have every rank dump, kill it; returns the dump paths.

    Raises:
        TimeoutError: the job never reached its fault (or its end), or a rank wrote no dump.
    """
    import multiprocessing

    os.makedirs(out, exist_ok=True)
    # the recorder reads its size when torch loads; OMP: one thread per rank, none yet started
    os.environ.update(OMP_NUM_THREADS="1", TORCH_FR_BUFFER_SIZE="4000")
    import torch.distributed  # noqa: F401  (imported once, before the ranks are forked)

    fork = multiprocessing.get_context("fork")
    procs = [fork.Process(target=rank_main, args=(r, out, scenario, port), daemon=True)
             for r in range(WORLD)]
    for p in procs:
        p.start()
    try:
        marks = ([f".fault.{r}" for r in SCENARIOS[scenario]] if SCENARIOS[scenario]
                 else [f".done.{r}" for r in range(WORLD)])
        if not _wait_for([os.path.join(out, m) for m in marks], JOB_TIMEOUT_S):
            raise TimeoutError(f"{scenario}: the job never reached {marks}")
        time.sleep(SETTLE_S)  # let every other rank run into its wait
        _touch(os.path.join(out, ".dump"))
        dumps = [os.path.join(out, f"rank_{r}") for r in range(WORLD)]
        if not _wait_for(dumps, DUMP_TIMEOUT_S):
            raise TimeoutError(f"{scenario}: not every rank dumped")
        return dumps
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.join(timeout=scaled(30))


def main() -> None:
    drive(sys.argv[1], sys.argv[2], int(sys.argv[3]))


if __name__ == "__main__":
    main()
