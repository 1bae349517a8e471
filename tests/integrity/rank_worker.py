"""Integrity scenarios on real gloo ranks: ``python rank_worker.py WORLD OUT PORT SCENARIO...``.

Spawned with ``torch.multiprocessing`` (one process per rank, a TCP store on 127.0.0.1); each
scenario trains a small two-bucket MLP under DDP for a few steps with the chosen hook, policy and
bit flip, and rank r writes what it saw to ``OUT.json.r``. Scenarios are named
``hook:policy:where:bit`` (``where`` = ``none`` for a clean run); the hooks are ``allreduce``
(laggard's integrity all-reduce), ``monitor`` (the same, checked through TrainingMonitor's window
gather), ``allgather`` and ``alltoall`` (test hooks exchanging the exact
payload through those collectives), ``nan`` (a NaN planted in rank 1's gradient), ``garbage``
(rank 1 sends an unreadable window vector) and ``compress-NAME`` (a compressor of
``laggard.compression`` wrapped by ``with_integrity``).
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

from laggard.integrations.faults import BitFlipInjector
from laggard.integrations.integrity import GradientIntegrity, IntegrityError
from laggard.integrations.integrity_fingerprints import fingerprint
from laggard.integrations.integrity_hooks import (
    IntegrityHookState,
    integrity_allreduce_hook,
    with_integrity,
)

STEPS = 4
FLIP_RANK, FLIP_STEP, FLIP_BUCKET, FLIP_ELEMENT = 2, 2, 0, 37


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64),
                               torch.nn.Tanh(), torch.nn.Linear(64, 8))


def gather_hook(state: IntegrityHookState, bucket):  # type: ignore[no-untyped-def]
    """Average by all-gathering every rank's exact payload and summing it locally."""
    integrity, index, w = state.integrity, bucket.index(), dist.get_world_size()
    buffer = bucket.buffer()
    payload = buffer / w
    integrity.allgather_sent(index, payload)
    gathered = torch.empty(w * payload.numel(), dtype=payload.dtype)  # gloo wants it flat
    fut = dist.all_gather_single(gathered, payload, async_op=True).get_future()
    gathered = gathered.view(w, -1)

    def done(_: torch.futures.Future) -> torch.Tensor:
        integrity.allgather_received(index, gathered)
        buffer.copy_(gathered.sum(0))
        integrity.inject("after_reduce", index, buffer)
        integrity.result(index, buffer)
        return buffer

    return fut.then(done)


