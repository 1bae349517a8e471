"""Synthetic PyTorch profiler (Kineto) traces in the GPU form, one file per rank.

For what this machine cannot record (it has no GPU): each rank's trace holds, per profiler step,
a CPU ``ProfilerStep#N`` range with one ``cudaLaunchKernel`` per kernel (linked to its kernel by
``correlation``), compute kernels back to back on one stream, and NCCL all-reduce kernels on a
second stream that start when a gradient bucket is ready and end when the slowest rank's bucket
is ready plus the transfer time: so the slow rank's communication kernels are the shortest
(it arrives last and waits least), as on a real synchronous job. The layout is Kineto's
(``export_chrome_trace``): ``distributedInfo``, ``deviceProperties``, ``traceEvents``.
"""

from __future__ import annotations

import gzip
import json
import os
import random
from collections.abc import Iterator
from typing import Any

__all__ = ["synthesize_gpu_traces"]

_COMPUTE_NAMES = ("ampere_sgemm_128x64_nn", "void at::native::vectorized_elementwise_kernel<4>",
                  "sm90_xmma_gemm_bf16bf16_bf16f32", "void at::native::reduce_kernel<512, 1>")
_NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"


def _schedule(world: int, steps: int, slow_rank: int | None, slowdown: float,
              kernels_per_step: int, seed: int) -> Iterator[dict[int, list[float]]]:
    """Per step, every rank's compute-kernel durations (microseconds): the job's schedule."""
    rng = random.Random(seed)
    for _ in range(steps):
        yield {r: [rng.uniform(40.0, 400.0) * (1 + slowdown if r == slow_rank else 1)
                   * rng.uniform(0.97, 1.03) for _ in range(kernels_per_step)]
               for r in range(world)}


def _step_events(rank: int, world: int, step: int, t: float, corr: int,
                 durations: dict[int, list[float]], transfer: float, digits: int) \
        -> tuple[list[dict[str, Any]], float, int]:
    """One rank's events of one step starting at ``t``; returns them, the next step's start
    and the next correlation id."""
    pid = tid = 1000 + rank
    kernels_per_step = len(durations[rank])
    buckets = [kernels_per_step // 2, kernels_per_step - 1]
    # a bucket's all-reduce ends when the last rank's bucket is ready, plus the transfer
    ready = {b: max(t + 50 + sum(durations[r][:b + 1]) for r in range(world)) for b in buckets}
    events, launches, gpu = [], [], t + 50.0
    for k, dur in enumerate(durations[rank]):
        launches.append((t + 5 + 3 * k, corr))
        events.append(_kernel("kernel", _COMPUTE_NAMES[k % 4], pid, 7, gpu, dur, corr, digits))
        gpu += dur
        corr += 1
        if k in buckets:
            start = gpu + 2.0  # this rank's bucket is ready: its NCCL kernel starts
            launches.append((t + 5 + 3 * k + 1, corr))
            events.append(_kernel("kernel", _NCCL, pid, 20, start, ready[k] + 2.0 + transfer
                                  - start, corr, digits,
                                  {"Process Group Name": "0",
                                   "Process Group Description": "default_pg",
                                   "Collective name": "allreduce", "Group size": world}))
            corr += 1
    copy_start = gpu + 5.0
    launches.append((t + 5 + 3 * kernels_per_step, corr))
    events.append(_kernel("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", pid, 7, copy_start,
                          30.0, corr, digits))
    corr += 1
    step_end = max(copy_start + 30.0, max(ready.values()) + 200.0) + 20.0
    events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}",
                   "pid": pid, "tid": tid, "ts": t, "dur": round(step_end - t, 3), "args": {}})
    for ts, c in launches:
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel",
                       "pid": pid, "tid": tid, "ts": round(ts, 3), "dur": 2.0,
                       "args": {"correlation": c, "External id": c}})
    return events, step_end + 10.0, corr


def _kernel(cat: str, name: str, pid: int, stream: int, ts: float, dur: float, corr: int,
            digits: int, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    start, end = round(ts, digits), round(ts + dur, digits)
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": start,
            "dur": round(end - start, digits),
            "args": {"device": 0, "stream": stream, "correlation": corr, "External id": corr,
                     "context": 1, **(extra or {})}}


def synthesize_gpu_traces(directory: str, *, world: int = 4, steps: int = 10,
                          slow_rank: int | None = None, slowdown: float = 0.3,
                          kernels_per_step: int = 40, seed: int = 0,
                          gz: bool = False, whole_microseconds: bool = False) -> list[str]:
    """Write one GPU-form trace per rank into ``directory``.

    Args:
        directory: created if absent.
        world: ranks; ``steps``: profiler steps per rank.
        slow_rank: the rank whose compute kernels run ``1 + slowdown`` times longer, or None.
        kernels_per_step: compute kernels per step (two all-reduce buckets per step).
        seed: the schedule's random seed; ``gz``: gzip the files.
        whole_microseconds: kernel times in whole microseconds (Kineto writes nanosecond
            fractions; HTA rounds them down, so a comparison with HTA uses whole ones).

    Returns:
        The paths written (``rank<r>.pt.trace.json[.gz]``).
    """
    os.makedirs(directory, exist_ok=True)
    paths = [os.path.join(directory, f"rank{r}.pt.trace.json" + (".gz" if gz else ""))
             for r in range(world)]
    opener: Any = gzip.open if gz else open
    files = [opener(p, "wt", encoding="utf-8") for p in paths]
    try:
        for rank, f in enumerate(files):
            head = {"schemaVersion": 1, "deviceProperties": [
                {"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85031714816,
                 "computeMajor": 9, "computeMinor": 0, "numSms": 132}],
                "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world,
                                    "pg_count": 1, "pg_config": [
                                        {"pg_name": "0", "pg_desc": "default_pg",
                                         "backend_config": "cuda:nccl", "pg_size": world,
                                         "ranks": list(range(world))}]}}
            f.write(json.dumps(head)[:-1] + ', "traceEvents": [\n')
        clocks = [(1_000_000.0, 1)] * world  # per rank: step start, next correlation id
        rng = random.Random(seed + 1)
        for step, durations in enumerate(_schedule(world, steps, slow_rank, slowdown,
                                                   kernels_per_step, seed)):
            transfer = rng.uniform(150.0, 170.0)
            for rank, f in enumerate(files):
                events, t, corr = _step_events(rank, world, step, clocks[rank][0],
                                               clocks[rank][1], durations, transfer,
                                               0 if whole_microseconds else 3)
                clocks[rank] = (t, corr)
                f.write(("" if step == 0 else ",\n") + ",\n".join(map(json.dumps, events)))
        for path, f in zip(paths, files, strict=True):
            f.write('\n], "traceName": "' + os.path.basename(path) + '"}\n')
    finally:
        for f in files:
            f.close()
    return paths
