"""The device clock's per-step CPU cost (record and harvest), against the demo model's step.

One process, no GPU: the device is ``tests/fake_cuda.py``'s ``FakeCuda`` (torch's names; its
``record``/``query``/``elapsed_time`` are Python methods, not CUDA driver calls), run forward
between steps so every step's events are read at the next step's end. In the same run, in
alternating blocks (so a drift in machine load falls on all):

* ``demo``: one training step of the demo's byte-level transformer (``laggard.demo.model``:
  forward, backward, AdamW; one thread), the step the cost is compared against;
* ``wall``: a ``TrainingMonitor`` on ``phase_clock="wall"`` timing four phases around no work,
  with a CommTimer told of ``--buckets`` ready buckets per step;
* ``device``: the same on ``phase_clock="device"`` (an event per phase boundary, the ready
  bucket's event re-recorded per bucket, the harvest of the previous step).

The device clock's cost is the median ``device`` minus the median ``wall`` monitor step; the
ratio is that over the median ``demo`` step. A CUDA event record costs about 2.5 µs of CPU
(docs/gpu.md, read from PyTorch's sources, not measured here): the projection replaces the
fake's measured record cost by that. Usage::

    python benchmarks/device_clock_cost.py [--blocks 20] [--block 50] [--buckets 4]

Target: under 0.5% of the demo model's step.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

TARGET = 0.005
#: CPU cost of one ``torch.cuda.Event.record`` (ENVIRONMENT.md; not measured here: no GPU).
CUDA_RECORD_SECONDS = 2.5e-6
PHASES = ("data", "forward", "backward", "optimizer")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--blocks", type=int, default=20, help="rounds (one block per arm each)")
    p.add_argument("--block", type=int, default=50, help="steps per block")
    p.add_argument("--buckets", type=int, default=4, help="DDP buckets ready per step")
    p.add_argument("--json", default="", help="write the figures to this file")
    return p.parse_args(argv)


def main() -> int:
    args = parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    import torch
    import torch.nn.functional as F
    from fake_cuda import FakeCuda

    from laggard.demo.model import ByteBatches, ByteLM, load_stdlib_text
    from laggard.integrations.comm_timing import CommTimer
    from laggard.integrations.monitor import TrainingMonitor

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = ByteLM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = ByteBatches(load_stdlib_text(), batch_size=8, seq_len=64, seed=0)

    def demo_step() -> None:
        x, y = batches.next()
        F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    fake = FakeCuda()
    monitors = {}
    for clock in ("wall", "device"):
        timer = CommTimer(device_sample_every=0)
        monitors[clock] = (TrainingMonitor(
            TrainingMonitor.Config(agent_address="", detect=False, phase_clock=clock),
            comm_timer=timer, device=fake), timer)

    def monitor_step(clock: str) -> None:
        monitor, timer = monitors[clock]
        with monitor.step():
            for phase in PHASES:
                with monitor.phase(phase):
                    if phase == "backward":
                        for _ in range(args.buckets):
                            timer.bucket_ready()
        fake.run(1.0)  # the device finishes the step: the next step end reads it

    arms = {"demo": demo_step, "wall": lambda: monitor_step("wall"),
            "device": lambda: monitor_step("device")}
    times: dict[str, list[float]] = {name: [] for name in arms}
    for fn in arms.values():  # warm-up
        for _ in range(20):
            fn()
    for block in range(args.blocks):
        names = list(arms)[block % 3:] + list(arms)[:block % 3]
        for name in names:
            fn = arms[name]
            for _ in range(args.block if name != "demo" else max(5, args.block // 5)):
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
    pool = monitors["device"][0].device_clock.pool
    record = []
    for _ in range(2000):  # the fake's own record cost, to project onto CUDA's
        start = time.perf_counter()
        event = pool.record()
        record.append(time.perf_counter() - start)
        pool.give_back(event)
    clock_stats = monitors["device"][0].device_clock.stats
    events_per_step = 2 * len(PHASES) + 1  # pooled events taken per step
    records_per_step = 2 * len(PHASES) + args.buckets  # record() calls (re-records included)
    med = {name: statistics.median(v) for name, v in times.items()}
    cost = med["device"] - med["wall"]
    projected = cost + records_per_step * (CUDA_RECORD_SECONDS - statistics.median(record))
    figures = {
        "demo_step_seconds": med["demo"], "wall_monitor_step_seconds": med["wall"],
        "device_monitor_step_seconds": med["device"], "device_clock_seconds_per_step": cost,
        "ratio": cost / med["demo"], "fake_record_seconds": statistics.median(record),
        "events_per_step": events_per_step, "records_per_step": records_per_step,
        "projected_cuda_seconds_per_step": projected,
        "projected_cuda_ratio": projected / med["demo"], "steps_read": clock_stats.steps_read,
        "steps_pending": clock_stats.steps_pending, "buckets": args.buckets,
        "samples": {name: len(v) for name, v in times.items()},
    }
    print(f"demo model step (1 thread, no DDP): {1e3 * med['demo']:.2f} ms")
    print(f"monitor step, wall clock: {1e6 * med['wall']:.1f} us; device clock (fake device): "
          f"{1e6 * med['device']:.1f} us")
    print(f"device clock's cost: {1e6 * cost:.1f} us per step = {100 * cost / med['demo']:.3f}% "
          f"of the demo step ({events_per_step} events; {clock_stats.steps_read} steps read)")
    print(f"projected with CUDA's ~2.5 us per record() ({records_per_step} per step): "
          f"{1e6 * projected:.1f} us = "
          f"{100 * projected / med['demo']:.3f}% (fake record {1e6 * statistics.median(record):.2f}"
          f" us)")
    ok = cost / med["demo"] < TARGET and projected / med["demo"] < TARGET
    print(f"target < {100 * TARGET:.1f}%: {'met' if ok else 'MISSED'}")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    for monitor, _ in monitors.values():
        monitor.close()
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
