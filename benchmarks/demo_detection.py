"""Straggler detection on real runs: the `laggard demo` (4 gloo ranks), repeated.

Each run trains the demo's model for ``--steps`` steps with one rank slowed by a factor from
``--slowdowns`` (1.0 = nothing injected) from a third of the run on, a different seed and slowed
rank each time, and keeps rank 0's gathered windows (``laggard demo --windows``). The windows are
then fed to the straggler detector exactly as the monitor feeds it (``RankWindow.from_record``
with the demo's detector settings), so the figures are those of the detector in this checkout;
the runs' own in-job findings are counted beside them.

Per slowdown: detection rate (the slowed rank named after onset), steps from onset to the first
finding (median, p95), flaps (a finding on the slowed rank cleared while still slowed), wrong
ranks (findings naming another rank), false findings (any rank finding in a clean run, or on the
slowed rank before onset), the injected and the measured excess (the slowed rank's compute over
the other ranks' median after onset).

Usage::

    python benchmarks/demo_detection.py --runs 10              # ~1 min per run on 2 cores
    python benchmarks/demo_detection.py --replay DIR           # re-score saved runs, seconds

The machine is shared: each run's load average is printed beside it.
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

import numpy as np

from laggard.detectors.straggler import StragglerDetector
from laggard.detectors.window import RankWindow, WindowRecord

SLOWDOWNS = (1.0, 1.05, 1.10, 1.25)


@dataclass(slots=True)
class Run:
    """One demo run, scored."""

    slowdown: float
    slow_rank: int
    slow_from: int
    seed: int
    load: tuple[float, float]
    wall_seconds: float
    first_step: int | None = None  # first finding on the slowed rank after onset
    flaps: int = 0
    wrong_ranks: list[int] = field(default_factory=list)
    false_findings: int = 0
    live_named: bool | None = None
    measured: float | None = None


def demo_config() -> StragglerDetector.Config:
    """The detector settings of the demo's monitor (``laggard.demo.worker``)."""
    from laggard.demo.worker import detector_config

    return detector_config()


def run_demo(out: Path, *, slowdown: float, slow_rank: int, seed: int, steps: int,
             window: int) -> dict[str, Any]:
    """One real ``laggard demo`` run; its windows and report land in ``out``."""
    stem = out / f"x{slowdown:g}_seed{seed}_rank{slow_rank}"
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "laggard.cli", "demo", "--steps", str(steps),
         "--window", str(window), "--slowdown", str(slowdown), "--slow-rank", str(slow_rank),
         "--seed", str(seed), "--windows", f"{stem}.jsonl", "--report", f"{stem}.json"],
        capture_output=True, text=True, timeout=900, check=False,
    )
    meta = {"slowdown": slowdown, "slow_rank": slow_rank, "seed": seed, "steps": steps,
            "slow_from": steps // 3, "window": window, "status": proc.returncode,
            "wall_seconds": time.perf_counter() - started,
            "load": [load_before, os.getloadavg()[0]]}
    Path(f"{stem}.meta.json").write_text(json.dumps(meta))
    if proc.returncode != 0:
        print(proc.stdout[-2000:], proc.stderr[-2000:], file=sys.stderr)
    return meta


def replay(jsonl: Path, config: StragglerDetector.Config) -> list[tuple[int, Any]]:
    """Feed a saved windows file to a fresh detector; (step, finding) for each finding."""
    detector = StragglerDetector(config)
    found = []
    for line in jsonl.read_text().splitlines():
        # by name: files saved by an older or newer monitor keep their own column order
        record = WindowRecord.from_saved(json.loads(line))
        found += [(record.step, f) for f in detector.update(RankWindow.from_record(record))]
    return found


def score(meta: dict[str, Any], jsonl: Path, config: StragglerDetector.Config) -> Run:
    """Score one run from its saved windows."""
    run = Run(slowdown=meta["slowdown"], slow_rank=meta["slow_rank"],
              slow_from=meta["slow_from"], seed=meta["seed"], load=tuple(meta["load"]),
              wall_seconds=meta["wall_seconds"])
    slowed = run.slowdown > 1.0
    for step, finding in replay(jsonl, config):
        if finding.rank is None:
            continue  # whole-job slowdowns are reported apart
        cleared = finding.cleared
        if slowed and finding.rank == run.slow_rank and step >= run.slow_from:
            if not cleared and run.first_step is None:
                run.first_step = step
            elif cleared:
                run.flaps += 1  # the injection stays on to the end of the run
        elif not cleared:
            if slowed and finding.rank != run.slow_rank:
                run.wrong_ranks.append(finding.rank)
            else:
                run.false_findings += 1
    docs = [json.loads(line) for line in jsonl.read_text().splitlines()]
    live = [f for d in docs for f in d.get("findings", []) if not f.get("cleared")]
    run.live_named = any(f.get("rank") == run.slow_rank for f in live) if slowed else (
        not any(f.get("rank") is not None for f in live))
    run.measured = measured_excess(docs, run) if slowed else None
    return run


