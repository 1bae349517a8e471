"""Straggler detection quality: laggard's detector against two reference rules, one run.

Simulated synchronous jobs (``straggler_sim.py``) of 8 to 16,384 ranks, with log-normal jitter,
garbage-collection pauses, data stalls and whole-job drift, and one injected straggler (2 to 50%,
persistent or intermittent, in compute, data or link). Every method sees the same windows of
per-rank medians (what the monitor gathers, ``window_steps`` steps per window):

- **laggard**: :class:`laggard.detectors.straggler.StragglerDetector`, default config.
- **0.75 rule**: the published relative performance score (NVIDIA Resiliency Extension
  straggler detection: a section's score is the best rank's median time over this rank's median
  time; a rank is a straggler under 0.75), applied per section (compute, data, transfer) every
  window.
- **wall time**: the rank with the slowest median step wall time in each window.

Reported per method: detection rate (injected rank flagged within 100 steps of onset), median
and 95th percentile steps to detection (slow steps elapsed when first flagged), the share
detected within the target (20 steps at 10%, 50 steps at 5%), false alarms per million clean
rank-steps (a false alarm = a clean rank newly flagged), and CPU time per window.

Usage::

    python benchmarks/straggler_quality.py            # full run, a few minutes on 2 cores
    python benchmarks/straggler_quality.py --quick    # smoke run, seconds
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from straggler_sim import CAUSE_KIND, JobModel, SimWindow, Straggler, simulate  # noqa: E402

from laggard.detectors.stats import row_nanmedian  # noqa: E402
from laggard.detectors.straggler import RankWindow, StragglerDetector  # noqa: E402

WINDOW_STEPS = 5
STEPS_AFTER_ONSET = 100
TARGET_STEPS = {0.10: 20, 0.05: 50}
INTERMITTENT = {"period_steps": 20, "on_steps": 10}


@dataclass(slots=True)
class Summaries:
    """One window as every method sees it: per-rank medians over the window's steps."""

    window: RankWindow
    compute: np.ndarray
    data: np.ndarray
    transfer: np.ndarray
    step_seconds: np.ndarray


def summarize(sim: SimWindow) -> Summaries:
    window = sim.rank_window(summarized=True)
    return Summaries(
        window=window,
        compute=window.compute_seconds[:, 0],
        data=window.data_seconds[:, 0],
        transfer=window.transfer_seconds[:, 0],
        step_seconds=row_nanmedian(sim.step_seconds),
    )


class Laggard:
    name = "laggard"

    def __init__(self) -> None:
        self.detector = StragglerDetector()
        self.job_slowdowns = 0

    def update(self, s: Summaries) -> dict[int, str]:
        raised = {}
        for f in self.detector.update(s.window):
            if f.evidence.get("cleared"):
                continue
            if f.rank is None:
                self.job_slowdowns += 1
            else:
                raised[f.rank] = f.kind
        return raised


