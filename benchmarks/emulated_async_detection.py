"""The CPU clock against the device clock on the emulated asynchronous accelerator, repeated.

Each run is a real ``laggard demo --device emulated-async`` (4 gloo ranks, each rank's model work
on its emulated stream thread, the training loop only launching it and reading the loss), with
one rank slowed by ``--slowdown`` from a third of the run on, a different seed and slowed rank
each time, for ``--parallel ddp`` and ``fsdp``. From each run's JSON report it counts:

* named: the slowed rank named by the in-job straggler detector (on the device clock) after
  onset; wrong: another rank named; false: any rank named in a run with nothing injected;
* the slowed rank's compute excess over the other ranks' median on the CPU clock (the training
  thread's time in the same phases: what laggard measured before the device clock) and on the
  device clock, medians over the slowed windows.

The failure the device clock exists for is reproduced when the CPU clock's excess stays near 0
while the device clock's is near the injected one. The machine is shared: each run's load
average is printed beside it.

Usage::

    python benchmarks/emulated_async_detection.py --runs 5            # ~20 runs, ~1 min each
    python benchmarks/emulated_async_detection.py --runs 1 --steps 120 --parallel ddp
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(slots=True)
class Run:
    """One run, scored from its report."""

    parallel: str
    slowdown: float
    slow_rank: int
    seed: int
    load: tuple[float, float]
    wall_seconds: float
    status: int
    named: list[int] = field(default_factory=list)  # ranks with a straggler finding after onset
    first_step: int | None = None
    cpu_excess: float | None = None
    device_excess: float | None = None
    phase_clock: str | None = None

    @property
    def ok(self) -> bool:
        if self.status != 0:
            return False
        if self.slowdown > 1.0:
            return self.named == [self.slow_rank]
        return not self.named


def run_once(out: Path, *, parallel: str, slowdown: float, slow_rank: int, seed: int,
             steps: int, window: int, world_size: int) -> Run:
    """One real demo run; its report lands in ``out``."""
    stem = out / f"{parallel}_x{slowdown:g}_seed{seed}_rank{slow_rank}"
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "laggard.cli", "demo", "--device", "emulated-async",
         "--parallel", parallel, "--world-size", str(world_size), "--steps", str(steps),
         "--window", str(window), "--slowdown", str(slowdown), "--slow-rank", str(slow_rank),
         "--seed", str(seed), "--report", f"{stem}.json"],
        capture_output=True, text=True, timeout=1200, check=False,
    )
    Path(f"{stem}.log").write_text(proc.stdout + proc.stderr)
    run = Run(parallel=parallel, slowdown=slowdown, slow_rank=slow_rank, seed=seed,
              load=(load_before, os.getloadavg()[0]), wall_seconds=time.perf_counter() - started,
              status=proc.returncode)
    if proc.returncode != 0 or not Path(f"{stem}.json").exists():
        print(proc.stdout[-2000:], proc.stderr[-2000:], file=sys.stderr)
        return run
    return score(run, json.loads(Path(f"{stem}.json").read_text()))


def score(run: Run, report: dict[str, Any]) -> Run:
    """Fill ``run`` from a ``laggard demo --report`` document."""
    onset = report["injected"]["from_step"]
    for f in report["findings"]:
        if f.get("detector", "straggler") != "straggler" or f.get("rank") is None:
            continue
        if run.slowdown > 1.0 and (f.get("step") or 0) < onset:
            run.named.append(-1 - f["rank"])  # before onset: counted as wrong
            continue
        if f["rank"] not in run.named:
            run.named.append(f["rank"])
        if f["rank"] == run.slow_rank and run.first_step is None:
            run.first_step = f.get("step")
    clocks = report.get("clocks") or {}
    for name in ("cpu", "device"):
        rows = clocks.get(name) or []
        if run.slow_rank < len(rows):
            setattr(run, f"{name}_excess", rows[run.slow_rank].get("excess"))
    run.phase_clock = report.get("phase_clock")
    return run


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:+.1f}%"


def table(runs: list[Run]) -> str:
    """Per (parallel, slowdown): runs, right outcome, CPU and device excess of the slowed rank."""
    lines = ["| parallel | injected | runs | outcome | CPU clock excess (slowed rank) | "
             "device clock excess | load average |",
             "|---|---|---|---|---|---|---|"]
    groups: dict[tuple[str, float], list[Run]] = {}
    for r in runs:
        groups.setdefault((r.parallel, r.slowdown), []).append(r)
    for (parallel, slowdown), group in sorted(groups.items()):
        ok = sum(r.ok for r in group)
        what = (f"slowed rank named, no other: {ok} of {len(group)}" if slowdown > 1.0
                else f"nothing named: {ok} of {len(group)}")
        cpu = ", ".join(_pct(r.cpu_excess) for r in group)
        dev = ", ".join(_pct(r.device_excess) for r in group)
        loads = [x for r in group for x in r.load]
        lines.append(f"| {parallel} | {100 * (slowdown - 1):.0f}% | {len(group)} | {what} | "
                     f"{cpu} | {dev} | {min(loads):.0f}-{max(loads):.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5, help="runs per case (default 5)")
    p.add_argument("--slowdowns", default="1.0,1.25")
    p.add_argument("--parallel", default="ddp,fsdp")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--window", type=int, default=20)
    p.add_argument("--world-size", type=int, default=4)
    p.add_argument("--out", help="keep the runs' reports and logs here (default: temp)")
    args = p.parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="laggard-emulated-"))
    out.mkdir(parents=True, exist_ok=True)
    runs = []
    for parallel in args.parallel.split(","):
        for slowdown in (float(s) for s in args.slowdowns.split(",")):
            for i in range(args.runs):
                slow_rank = 1 + i % (args.world_size - 1)
                run = run_once(out, parallel=parallel, slowdown=slowdown, slow_rank=slow_rank,
                               seed=i, steps=args.steps, window=args.window,
                               world_size=args.world_size)
                runs.append(run)
                print(f"{parallel} x{slowdown:g} seed {i} rank {slow_rank}: named {run.named} "
                      f"(first at {run.first_step}), CPU {_pct(run.cpu_excess)}, device "
                      f"{_pct(run.device_excess)}, clock {run.phase_clock}, status {run.status}, "
                      f"{run.wall_seconds:.0f} s, load {run.load[0]:.1f}-{run.load[1]:.1f}",
                      flush=True)
    print()
    print(table(runs))
    print(f"\nreports and logs in {out}")
    return 0 if all(r.ok for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