def measured_excess(docs: list[dict[str, Any]], run: Run) -> float | None:
    """The slowed rank's compute over the other ranks' median, minus 1, over the windows
    wholly after onset (median of the windows)."""
    ratios = []
    for doc in docs:
        window = doc["step"] + 1 - (docs[1]["step"] - docs[0]["step"] if len(docs) > 1 else 1)
        if window < run.slow_from:
            continue
        compute = WindowRecord.from_saved(doc)["compute_seconds"]
        others = [v for r, v in enumerate(compute) if r != run.slow_rank and np.isfinite(v)]
        own = compute[run.slow_rank]
        if np.isfinite(own) and others:
            ratios.append(float(own) / float(np.median(others)) - 1)
    return float(np.median(ratios)) if ratios else None


def table(runs: list[Run]) -> str:
    lines = [
        "| slowdown | runs | named | steps onset→finding median / p95 | flaps | wrong ranks | "
        "false findings | measured excess median (min-max) | live runs named | load avg |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for slowdown in sorted({r.slowdown for r in runs}):
        cell = [r for r in runs if r.slowdown == slowdown]
        loads = [x for r in cell for x in r.load]
        load = f"{min(loads):.1f}-{max(loads):.1f}"
        if slowdown <= 1.0:
            false = sum(r.false_findings for r in cell)
            clean_live = sum(bool(r.live_named) for r in cell)
            lines.append(f"| 1.0 (clean) | {len(cell)} | - | - | - | - | {false} | - | "
                         f"{clean_live} of {len(cell)} clean | {load} |")
            continue
        named = [r for r in cell if r.first_step is not None]
        delays = [r.first_step - r.slow_from + 1 for r in named]  # type: ignore[operator]
        steps = (f"{np.median(delays):.0f} / {np.percentile(delays, 95):.0f}" if delays
                 else "-")
        measured = [r.measured for r in cell if r.measured is not None]
        spread = (f"{100 * np.median(measured):.1f}% ({100 * min(measured):.1f}-"
                  f"{100 * max(measured):.1f}%)" if measured else "-")
        wrong = sum(len(r.wrong_ranks) for r in cell)
        live = sum(bool(r.live_named) for r in cell)
        lines.append(
            f"| {slowdown:g} ({100 * (slowdown - 1):.0f}% injected) | {len(cell)} | "
            f"{len(named)} of {len(cell)} | {steps} | {sum(r.flaps for r in cell)} | {wrong} | "
            f"{sum(r.false_findings for r in cell)} | {spread} | {live} of {len(cell)} | "
            f"{load} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=10, help="runs per slowdown (default 10)")
    p.add_argument("--slowdowns", default=",".join(f"{s:g}" for s in SLOWDOWNS))
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--window", type=int, default=20)
    p.add_argument("--world-size", type=int, default=4)
    p.add_argument("--out", help="keep the runs' windows and reports here (default: temp)")
    p.add_argument("--replay", metavar="DIR", help="only re-score the runs saved in DIR")
    args = p.parse_args(argv)
    config = demo_config()
    out = Path(args.replay or args.out or tempfile.mkdtemp(prefix="laggard-demo-bench-"))
    out.mkdir(parents=True, exist_ok=True)
    if not args.replay:
        slowdowns = [float(s) for s in args.slowdowns.split(",")]
        for i in range(args.runs):
            for slowdown in slowdowns:  # interleaved: a change of load falls on every cell
                rank = 1 + (i % (args.world_size - 1)) if slowdown > 1 else -1
                meta = run_demo(out, slowdown=slowdown, slow_rank=max(rank, 0), seed=100 + i,
                                steps=args.steps, window=args.window)
                print(f"run {i} x{slowdown:g} rank {rank}: status {meta['status']}, "
                      f"{meta['wall_seconds']:.0f} s, load {meta['load'][0]:.1f}", flush=True)
    runs = []
    for meta_path in sorted(out.glob("*.meta.json")):
        meta = json.loads(meta_path.read_text())
        jsonl = Path(str(meta_path).replace(".meta.json", ".jsonl"))
        if meta["status"] == 0 and jsonl.exists():
            runs.append(score(meta, jsonl, config))
    cfg = config
    print(f"\n## Real demo runs ({len(runs)} runs from {out}; windows of {args.window} steps, "
          f"detector: reference {cfg.reference:.3f}, min_windows {cfg.min_windows}, "
          f"false_alarm_windows {cfg.false_alarm_windows:g})\n")
    print(table(runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