class RelativeScoreRule:
    """Best rank's median over this rank's median, per section; straggler under 0.75."""

    name = "0.75 rule"
    kinds = ("compute", "data", "communication")

    def __init__(self, threshold: float = 0.75) -> None:
        self.threshold = threshold
        self.flagged = np.zeros(0, dtype=bool)
        self.job_slowdowns = 0

    def update(self, s: Summaries) -> dict[int, str]:
        sections = np.stack([s.compute, s.data, s.transfer], axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            scores = np.nanmin(sections, axis=0) / sections
        low = scores < self.threshold
        flagged = low.any(axis=1)
        previous = self.flagged if self.flagged.size == flagged.size else np.zeros_like(flagged)
        self.flagged = flagged
        new = np.flatnonzero(flagged & ~previous)
        return {int(r): self.kinds[int(np.argmin(scores[r]))] for r in new}


class WallTimeRule:
    """The rank with the slowest median step wall time is named, every window."""

    name = "wall time"

    def __init__(self) -> None:
        self.current = -1
        self.job_slowdowns = 0

    def update(self, s: Summaries) -> dict[int, str]:
        slowest = int(np.argmax(s.step_seconds))
        new = {} if slowest == self.current else {slowest: "unknown"}
        self.current = slowest
        return new


METHODS: tuple[Callable[[], object], ...] = (Laggard, RelativeScoreRule, WallTimeRule)


@dataclass(slots=True)
class Outcome:
    """One method on one trial."""

    detected_after: int | None  # slow steps elapsed when the injected rank was first flagged
    cause_correct: bool
    false_alarms: int
    clean_rank_steps: int
    job_slowdowns: int
    cpu_seconds: list[float] = field(default_factory=list)
    false_kinds: list[str] = field(default_factory=list)  # kind of each false alarm


def run_trial(model: JobModel, steps: int) -> dict[str, Outcome]:
    """Run every method on one simulated job."""
    methods = [make() for make in METHODS]
    injected = model.stragglers[0] if model.stragglers else None
    first: dict[str, tuple[int, str] | None] = {m.name: None for m in methods}
    false_alarms: dict[str, list[str]] = defaultdict(list)
    cpu: dict[str, list[float]] = defaultdict(list)
    for sim in simulate(model, steps=steps, window_steps=WINDOW_STEPS):
        s = summarize(sim)
        for method in methods:
            start = time.process_time()
            raised = method.update(s)
            cpu[method.name].append(time.process_time() - start)
            for rank, kind in raised.items():
                if injected and rank == injected.rank and sim.step >= injected.start_step:
                    if first[method.name] is None:
                        first[method.name] = (sim.step - injected.start_step + 1, kind)
                else:
                    false_alarms[method.name].append(kind)
    slow_steps = steps - injected.start_step if injected else 0
    out = {}
    for method in methods:
        hit = first[method.name]
        out[method.name] = Outcome(
            detected_after=hit[0] if hit else None,
            cause_correct=bool(hit and injected and hit[1] == CAUSE_KIND[injected.cause]),
            false_alarms=len(false_alarms[method.name]),
            clean_rank_steps=model.world_size * steps - slow_steps,
            job_slowdowns=method.job_slowdowns,
            cpu_seconds=cpu[method.name],
            false_kinds=false_alarms[method.name],
        )
    return out


def straggler_trial(
    *, world_size: int, cause: str, slowdown: float, jitter: float, intermittent: bool,
    seed: int,
) -> dict[str, Outcome]:
    rng = np.random.default_rng(seed)
    onset = 50 + int(rng.integers(0, WINDOW_STEPS))  # not aligned with windows
    straggler = Straggler(
        rank=int(rng.integers(0, world_size)), cause=cause, slowdown=slowdown,
        start_step=onset, **(INTERMITTENT if intermittent else {}),
    )
    model = JobModel(world_size=world_size, jitter=jitter, stragglers=[straggler], seed=seed)
    return run_trial(model, onset + STEPS_AFTER_ONSET)


# -- aggregation -------------------------------------------------------------------------------

@dataclass(slots=True)
class Cell:
    outcomes: dict[str, list[Outcome]] = field(default_factory=lambda: defaultdict(list))

    def add(self, trial: dict[str, Outcome]) -> None:
        for name, outcome in trial.items():
            self.outcomes[name].append(outcome)

    def detection(self, name: str, within: int | None = None) -> float:
        runs = self.outcomes[name]
        hits = [o for o in runs if o.detected_after is not None
                and (within is None or o.detected_after <= within)]
        return len(hits) / len(runs)

    def steps(self, name: str) -> tuple[float, float] | None:
        found = [o.detected_after for o in self.outcomes[name] if o.detected_after is not None]
        if not found:
            return None
        return float(np.median(found)), float(np.percentile(found, 95))

    def cause(self, name: str) -> float:
        found = [o for o in self.outcomes[name] if o.detected_after is not None]
        return sum(o.cause_correct for o in found) / len(found) if found else float("nan")


def fmt_steps(value: tuple[float, float] | None) -> str:
    return "-" if value is None else f"{value[0]:.0f} / {value[1]:.0f}"


def pct(x: float) -> str:
    return "-" if x != x else f"{100 * x:.0f}%"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: few trials")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--trials", type=int, default=4,
                        help="trials per cell of the 512-rank detection grid (default 4)")
    args = parser.parse_args(argv)
    quick = args.quick
    started, started_cpu = time.perf_counter(), time.process_time()
    names = [m.name for m in (Laggard, RelativeScoreRule, WallTimeRule)]
    seed = args.seed * 1_000_000

    # 1. Detection grid at 512 ranks: slowdown x cause x pattern x jitter.
    slowdowns = (0.02, 0.05, 0.10, 0.20, 0.50)
    jitters = (0.01, 0.02, 0.05)
    trials = 2 if quick else args.trials
    grid: dict[tuple, Cell] = defaultdict(Cell)
    clean = Cell()  # every trial's clean ranks count towards false alarms
    for slowdown in slowdowns:
        for cause in ("compute", "data", "link"):
            for intermittent in (False, True):
                for jitter in jitters:
                    for _ in range(trials):
                        seed += 1
                        trial = straggler_trial(
                            world_size=512, cause=cause, slowdown=slowdown, jitter=jitter,
                            intermittent=intermittent, seed=seed,
                        )
                        grid[(slowdown, cause, intermittent, jitter)].add(trial)
                        clean.add(trial)

    def merged(**fixed: object) -> Cell:
        cell = Cell()
        for (slowdown, cause, intermittent, jitter), c in grid.items():
            key = {"slowdown": slowdown, "cause": cause, "intermittent": intermittent,
                   "jitter": jitter}
            if all(key[k] == v for k, v in fixed.items()):
                for name, runs in c.outcomes.items():
                    cell.outcomes[name] += runs
        return cell

    print(f"## Straggler detection quality (`benchmarks/straggler_quality.py`"
          f"{' --quick' if quick else ''})\n")
    print(f"Windows of {WINDOW_STEPS} steps (per-rank medians gathered), {trials} trials per "
          "cell, straggler onset at step 50-54 (not window-aligned), "
          f"{STEPS_AFTER_ONSET} steps observed after onset. Each cell: detection rate / "
          "median / p95 steps to detection (slow steps elapsed when first flagged).\n")

    print("### Persistent stragglers, 512 ranks, all three causes, by jitter\n")
    print("| slowdown | jitter | " + " | ".join(
        f"{n}: detected / within target / median / p95 steps" for n in names)
        + " | laggard cause right |")
    print("|" + "---|" * (3 + len(names)))
    for slowdown in slowdowns:
        for jitter in jitters:
            cell = merged(slowdown=slowdown, intermittent=False, jitter=jitter)
            target = TARGET_STEPS.get(slowdown)
            cols = []
            for n in names:
                within = pct(cell.detection(n, target)) if target else "-"
                cols.append(f"{pct(cell.detection(n))} / {within} / {fmt_steps(cell.steps(n))}")
            print(f"| {slowdown:.0%} | {jitter:.0%} | " + " | ".join(cols)
                  + f" | {pct(cell.cause('laggard'))} |")

    print("\n### By cause (persistent, jitter 1-5% pooled)\n")
    print("| slowdown | cause | " + " | ".join(f"{n}: detected / median / p95" for n in names)
          + " | laggard cause right |")
    print("|" + "---|" * (3 + len(names)))
    for slowdown in slowdowns:
        for cause in ("compute", "data", "link"):
            cell = merged(slowdown=slowdown, cause=cause, intermittent=False)
            cols = [f"{pct(cell.detection(n))} / {fmt_steps(cell.steps(n))}" for n in names]
            print(f"| {slowdown:.0%} | {cause} | " + " | ".join(cols)
                  + f" | {pct(cell.cause('laggard'))} |")

    print(f"\n### Intermittent stragglers (slow {INTERMITTENT['on_steps']} of every "
          f"{INTERMITTENT['period_steps']} steps), 512 ranks, causes pooled\n")
    print("| slowdown | jitter | " + " | ".join(f"{n}: detected / median / p95" for n in names)
          + " |")
    print("|" + "---|" * (2 + len(names)))
    for slowdown in slowdowns:
        for jitter in jitters:
            cell = merged(slowdown=slowdown, intermittent=True, jitter=jitter)
            cols = [f"{pct(cell.detection(n))} / {fmt_steps(cell.steps(n))}" for n in names]
            print(f"| {slowdown:.0%} | {jitter:.0%} | " + " | ".join(cols) + " |")

    # 2. Scale: compute stragglers from 8 to 16,384 ranks, jitter 2%.
    sizes = (8, 64, 512, 4096, 16384)
    scale_trials = {8: 16, 64: 8, 512: 4, 4096: 2, 16384: 1}
    print("\n### World size (persistent compute straggler, jitter 2%)\n")
    print("| ranks | slowdown | trials | " + " | ".join(
        f"{n}: detected / median / p95" for n in names) + " |")
    print("|" + "---|" * (3 + len(names)))
    cpu_at: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    scale_cells: dict[int, Cell] = defaultdict(Cell)
    for size in sizes:
        for slowdown in (0.05, 0.10):
            cell = Cell()
            n_trials = 1 if quick and size > 512 else (2 if quick else scale_trials[size])
            for _ in range(n_trials):
                seed += 1
                trial = straggler_trial(world_size=size, cause="compute", slowdown=slowdown,
                                        jitter=0.02, intermittent=False, seed=seed)
                cell.add(trial)
                scale_cells[size].add(trial)
                for name, outcome in trial.items():
                    cpu_at[size][name] += outcome.cpu_seconds
            cols = [f"{pct(cell.detection(n))} / {fmt_steps(cell.steps(n))}" for n in names]
            print(f"| {size} | {slowdown:.0%} | {n_trials} | " + " | ".join(cols) + " |")

    # 3. Clean jobs, the harshest noise: 5% jitter, frequent pauses and stalls, drift.
    clean_trials = {8: 40, 64: 10, 512: 4, 4096: 2, 16384: 1}
    clean_runs: dict[int, Cell] = defaultdict(Cell)
    for size in sizes:
        for _ in range(1 if quick else clean_trials[size]):
            seed += 1
            model = JobModel(world_size=size, jitter=0.05, pause_probability=0.005,
                             stall_probability=0.002, seed=seed)
            trial = run_trial(model, 300)
            clean_runs[size].add(trial)
            for name, outcome in trial.items():
                cpu_at[size][name] += outcome.cpu_seconds

    print("\n### False alarms per million clean rank-steps\n")
    print("Clean jobs: 300 steps, jitter 5%, a GC pause (50-500 ms) per 200 rank-steps, a data "
          "stall (20-200 ms, 1-3 steps) per 500 rank-steps, ±3% whole-job drift. "
          "\"All trials\" adds the clean ranks of every straggler trial above (jitter 1-5%).\n")
    print("| ranks | clean rank-steps | " + " | ".join(names) + " | laggard job_slowdown |")
    print("|" + "---|" * (3 + len(names)))

    def fp_row(label: str, cells: list[Cell]) -> None:
        outcomes = {n: [o for c in cells for o in c.outcomes[n]] for n in names}
        rank_steps = sum(o.clean_rank_steps for o in outcomes["laggard"])
        rates = []
        for n in names:
            alarms = sum(o.false_alarms for o in outcomes[n])
            rates.append(f"{1e6 * alarms / rank_steps:.2f} ({alarms})")
        jobs = sum(o.job_slowdowns for o in outcomes["laggard"])
        print(f"| {label} | {rank_steps:,} | " + " | ".join(rates) + f" | {jobs} |")

    for size in sizes:
        fp_row(f"{size} (clean jobs)", [clean_runs[size]])
    everything = [clean, *scale_cells.values(), *clean_runs.values()]
    fp_row("all trials", everything)
    kinds = [k for c in everything for o in c.outcomes["laggard"] for k in o.false_kinds]
    print(f"\nlaggard false alarms by kind: {dict(sorted(Counter(kinds).items())) or 'none'}")

    # 4. Whole-job slowdown: every rank 25% slower from step 100.
    whole = Cell()
    for _ in range(2 if quick else 8):
        seed += 1
        model = JobModel(world_size=512, jitter=0.02, job_slowdown=(100, 1.25), seed=seed)
        whole.add(run_trial(model, 200))
    blamed = {n: sum(o.false_alarms for o in whole.outcomes[n]) for n in names}
    reported = sum(o.job_slowdowns > 0 for o in whole.outcomes["laggard"])
    print("\n### Whole-job slowdown (all 512 ranks 25% slower from step 100)\n")
    print("Ranks blamed: " + ", ".join(f"{n} {blamed[n]}" for n in names)
          + f"; laggard reported `job_slowdown` in {reported} of {len(whole.outcomes['laggard'])}"
          " trials.\n")

    # 5. CPU time per window.
    print("### Detector CPU time per window (process time; same windows for every method)\n")
    print("| ranks | " + " | ".join(f"{n} median / p95 ms" for n in names)
          + " | laggard / 0.75 rule |")
    print("|" + "---|" * (2 + len(names)))
    for size in sizes:
        cols, medians = [], {}
        for n in names:
            values = np.array(cpu_at[size][n]) * 1e3
            medians[n] = float(np.median(values))
            cols.append(f"{medians[n]:.2f} / {np.percentile(values, 95):.2f}")
        ratio = medians["laggard"] / max(medians["0.75 rule"], 1e-9)
        print(f"| {size} | " + " | ".join(cols) + f" | {ratio:.1f}x |")

    # Targets.
    print("\n### Targets\n")
    ten = merged(slowdown=0.10, intermittent=False)
    five = merged(slowdown=0.05, intermittent=False)
    low_ten = _pool(merged(slowdown=0.10, intermittent=False, jitter=0.01),
                    merged(slowdown=0.10, intermittent=False, jitter=0.02))
    low_five = _pool(merged(slowdown=0.05, intermittent=False, jitter=0.01),
                     merged(slowdown=0.05, intermittent=False, jitter=0.02))
    lines = [
        ("10% within 20 steps, all jitters", ten.detection("laggard", 20), 1.0),
        ("10% within 20 steps, jitter 1-2%", low_ten.detection("laggard", 20), 1.0),
        ("5% within 50 steps, all jitters", five.detection("laggard", 50), 0.95),
        ("5% within 50 steps, jitter 1-2%", low_five.detection("laggard", 50), 0.95),
    ]
    for label, value, target in lines:
        verdict = "met" if value >= target else "SHORT"
        print(f"- laggard {label}: {pct(value)} (target {pct(target)}): {verdict}")
    for slowdown, cell in ((0.10, ten), (0.05, five)):
        print(f"- detection at {slowdown:.0%} (persistent, all causes and jitters): "
              + ", ".join(f"{n} {pct(cell.detection(n))}" for n in names))
    p95_16k = float(np.percentile(np.array(cpu_at[16384]["laggard"]) * 1e3, 95))
    print(f"- laggard CPU per window at 16,384 ranks, p95: {p95_16k:.1f} ms (target < 50 ms)")
    print(f"\nRun time {time.perf_counter() - started:.0f} s wall, "
          f"{time.process_time() - started_cpu:.0f} s CPU.")
    return 0


def _pool(*cells: Cell) -> Cell:
    pooled = Cell()
    for cell in cells:
        for name, runs in cell.outcomes.items():
            pooled.outcomes[name] += runs
    return pooled


if __name__ == "__main__":
    raise SystemExit(main())