def alltoall_hook(state: IntegrityHookState, bucket):  # type: ignore[no-untyped-def]
    """Reduce-scatter through an all-to-all of chunks (blocking), then all-gather the sums."""
    integrity, index, w = state.integrity, bucket.index(), dist.get_world_size()
    buffer = bucket.buffer()
    n = buffer.numel()
    c = -(-n // w)
    send = torch.zeros(w * c, dtype=buffer.dtype)
    send[:n] = buffer / w
    send = send.view(w, c)
    integrity.alltoall_sent(index, send)
    received = torch.empty_like(send)
    dist.all_to_all_single(received, send)
    integrity.alltoall_received(index, received)
    mine = received.sum(0)
    gathered = torch.empty(w * c, dtype=buffer.dtype)
    fut = dist.all_gather_single(gathered, mine, async_op=True).get_future()

    def done(_: torch.futures.Future) -> torch.Tensor:
        buffer.copy_(gathered[:n])
        integrity.inject("after_reduce", index, buffer)
        integrity.result(index, buffer)
        return buffer

    return fut.then(done)


def run(scenario: str, rank: int, world: int) -> dict:
    hook_name, policy, where, bit = scenario.split(":")
    injector = None
    if where != "none":
        injector = BitFlipInjector(rank=FLIP_RANK % world, step=FLIP_STEP, bucket=FLIP_BUCKET,
                                   element=FLIP_ELEMENT, bit=int(bit), where=where)
    # "monitor": the fingerprints ride in TrainingMonitor's window gather (every 2 steps)
    via_monitor = hook_name == "monitor"
    integrity = GradientIntegrity(
        GradientIntegrity.Config(policy=policy, replica_every=1,
                                 gather_every=0 if via_monitor else 1),
        injector=injector)
    monitor = None
    if via_monitor:
        from laggard.integrations.monitor import TrainingMonitor

        # the test's node agent, when it passes one: rank 0 reports the findings there
        agent = os.environ.get("LAGGARD_TEST_INTAKE", "")
        monitor = TrainingMonitor(TrainingMonitor.Config(agent_address=agent, window_steps=2,
                                                         integrity=integrity))
    net = model()
    ddp = DDP(net, bucket_cap_mb=0.01)  # two or more buckets
    inner = None
    if hook_name.startswith("compress-"):
        from laggard.compression import make_hook

        name = hook_name.removeprefix("compress-")
        # 1-bit Adam: one AdamW step, then the momentum is compressed (from FLIP_STEP on)
        options = {"warmup_steps": 1, "lr": 1e-3} if name == "onebit_adam" else {}
        inner, compressor = make_hook(name, None, model=ddp, integrity=integrity, **options)
        ddp.register_comm_hook(IntegrityHookState(integrity, inner), with_integrity(compressor))
    else:
        hook = {"allgather": gather_hook, "alltoall": alltoall_hook}.get(
            hook_name, integrity_allreduce_hook)
        ddp.register_comm_hook(IntegrityHookState(integrity), hook)
    opt = getattr(inner, "optimizer", None) or torch.optim.SGD(ddp.parameters(), lr=0.1)
    applied, raised = [], None
    for step in range(STEPS):
        if monitor is not None:
            monitor._begin_step()
        g = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(16, 32, generator=g)
        y = torch.randn(16, 8, generator=g)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        try:
            if hook_name == "garbage" and step == FLIP_STEP:
                ok = _garbage_step(integrity, rank)
            else:
                ok = integrity.end_step(ddp)
        except IntegrityError as exc:
            raised = {"step": step, "message": str(exc)}
            break
        applied.append(ok)
        if ok:
            opt.step()
        opt.zero_grad()
        if monitor is not None:
            monitor._end_step()  # what ``with monitor.step():`` runs on exit
        if hook_name == "nan" and step + 1 == FLIP_STEP and rank == 1:
            # a NaN in one rank's gradient next step: poison one weight's input path
            with torch.no_grad():
                net[0].weight[0, 0] = float("nan")
    if inner is not None and hasattr(inner, "close"):
        inner.close()
    if monitor is not None:
        monitor.close()
    return {
        "findings": [f.to_dict() for f in integrity.findings],
        "applied": applied,
        "raised": raised,
        "errors": integrity.errors,
        "fired": bool(injector and injector.fired),
        "param_hash": sum(fingerprint(p.detach()) for p in net.parameters()),
    }


def _garbage_step(integrity: GradientIntegrity, rank: int) -> bool:
    """One check where rank 1's vector claims an unknown version."""
    local = integrity.window_vector()
    if rank == 1:
        local[1] = 99
    gathered = torch.empty(dist.get_world_size() * local.numel(), dtype=torch.int64)
    dist.all_gather_single(gathered, local)
    integrity.check_window(gathered.view(dist.get_world_size(), -1))
    integrity.step += 1
    return True


def worker(rank: int, world: int, port: int, out: str, scenarios: list[str]) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    results = {}
    for scenario in scenarios:
        results[scenario] = run(scenario, rank, world)
        dist.barrier()
    with open(f"{out}.{rank}", "w") as f:
        json.dump(results, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    world_size, out_path, port_arg, *names = sys.argv[1:]
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(worker, args=(int(world_size), int(port_arg), out_path, names), nprocs=int(world_size))
