"""Real gloo hangs of several kinds, each rank's flight recorder dumped by a watchdog thread.

Run as ``python fr_gloo_hangs.py OUT_DIR KIND PORT``: 4 ranks (forked from this driver, which
imports torch once), ``TORCH_FR_BUFFER_SIZE`` set so that gloo records its collectives. Each rank
runs ``STEPS`` training-like steps: an all-reduce of the default group, then (ranks 2 and 3) one
of the subgroup ``sub23`` = {2, 3}; in the ``p2p`` kind rank 1 also sends rank 2 a tensor at the
start of each step. A watchdog thread in each rank calls torch's own
``torch._C._distributed_c10d._dump_fr_trace`` once the rank's training thread has made no
progress for ``IDLE_S`` seconds (gloo never dumps by itself: ``../shared/ENVIRONMENT.md``) and
writes the bytes unchanged to ``OUT_DIR/rank_<r>`` (torch's naming). The driver waits for every
dump it can expect, then kills the ranks.

Kinds (``KINDS``), from how a job hangs, at step ``FAULT_STEP``:

* ``sub_skip``: rank 3 skips its subgroup all-reduce and goes on to the next step's world
  all-reduce; rank 2 waits in the subgroup, so never reaches the world one.
* ``world_skip``: rank 0 skips a world all-reduce; its later calls pair with the others'
  earlier ones, so it finishes its loop one collective short while the others wait in the last.
* ``p2p``: rank 1 does not send; rank 2 waits in its receive (gloo records no send/recv).
* ``sigstop``: rank 3 stops itself (SIGSTOP) before the world all-reduce: no dump from it.
* ``clean``: no fault; every rank dumps right after a closing barrier, from its own thread.
"""

from __future__ import annotations

import datetime
import os
import pickle
import signal
import sys
import threading
import time

from laggard.demo.harness import scaled

WORLD = 4
STEPS = 6
FAULT_STEP = 4
IDLE_S = 3.0
STABLE_S = 1.0
#: kind -> the rank at fault (None: none)
KINDS: dict[str, int | None] = {"sub_skip": 3, "world_skip": 0, "p2p": 1, "sigstop": 3,
                                "clean": None}
JOB_TIMEOUT_S = scaled(120.0)


def _snapshot() -> bytes:
    import torch

    return torch._C._distributed_c10d._dump_fr_trace(includeCollectives=True,
                                                     includeStackTraces=False)


def _write(out: str, rank: int, data: bytes) -> None:
    tmp = os.path.join(out, f".rank_{rank}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, os.path.join(out, f"rank_{rank}"))


def _settled() -> bytes:
    """Two reads ``STABLE_S`` apart that agree (gloo retires entries from its own threads)."""
    data = _snapshot()
    deadline = time.monotonic() + scaled(10)
    while time.monotonic() < deadline:
        time.sleep(STABLE_S)
        again = _snapshot()
        if _progress(again) == _progress(data):
            return again
        data = again
    return data


def _progress(data: bytes) -> tuple:
    raw = pickle.loads(data)
    return (repr(sorted(raw.get("pg_status", {}).items())),
            tuple((e["record_id"], e.get("retired")) for e in raw.get("entries", [])))


def _watchdog(out: str, rank: int, last: list[float], done: threading.Event) -> None:
    while not done.is_set():
        if time.monotonic() - last[0] > IDLE_S:
            data = _settled()
            if not done.is_set():
                done.set()
                _write(out, rank, data)
            return
        time.sleep(0.1)


def rank_main(rank: int, out: str, kind: str, port: int) -> None:
    log = os.open(os.path.join(out, f".log.{rank}"), os.O_WRONLY | os.O_CREAT, 0o644)
    os.dup2(log, 2)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=JOB_TIMEOUT_S))
    sub = dist.new_group([2, 3], group_desc="sub23")
    fault = KINDS[kind] == rank
    last = [time.monotonic()]
    dumped = threading.Event()
    if kind != "clean":
        threading.Thread(target=_watchdog, args=(out, rank, last, dumped), daemon=True).start()
    x = torch.ones(16)
    for step in range(1, STEPS + 1):
        hit = fault and step == FAULT_STEP
        if kind == "p2p" and rank in (1, 2):
            if rank == 2:
                dist.recv(x, 1)
            elif not hit:
                dist.send(x, 2)
            last[0] = time.monotonic()
        if hit and kind == "sigstop":
            os.kill(os.getpid(), signal.SIGSTOP)
        if not (hit and kind == "world_skip"):
            dist.all_reduce(x)
            last[0] = time.monotonic()
        if rank in (2, 3) and not (hit and kind == "sub_skip"):
            dist.all_reduce(x, group=sub)
            last[0] = time.monotonic()
        time.sleep(0.05)  # the step's compute
        last[0] = time.monotonic()
    if kind == "clean":
        dist.barrier()
        _write(out, rank, _snapshot())  # right after the barrier: entries may not be retired
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while not os.path.exists(os.path.join(out, ".end")) and time.monotonic() < deadline:
        time.sleep(0.1)
    os._exit(0)  # the driver kills the hung ranks; nothing to tear down cleanly


def drive(out: str, kind: str, port: int) -> list[str]:
    """Run the job, wait for the dumps, kill it; returns the dump paths.

    Raises:
        TimeoutError: a rank that should have dumped did not within ``JOB_TIMEOUT_S``.
    """
    import multiprocessing

    os.makedirs(out, exist_ok=True)
    os.environ.update(OMP_NUM_THREADS="1", TORCH_FR_BUFFER_SIZE="2000")
    import torch.distributed  # noqa: F401  (imported once, before the ranks are forked)

    fork = multiprocessing.get_context("fork")
    procs = [fork.Process(target=rank_main, args=(r, out, kind, port), daemon=True)
             for r in range(WORLD)]
    for p in procs:
        p.start()
    expect = [r for r in range(WORLD) if not (kind == "sigstop" and r == KINDS[kind])]
    paths = [os.path.join(out, f"rank_{r}") for r in expect]
    try:
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while not all(os.path.exists(p) for p in paths):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{kind}: no dump from some of ranks {expect}")
            time.sleep(0.1)
        open(os.path.join(out, ".end"), "w").close()
        return paths
    finally:
        for p in procs:
            p.join(timeout=scaled(5) if kind == "clean" else 0.1)
            if p.is_alive():
                p.kill()
                p.join(timeout=scaled(30))


def main() -> None:
    drive(sys.argv[1], sys.argv[2], int(sys.argv[3]))


if __name__ == "__main__":
    main()
