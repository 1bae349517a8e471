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

Long runs (issue 26): ``--paired`` runs each slowed demo beside a concurrent clean demo (the
load a straggler meets on a shared machine, and a second job whose findings must stay empty),
``--slow-from`` sets the onset, so ``--steps 1200 --slow-from 200`` gives 1,000 slowed steps;
``--device emulated-async`` runs both on the device clock. Per slowdown it adds the windows from
onset to name (the windows holding a slowed step, up to the one that named it: 3 is the least
the test allows when the onset starts a window), the flaps over the whole slowed stretch, and
the concurrent clean runs' findings; each run's load average is sampled every 5 s while it runs.

Usage::

    python benchmarks/demo_detection.py --runs 10              # ~1 min per run on 2 cores
    python benchmarks/demo_detection.py --replay DIR           # re-score saved runs, seconds
    python benchmarks/demo_detection.py --paired --runs 3 --slowdowns 1.05,1.10,1.25 \
        --steps 1200 --slow-from 200 --out DIR                  # ~4 min per pair on 2 cores

The machine is shared: each run's load average is printed beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
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
    window: int = 20
    steps: int = 0
    device: str = "cpu"
    parallel: str = "ddp"
    paired_with: str | None = None  # the stem of the concurrent run (paired mode)
    first_step: int | None = None  # first finding on the slowed rank after onset
    flaps: int = 0
    wrong_ranks: list[int] = field(default_factory=list)
    false_findings: int = 0
    live_named: bool | None = None
    measured: float | None = None

    @property
    def windows_to_name(self) -> int | None:
        """Windows holding a slowed step, from the onset's to the one whose record named it."""
        if self.first_step is None:
            return None
        first_window_end = (self.slow_from // self.window + 1) * self.window - 1
        return (self.first_step - first_window_end) // self.window + 1


def demo_config() -> StragglerDetector.Config:
    """The detector settings of the demo's monitor (``laggard.demo.worker``)."""
    from laggard.demo.worker import detector_config

    return detector_config()


def demo_command(stem: Path, *, slowdown: float, slow_rank: int, seed: int, steps: int,
                 window: int, slow_from: int, device: str, parallel: str = "ddp") -> list[str]:
    """The ``laggard demo`` command line of one run whose windows and report land at ``stem``."""
    command = [sys.executable, "-m", "laggard.cli", "demo", "--steps", str(steps),
               "--window", str(window), "--slowdown", str(slowdown),
               "--slow-rank", str(slow_rank), "--slow-from", str(slow_from),
               "--seed", str(seed), "--windows", f"{stem}.jsonl", "--report", f"{stem}.json"]
    if device != "cpu":
        command += ["--device", device]
    if parallel != "ddp":
        command += ["--parallel", parallel]
    return command


class LoadSampler:
    """The 1-minute load average, sampled every ``every`` seconds on a thread while it runs."""

    def __init__(self, every: float = 5.0) -> None:
        self.samples = [os.getloadavg()[0]]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, args=(every,), daemon=True)
        self._thread.start()

    def _sample(self, every: float) -> None:
        while not self._stop.wait(every):
            self.samples.append(os.getloadavg()[0])

    def stop(self) -> list[float]:
        """Stop; (min, mean, max) of the samples, the last one taken now."""
        self._stop.set()
        self._thread.join()
        self.samples.append(os.getloadavg()[0])
        return [min(self.samples), float(np.mean(self.samples)), max(self.samples)]


def run_demos(out: Path, specs: list[dict[str, Any]], *, steps: int, window: int,
              slow_from: int, device: str, parallel: str = "ddp") -> list[dict[str, Any]]:
    """Real ``laggard demo`` runs started together (a pair runs concurrently); each one's
    windows, report and metadata land in ``out``."""
    sampler = LoadSampler()
    started = time.perf_counter()
    procs = []
    for spec in specs:
        prefix = "".join(f"{v}_" for v in (parallel, device) if v not in ("ddp", "cpu"))
        stem = out / f"{prefix}x{spec['slowdown']:g}_seed{spec['seed']}_rank{spec['slow_rank']}"
        command = demo_command(stem, steps=steps, window=window, slow_from=slow_from,
                               device=device, parallel=parallel, **spec)
        log = open(f"{stem}.log", "w")  # noqa: SIM115 (closed below, after the run)
        procs.append((stem, log, subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                                  text=True)))
    metas = []
    for stem, log, proc in procs:
        try:
            status = proc.wait(timeout=3600)
        except subprocess.TimeoutExpired:
            proc.kill()
            status = proc.wait()
        log.close()
        metas.append({"stem": stem.name, "status": status,
                      "wall_seconds": time.perf_counter() - started})
    load = sampler.stop()
    for meta, spec in zip(metas, specs, strict=True):
        meta.update(spec, steps=steps, slow_from=slow_from, window=window, device=device,
                    parallel=parallel, load=load,
                    paired_with=[m["stem"] for m in metas if m is not meta] or None)
        Path(out / f"{meta['stem']}.meta.json").write_text(json.dumps(meta))
        if meta["status"] != 0:
            print(Path(out / f"{meta['stem']}.log").read_text()[-2000:], file=sys.stderr)
    return metas


