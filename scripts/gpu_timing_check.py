#!/usr/bin/env python3
"""A prepared one-GPU check of laggard's device timing (issue 27, item 7): at most ~5 minutes,
JSON out, exit 2 with one clear line where there is no CUDA.

Run it on a machine with one CUDA GPU, from a clone with ``make venv`` done (and a CUDA torch):

    python scripts/gpu_timing_check.py --out gpu_check.json

What it checks, each section on its own (a section that fails is recorded, the rest go on):

1. **single process**: the CPU cost of ``torch.cuda.Event.record`` from laggard's pool; that
   ``query()`` never blocks while the device is busy (``torch.cuda._sleep``, a device-only spin);
   CPU timers against events on a known matmul load (a CPU timer around an asynchronous launch
   times the launch); that an NCCL ``Work`` future is done at enqueue (a one-rank NCCL group).
2. **ranks on cuda:0**: ``W`` ranks (default 3, the straggler detector's minimum) on the one GPU,
   gloo with CUDA tensors (and NCCL when ``NCCL_MULTI_RANK_GPU_ENABLE=1`` is accepted by the
   installed NCCL, ``--nccl``), training a DDP MLP with the TrainingMonitor on the device clock
   and, in the same run, its CPU clock; three phases of ``--steps`` steps: baseline, a
   device-only delay on rank 1 (``torch.cuda._sleep`` in its forward: the CPU never waits for
   it), a data-phase delay on rank 1 (``time.sleep`` in its data phase). Asserts: the CPU clock
   misses the device-only delay, the device clock names rank 1 with cause compute, then data.
   Also the monitor's overhead A/B (steps with and without the monitor, medians).
3. **no host-device sync on the hot path**: one step of every compression hook and of the
   integrity check under ``torch.cuda.set_sync_debug_mode("error")`` (through
   ``laggard.compression.sync_check`` when present).

Output: one JSON document (``--out``, and a summary on stdout) with every figure and a
``checks`` list of ``{name, passed, detail}``; exit 0 when every check passed, 1 when one failed,
2 without CUDA.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

#: Device-only delay per step on the delayed rank (seconds of ``torch.cuda._sleep``).
DEVICE_DELAY_S = 0.010
#: Data-phase delay per step on the delayed rank (seconds of ``time.sleep``).
DATA_DELAY_S = 0.010


_CYCLES_PER_SECOND: list[float] = []


def _cycles_for(seconds: float) -> int:
    """``torch.cuda._sleep`` cycles for about ``seconds`` on the current device, calibrated
    once with events (the check's own set-up: it may synchronise)."""
    import torch

    if not _CYCLES_PER_SECOND:
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        torch.cuda.synchronize()
        start.record()
        torch.cuda._sleep(10_000_000)
        end.record()
        end.synchronize()
        _CYCLES_PER_SECOND.append(10_000_000 / (start.elapsed_time(end) / 1e3))
    return int(seconds * _CYCLES_PER_SECOND[0])


class Checks:
    """The figures and pass/fail lines of one run."""

    def __init__(self) -> None:
        self.doc: dict[str, Any] = {"checks": [], "sections": {}}

    def check(self, name: str, passed: bool, detail: str) -> None:
        self.doc["checks"].append({"name": name, "passed": bool(passed), "detail": detail})
        print(f"{'PASS' if passed else 'FAIL'} {name}: {detail}", flush=True)

    def section(self, name: str, fn: Callable[[Checks], dict[str, Any]]) -> None:
        started = time.monotonic()
        try:
            figures = fn(self)
            figures["seconds"] = round(time.monotonic() - started, 2)
            self.doc["sections"][name] = figures
        except Exception as exc:  # noqa: BLE001 - one section's failure is recorded
            self.doc["sections"][name] = {"error": repr(exc),
                                          "traceback": traceback.format_exc()[-4000:]}
            self.check(name, False, f"section raised {exc!r}")


# ------------------------------------------------------------------------- 1. one process
def single_process(checks: Checks) -> dict[str, Any]:
    import torch

    from laggard.integrations.device_events import EventPool, PendingIntervals

    cuda = torch.cuda
    pool = EventPool(cuda, size=1024)
    torch.cuda.synchronize()  # the check's own set-up, never laggard's hot path
    n = 1000
    started = time.perf_counter()
    events = [pool.record() for _ in range(n)]
    record_us = 1e6 * (time.perf_counter() - started) / n
    torch.cuda.synchronize()
    pool.give_back(*events)
    checks.check("event_record_cost", record_us < 20.0, f"{record_us:.2f} us per record")

    # query() never blocks: the device spins for ~0.5 s; query returns at once, False
    start = pool.record()
    torch.cuda._sleep(_cycles_for(0.5))
    end = pool.record()
    t0 = time.perf_counter()
    done = end.query()
    query_us = 1e6 * (time.perf_counter() - t0)
    checks.check("query_never_blocks", (not done) and query_us < 1000,
                 f"query() took {query_us:.1f} us and returned {done} while the device spun")
    pending = PendingIntervals(pool)
    got: list[float] = []
    pending.add(start, end, got.append)
    deadline = time.monotonic() + 5
    while not got and time.monotonic() < deadline:
        pending.harvest()
        time.sleep(0.01)
    checks.check("interval_read_after_completion", bool(got) and 0.3 < got[0] < 2.0,
                 f"device interval {got[0] if got else None} s for a 0.5 s spin")

    # CPU timer vs events on a matmul load
    a = torch.randn(4096, 4096, device="cuda")
    torch.cuda.synchronize()
    cpu_t0 = time.perf_counter()
    s = pool.record()
    for _ in range(20):
        a = a @ a
        a = a / a.norm()
    e = pool.record()
    cpu_s = time.perf_counter() - cpu_t0
    torch.cuda.synchronize()
    device_s = s.elapsed_time(e) / 1e3
    pool.give_back(s, e)
    checks.check("cpu_timer_times_the_launch", cpu_s < 0.5 * device_s,
                 f"CPU timer {1e3 * cpu_s:.2f} ms around launches of {1e3 * device_s:.2f} ms "
                 "of device work")

    # an NCCL future is done at enqueue
    nccl: dict[str, Any] = {}
    try:
        import torch.distributed as dist

        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
        dist.init_process_group("nccl", rank=0, world_size=1)
        x = torch.ones(1 << 20, device="cuda")
        dist.all_reduce(x)
        torch.cuda.synchronize()
        torch.cuda._sleep(_cycles_for(0.3))
        work = dist.all_reduce(x, async_op=True)
        fut_done = work.get_future().done()
        probe = pool.record()
        stream_done = probe.query()
        nccl = {"future_done_at_enqueue": fut_done, "stream_done": stream_done}
        checks.check("nccl_future_done_at_enqueue", fut_done and not stream_done,
                     f"future.done()={fut_done} while the stream had not reached it "
                     f"(event.query()={stream_done})")
        torch.cuda.synchronize()
        dist.destroy_process_group()
    except Exception as exc:  # noqa: BLE001
        nccl = {"error": repr(exc)}
        checks.check("nccl_future_done_at_enqueue", False, f"could not run: {exc!r}")
    return {"event_record_us": record_us, "query_us": query_us,
            "matmul_cpu_s": cpu_s, "matmul_device_s": device_s, "nccl": nccl}


# ------------------------------------------------------------------------- 2. ranks on cuda:0
def _rank_main(rank: int, world: int, backend: str, steps: int, port: int, out: str) -> None:
    """One rank: baseline, device-only delay, data delay; the monitor on the device clock."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from laggard.integrations import CommTimer, TrainingMonitor, allreduce_timing_hook

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(backend, rank=rank, world_size=world)
    torch.cuda.set_device(0)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(),
                                torch.nn.Linear(4096, 1024)).cuda()
    ddp = DistributedDataParallel(model, device_ids=[0])
    timer = CommTimer()
    ddp.register_comm_hook(timer, allreduce_timing_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    results: dict[str, Any] = {}
    cycles = _cycles_for(DEVICE_DELAY_S)
    for clock in ("device", "wall"):
        monitor = TrainingMonitor(
            TrainingMonitor.Config(agent_address="", window_steps=10, phase_clock=clock),
            comm_timer=timer)
        step_s: list[float] = []
        for step in range(3 * steps):
            phase = ("baseline", "device_delay", "data_delay")[step // steps]
            t0 = time.perf_counter()
            with monitor.step():
                with monitor.phase("data"):
                    x = torch.randn(64, 1024, device="cuda")
                    if phase == "data_delay" and rank == 1:
                        time.sleep(DATA_DELAY_S)
                with monitor.phase("forward"):
                    if phase == "device_delay" and rank == 1:
                        torch.cuda._sleep(cycles)  # the device spins; the CPU goes on
                    loss = ddp(x).square().mean()
                with monitor.phase("backward"):
                    loss.backward()
                with monitor.phase("optimizer"):
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                loss.item()  # where a real loop synchronises
            step_s.append(time.perf_counter() - t0)
        results[clock] = {
            "findings": [f.to_dict() for f in monitor.findings],
            "windows": [{"step": w.step, "compute_seconds": w["compute_seconds"].tolist()}
                        for w in monitor.windows],
            "step_median_s": statistics.median(step_s[-steps:]),
        }
        monitor.close()
    # overhead A/B: the same steps without a monitor
    plain: list[float] = []
    for _ in range(steps):
        t0 = time.perf_counter()
        x = torch.randn(64, 1024, device="cuda")
        loss = ddp(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()
        plain.append(time.perf_counter() - t0)
    results["plain_step_median_s"] = statistics.median(plain)
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        with open(out, "w", encoding="utf-8") as f:
            json.dump(results, f)


def ranks_on_one_gpu(checks: Checks, *, world: int, backend: str, steps: int) -> dict[str, Any]:
    import tempfile

    import torch.multiprocessing as mp

    out = os.path.join(tempfile.mkdtemp(), f"ranks_{backend}.json")
    port = 29600 + os.getpid() % 1000
    mp.spawn(_rank_main, args=(world, backend, steps, port, out), nprocs=world, join=True)
    with open(out, encoding="utf-8") as f:
        results = json.load(f)
    for clock in ("device", "wall"):
        named = [(f["rank"], f["kind"]) for f in results[clock]["findings"]
                 if f.get("rank") is not None and not f.get("cleared")]
        results[clock]["named"] = named
    device_named = results["device"]["named"]
    checks.check(f"{backend}_device_clock_names_rank1_compute_then_data",
                 device_named[:2] == [[1, "compute"], [1, "data"]]
                 or [tuple(n) for n in device_named[:2]] == [(1, "compute"), (1, "data")],
                 f"device clock named {device_named}")
    wall_named = results["wall"]["named"]
    checks.check(f"{backend}_cpu_clock_misses_the_device_only_delay",
                 not any(tuple(n) == (1, "compute") for n in wall_named),
                 f"CPU (wall) clock named {wall_named}")
    overhead = results["device"]["step_median_s"] / results["plain_step_median_s"] - 1
    results["monitor_overhead"] = overhead
    checks.check(f"{backend}_monitor_overhead", overhead < 0.02,
                 f"device-clock monitor {100 * overhead:.2f}% over the plain step")
    return results


# ------------------------------------------------------------------------- 3. sync debug mode
def no_sync_on_hot_path(checks: Checks) -> dict[str, Any]:
    try:
        from laggard.compression import sync_check  # type: ignore[attr-defined]
    except ImportError:
        checks.check("no_sync_on_hot_path", False,
                     "laggard.compression.sync_check is not in this checkout")
        return {}
    report = sync_check.run_sync_check("cuda")
    checks.check("no_sync_on_hot_path", not report.get("synced"),
                 f"synchronising calls: {report.get('synced')}")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="gpu_timing_check.json", help="JSON output path")
    parser.add_argument("--world-size", type=int, default=3, help="ranks on cuda:0 (>= 3)")
    parser.add_argument("--steps", type=int, default=100, help="steps per phase (baseline, "
                        "device delay, data delay)")
    parser.add_argument("--nccl", action="store_true", help="also run the ranks on NCCL "
                        "(sets NCCL_MULTI_RANK_GPU_ENABLE=1; NCCL 2.30+ refuses 2 ranks on one "
                        "GPU without it)")
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("gpu_timing_check: torch is not installed; nothing to check", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("gpu_timing_check: no CUDA device (torch.cuda.is_available() is False); "
              "nothing to check", file=sys.stderr)
        return 2
    checks = Checks()
    checks.doc["device"] = torch.cuda.get_device_name(0)
    checks.doc["torch"] = torch.__version__
    checks.section("single_process", single_process)
    checks.section("ranks_gloo", lambda c: ranks_on_one_gpu(
        c, world=args.world_size, backend="gloo", steps=args.steps))
    if args.nccl:
        os.environ["NCCL_MULTI_RANK_GPU_ENABLE"] = "1"
        checks.section("ranks_nccl", lambda c: ranks_on_one_gpu(
            c, world=args.world_size, backend="nccl", steps=args.steps))
    checks.section("no_sync_on_hot_path", no_sync_on_hot_path)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(checks.doc, f, indent=1, default=str)
    failed = [c["name"] for c in checks.doc["checks"] if not c["passed"]]
    print(f"gpu_timing_check: {len(checks.doc['checks']) - len(failed)} passed, "
          f"{len(failed)} failed; figures in {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