def replay(jsonl: Path, config: StragglerDetector.Config) -> list[tuple[int, Any]]:
    """Feed a saved windows file to a fresh detector; (step, finding) for each finding."""
    detector = StragglerDetector(config)
    found = []
    for line in jsonl.read_text().splitlines():
        # by name: files saved by an older or newer monitor keep their own column order
        record = WindowRecord.from_saved(json.loads(line))
        found += [(record.step, f) for f in detector.update(RankWindow.from_record(record))]
    return found


def trace(jsonl: Path, rank: int, config: StragglerDetector.Config) -> str:
    """Window by window, ``rank``'s raise and recovery statistics in the compute signal (the
    demo's injection) while a saved windows file is replayed, as a markdown table."""
    detector = StragglerDetector(config)
    compute = 0  # SIGNAL_KINDS index
    lines = ["| step | excess | confirmed | raise evidence / h (k) | recovery evidence / h "
             "(k) | finding |", "|---|---|---|---|---|---|"]

    def pct(value: float | None) -> str:
        return "-" if value is None else f"{100 * value:.1f}"

    for line in jsonl.read_text().splitlines():
        record = WindowRecord.from_saved(json.loads(line))
        found = detector.update(RankWindow.from_record(record))
        stats = detector.statistics(rank)
        said = "; ".join(("cleared " if f.cleared else "raised ") + str(f.kind)
                         for f in found if f.rank == rank)
        if stats is None:
            lines.append(f"| {record.step} | (warming up) | | | | {said} |")
            continue
        lines.append(
            f"| {record.step} | {pct(stats['excess'][compute])}% | "
            f"{pct(stats['confirmed'][compute])}% | "
            f"{pct(stats['raise_evidence'][compute])} / {pct(stats['raise_interval'][compute])} "
            f"({pct(stats['raise_reference'][compute])}) | "
            f"{pct(stats['recovery_evidence'][compute])} / "
            f"{pct(stats['recovery_interval'][compute])} "
            f"({pct(stats['recovery_reference'][compute])}) | {said} |")
    return "\n".join(lines)


def score(meta: dict[str, Any], jsonl: Path, config: StragglerDetector.Config) -> Run:
    """Score one run from its saved windows."""
    paired = meta.get("paired_with")
    run = Run(slowdown=meta["slowdown"], slow_rank=meta["slow_rank"],
              slow_from=meta["slow_from"], seed=meta["seed"],
              load=(min(meta["load"]), max(meta["load"])),
              wall_seconds=meta["wall_seconds"], window=meta.get("window", 20),
              steps=meta.get("steps", 0), device=meta.get("device", "cpu"),
              parallel=meta.get("parallel", "ddp"),
              paired_with=paired[0] if paired else None)
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


def long_table(runs: list[Run], stems: dict[str, Run]) -> str:
    """Per slowdown of paired runs: named, windows onset→name, flaps, wrong ranks, the
    concurrent clean runs' findings, the load sampled while each pair ran."""
    lines = [
        "| slowdown | pairs | slowed steps per run | named | windows onset→name median / p95 "
        "(each run) | flaps | wrong ranks | false findings before onset | concurrent clean "
        "runs' findings | measured excess median (min-max) | load avg while running "
        "(min-max) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for slowdown in sorted({r.slowdown for r in runs if r.slowdown > 1.0}):
        cell = [r for r in runs if r.slowdown == slowdown]
        named = [r for r in cell if r.first_step is not None]
        delays = [r.windows_to_name for r in named]
        each = ", ".join("-" if r.windows_to_name is None else str(r.windows_to_name)
                         for r in cell)
        windows = (f"{np.median(delays):g} / {np.percentile(delays, 95):.1f} ({each})"
                   if delays else f"- ({each})")
        clean = [stems[r.paired_with] for r in cell if r.paired_with in stems]
        clean_findings = sum(c.false_findings for c in clean)
        measured = [r.measured for r in cell if r.measured is not None]
        spread = (f"{100 * np.median(measured):.1f}% ({100 * min(measured):.1f}-"
                  f"{100 * max(measured):.1f}%)" if measured else "-")
        loads = [x for r in cell for x in r.load]
        slowed = sorted({r.steps - r.slow_from for r in cell})
        lines.append(
            f"| {slowdown:g} ({100 * (slowdown - 1):.0f}%) | {len(cell)} | "
            f"{', '.join(map(str, slowed))} | {len(named)} of {len(cell)} | {windows} | "
            f"{sum(r.flaps for r in cell)} | {sum(len(r.wrong_ranks) for r in cell)} | "
            f"{sum(r.false_findings for r in cell)} | {clean_findings} in {len(clean)} runs | "
            f"{spread} | {min(loads):.1f}-{max(loads):.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=10, help="runs per slowdown (default 10)")
    p.add_argument("--slowdowns", default=",".join(f"{s:g}" for s in SLOWDOWNS))
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--slow-from", type=int, default=None,
                   help="first slowed step (default: a third of --steps)")
    p.add_argument("--window", type=int, default=20)
    p.add_argument("--world-size", type=int, default=4)
    p.add_argument("--first-run", type=int, default=0,
                   help="number of the first run (seeds and slowed ranks follow it): to add "
                        "runs to a DIR")
    p.add_argument("--paired", action="store_true",
                   help="run each slowed demo beside a concurrent clean demo (the long-run "
                        "benchmark of issue 26)")
    p.add_argument("--device", choices=["cpu", "emulated-async"], default="cpu",
                   help="the demos' --device (emulated-async: the device clock)")
    p.add_argument("--parallel", choices=["ddp", "fsdp"], default="ddp",
                   help="the demos' --parallel (fsdp: FSDP2)")
    p.add_argument("--out", help="keep the runs' windows and reports here (default: temp)")
    p.add_argument("--replay", metavar="DIR", help="only re-score the runs saved in DIR")
    p.add_argument("--trace", metavar="JSONL",
                   help="print one saved run's raise and recovery statistics window by window "
                        "(percent of the median rank's work per step), for --trace-rank")
    p.add_argument("--trace-rank", type=int, default=2)
    args = p.parse_args(argv)
    config = demo_config()
    if args.trace:
        print(trace(Path(args.trace), args.trace_rank, config))
        return 0
    out = Path(args.replay or args.out or tempfile.mkdtemp(prefix="laggard-demo-bench-"))
    out.mkdir(parents=True, exist_ok=True)
    slow_from = args.steps // 3 if args.slow_from is None else args.slow_from
    if not args.replay:
        slowdowns = [float(s) for s in args.slowdowns.split(",")]
        for i in range(args.first_run, args.first_run + args.runs):
            for j, slowdown in enumerate(slowdowns):  # interleaved: load falls on every cell
                rank = 1 + (i % (args.world_size - 1)) if slowdown > 1 else 0
                specs = [{"slowdown": slowdown, "slow_rank": rank, "seed": 100 + i}]
                if args.paired and slowdown > 1:  # a seed of its own: one file per clean run
                    specs.append({"slowdown": 1.0, "slow_rank": 0,
                                  "seed": 1000 + len(slowdowns) * i + j})
                metas = run_demos(out, specs, steps=args.steps, window=args.window,
                                  slow_from=slow_from, device=args.device,
                                  parallel=args.parallel)
                print(f"run {i} x{slowdown:g} rank {rank}: status "
                      f"{[m['status'] for m in metas]}, {metas[0]['wall_seconds']:.0f} s, "
                      f"load {metas[0]['load'][0]:.1f}-{metas[0]['load'][2]:.1f}", flush=True)
    runs, stems = [], {}
    for meta_path in sorted(out.glob("*.meta.json")):
        meta = json.loads(meta_path.read_text())
        jsonl = Path(str(meta_path).replace(".meta.json", ".jsonl"))
        if meta["status"] == 0 and jsonl.exists():
            run = score(meta, jsonl, config)
            runs.append(run)
            stems[meta.get("stem", meta_path.name.removesuffix(".meta.json"))] = run
    cfg = config
    print(f"\n## Real demo runs ({len(runs)} runs from {out}; windows of {args.window} steps, "
          f"detector: reference {cfg.reference:.3f}, min_windows {cfg.min_windows}, "
          f"false_alarm_windows {cfg.false_alarm_windows:g})\n")
    print(table(runs))
    paired = [r for r in runs if r.paired_with is not None and r.slowdown > 1.0]
    if paired:
        for device, parallel in sorted({(r.device, r.parallel) for r in paired}):
            print(f"\n### Long runs beside a concurrent clean demo (--device {device} "
                  f"--parallel {parallel})\n")
            print(long_table([r for r in paired if (r.device, r.parallel) == (device, parallel)],
                             stems))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
