"""Whoever costs the job time, whatever the shape (issue 33): real ``laggard demo`` pairs.

Each run is a pair of real demos at once (as ``benchmarks/demo_detection.py --paired``): one
with a shape of slowness injected from ``--slow-from`` to the end, one clean beside it (the load
a slow rank meets on a shared machine, and a second job whose findings must stay empty). Shapes
are named on the command line as a kind and a magnitude in percent (``stall10``: a stall
costing the job about 10% of its time):

========== ==================================================================================
kind       demo flags (p = the percent / 100; T, C, rho from the calibration, below)
========== ==================================================================================
steady     ``--slow-rank R --slowdown 1+p`` (today's benchmark; p is the rank's extra compute)
steadycost ``--slow-rank R --slowdown 1 + p*T/(C*rho)``: a steady rank costing the job p
two        ``--slow-rank R1,R2 --slowdown 1+p`` (default p = 25%)
node       ``--nodes 2 --inject node=node:N,factor:1+p`` (half the ranks; p their extra compute)
moving     ``--inject moving=every:E,factor:1+p,rank:R`` (E = ``--moving-every``)
stall      ``--inject stall=rank:R,every:N,seconds:S``, S = p*N*T/rho CPU seconds
sleep      the same stall asleep (``mode:sleep``), S = p*N*T wall seconds
burst      ``--inject burst=rank:R,steps:K,every:M,factor:F``, F = 1 + p*T*(M/K)/(C*rho)
========== ==================================================================================

How the cost is sized. The cost-sized shapes (stall, sleep, burst, steadycost) make the job
lose p of its clean step time T on average: a stall of S wall seconds every N steps holds the
other ranks S seconds once in N steps (S/N per step = p*T). The demo's injected work is CPU time
(the stand-in for GPU time), done at the end of the rank's backward pass while the others wait
for it, and a CPU second of it costs them rho wall seconds on a loaded host: rho is measured,
not assumed, by a calibration pair run before the pairs (``--calibrate-steps``): a clean demo
(T, and C, the median rank's compute + data CPU seconds per step) beside a demo whose rank 1
stalls :data:`PROBE_STALL_SECONDS` CPU seconds every :data:`PROBE_STALL_EVERY` steps (rho = the
others' extra wait on the stall steps over the stall's CPU seconds, the report's ``effect``).
So a compute stall is S = p*N*T/rho CPU seconds, and a burst adds (F-1)*C CPU seconds on K of
every M steps: F = 1 + p*T*(M/K)/(C*rho). Each later pair is sized with the medians of the
last 5 samples of each figure (:class:`RunningCalibration`): T and C from each pair's clean
run, rho from each stall, burst or steady run (the load changes over a long matrix: rho was
1.7 in the probe and 2.8 in the stall beside it 3 minutes later). ``--calibration T,C,RHO``
skips the calibration pair; each run's JSON keeps the figures it was sized with.

The factor shapes (steady, two, node, moving) keep the demo's meaning, p more compute on each
slowed rank (today's 10% / 25% figures), and the plan gives their expected job cost,
(F-1)*C*rho/T: on this 2-core machine the demo's compute is a small part of its step (the
collective and the contention the rest), so a steady 10% costs the job a few percent.

How the cost is measured, per run, after it (the demo report's ``effect``, each injected rank's
steps measured as they ran): the job's seconds lost per step after the onset is the other
ranks' median exposed wait on the injected steps less on untouched ones, times the injected
steps, over the steps after the onset (the largest rank's for simultaneous ranks, summed over
the ranks a moving slowness visits), divided by the concurrent clean run's median step time:
``cost`` in the table. ``job slower`` is the windows' own: the injected run's mean step time
(``step_sum_seconds / steps_count``) after the onset over before, minus 1, beside the same of
its clean twin. It holds what the waits miss and the twin shows the load's drift, but neither
is the cost alone: on 2 shared cores the injected CPU work also slows every rank's own work
(and the twin's), a sleeping rank leaves its cores to the others, and the load drifts (in one
400-step check, after the onset of a 10% sleep stall the stalled run's steps were 9% shorter
than before it and its twin's 25%).

Scored per run from the report's ``finding_events`` (the findings the run raised and cleared):
named (every injected rank named after the onset; a node: a ``node`` finding or all its ranks;
a moving slowness: a ``moving`` finding or a rank it visited), windows from onset to name (the
windows holding an injected step, up to the one that named it; 3 is the straggler detector's
floor), wrong ranks (rank findings naming a rank that nothing injected, before or after the
onset), findings on an injected rank before the onset, flaps (a finding on an injected subject
cleared while the injection still acts on it and raised again later), ``job_slowdown`` raised
while an injected rank or node was named, and every finding of the concurrent clean run. The
load average is sampled every 5 s while each pair runs.

Usage (the full matrix, the default shapes: 14 shapes x 2 pairs; a pair of 400 steps took
93-107 s at load 10-14, so about 2.5 min per pair of 600 steps, 70-80 min in all)::

    python benchmarks/shape_detection.py --out DIR --runs 2 --steps 600 --slow-from 200 \
        --shapes stall10,stall5,sleep10,sleep5,burst10,burst5,node25,node10,two,moving25,\
moving10,steady10,steady25,steadycost10
    python benchmarks/shape_detection.py --out DIR --runs 1 --first-run 2 ...   # more pairs
    python benchmarks/shape_detection.py --replay DIR     # re-score saved reports, seconds

The machine is shared: each pair's load average is written beside it.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from demo_detection import LoadSampler, demo_command  # noqa: E402  (a sibling script)

from laggard.detectors.window import WindowRecord  # noqa: E402

#: Shape kinds and their default magnitude (percent) when a name gives none.
KINDS = {"steady": 10, "steadycost": 10, "two": 25, "node": 25, "moving": 25, "stall": 10,
         "sleep": 10, "burst": 10}
#: The default shapes: every kind at the issue's two targets (10% and 5% of the job's time),
#: the steady ones at today's 10% and 25% and one steady rank costing the job 10%.
DEFAULT_SHAPES = ("stall10,stall5,sleep10,sleep5,burst10,burst5,node25,node10,two,moving25,"
                  "moving10,steady10,steady25,steadycost10")
_NAME = re.compile(r"^(?P<kind>[a-z]+?)(?P<percent>\d+(\.\d+)?)?$")


@dataclass(frozen=True, slots=True)
class Shape:
    """A named shape: ``kind`` (:data:`KINDS`) and ``percent`` (its cost or factor, percent)."""

    name: str
    kind: str
    percent: float

    @classmethod
    def parse(cls, name: str) -> Shape:
        """``stall10`` -> kind stall, 10%; ``two`` -> kind two, its default 25%.

        Raises:
            ValueError: an unknown kind or a magnitude outside (0, 100].
        """
        match = _NAME.match(name.strip())
        if not match or match["kind"] not in KINDS:
            raise ValueError(f"unknown shape {name!r}: a kind ({', '.join(KINDS)}) and an "
                             "optional percent, e.g. stall10")
        percent = float(match["percent"]) if match["percent"] else float(KINDS[match["kind"]])
        if not 0 < percent <= 100:
            raise ValueError(f"shape {name!r}: percent must be in (0, 100]")
        return cls(name.strip(), match["kind"], percent)


@dataclass(frozen=True, slots=True)
class Calibration:
    """The demo's step as the cost sizing reads it (module docstring, "How the cost is sized").

    Attributes:
        step_seconds: T, the clean demo's median rank's median step wall time (seconds).
        work_cpu_seconds: C, its median rank's median compute + data per step (CPU seconds:
            the demo's phase clock).
        extra_wall_per_cpu: rho, the wall seconds the other ranks wait per CPU second of extra
            work a rank does at the end of its backward pass (where every injection acts),
            measured on a probe stall.
    """

    step_seconds: float
    work_cpu_seconds: float
    extra_wall_per_cpu: float

    @classmethod
    def from_reports(cls, clean: dict[str, Any], probe: dict[str, Any]) -> Calibration:
        """From a clean demo's ``--report`` (:func:`clean_step`) and the report of a demo
        beside it with a compute stall injected (:func:`wait_per_cpu`).

        Raises:
            ValueError: a report without those figures.
        """
        ratios = wait_per_cpu(probe)
        if not ratios:
            raise ValueError("the probe report has no measured stall")
        return cls(*clean_step(clean), max(0.1, float(np.median(ratios))))


def clean_step(report: dict[str, Any]) -> tuple[float, float]:
    """T and C of a clean demo's report: the median rank's median step wall time and compute +
    data CPU time (seconds, the report's per-rank window medians).

    Raises:
        ValueError: a report without them.
    """
    ranks = report.get("ranks") or []

    def median(key: str) -> float:
        values = [r[key] for r in ranks if r.get(key) is not None]
        if not values:
            raise ValueError(f"the clean report has no {key}")
        return float(np.median(values))

    return (median("step_seconds_median"),
            median("compute_seconds_median") + median("data_seconds_median"))


#: The shapes whose ``effect`` measures rho: extra CPU work on one rank at a time on its own
#: steps (a sleep is wall time; a moving slowness's untouched steps have another rank slowed).
_RHO_SHAPES = ("stall", "burst", "steady")


def wait_per_cpu(report: dict[str, Any]) -> list[float]:
    """rho as a report measured it, per injected rank: the others' median wait on its injected
    steps less on its untouched ones, over the CPU seconds injected per step ([] for none)."""
    return [(e["others_wait_seconds_on"] - e["others_wait_seconds_off"]) / e["injected_seconds"]
            for shape in (report.get("injected") or {}).get("shapes") or []
            if shape["shape"] in _RHO_SHAPES and "mode:sleep" not in shape["injection"]
            for e in shape.get("effect") or []
            if e and e.get("injected_seconds") and e.get("others_wait_seconds_on") is not None
            and e.get("others_wait_seconds_off") is not None]


class RunningCalibration:
    """The calibration each pair is sized with: T and C from the latest clean runs, rho from
    the latest runs that measure it (:func:`wait_per_cpu`), medians of the last ``keep`` of
    each, so the sizing follows the machine's load through a long matrix.

    Args:
        first: the calibration pair's figures (the first samples).
        keep: samples kept of each figure.
    """

    def __init__(self, first: Calibration, keep: int = 5) -> None:
        self._steps = [first.step_seconds]
        self._work = [first.work_cpu_seconds]
        self._rho = [first.extra_wall_per_cpu]
        self._keep = keep

    def add(self, injected: dict[str, Any] | None, clean: dict[str, Any] | None) -> None:
        """Take a finished pair's reports (None: that demo failed)."""
        if clean is not None:
            try:
                step, work = clean_step(clean)
            except ValueError:
                pass
            else:
                self._steps = [*self._steps, step][-self._keep:]
                self._work = [*self._work, work][-self._keep:]
        if injected is not None:
            rho = [r for r in wait_per_cpu(injected) if r > 0]
            if rho:
                self._rho = [*self._rho, float(np.median(rho))][-self._keep:]

    @property
    def current(self) -> Calibration:
        """The figures the next pair is sized with."""
        return Calibration(float(np.median(self._steps)), float(np.median(self._work)),
                           max(0.1, float(np.median(self._rho))))


@dataclass(frozen=True, slots=True)
class Periods:
    """The intermittent shapes' periods (steps)."""

    stall_every: int = 25
    burst_steps: int = 10
    burst_every: int = 60
    moving_every: int = 100


def shape_flags(shape: Shape, cal: Calibration, periods: Periods, *, run: int,
                world_size: int) -> tuple[float, str, list[str], dict[str, Any]]:
    """The injected demo's ``--slowdown``, ``--slow-rank`` and other flags for ``shape`` in run
    number ``run`` (the injected rank turns with it: 1, 2, ..., never rank 0, which also runs
    the analysis; a node alternates), and the plan (spec, the sizing's figures).

    Returns:
        (slowdown, slow_rank as the flag's text, extra flags, plan dict).
    """
    p = shape.percent / 100
    rank = 1 + run % (world_size - 1)
    plan: dict[str, Any] = {"kind": shape.kind, "percent": shape.percent}
    extra: list[str] = []
    slowdown, slow_rank = 1.0, str(rank)
    if shape.kind == "steady":
        slowdown = 1 + p
    elif shape.kind == "two":
        other = 1 + (run + 1) % (world_size - 1)
        slowdown, slow_rank = 1 + p, f"{rank},{other}"
    elif shape.kind == "node":
        node = f"node-{1 - run % 2}"
        extra = ["--nodes", "2", "--inject", f"node=node:{node},factor:{1 + p:g}"]
    elif shape.kind == "moving":
        extra = ["--inject", f"moving=every:{periods.moving_every},factor:{1 + p:g},rank:{rank}"]
    elif shape.kind == "steadycost":  # a steady rank costing the job p
        slowdown = 1 + p * cal.step_seconds / (cal.work_cpu_seconds * cal.extra_wall_per_cpu)
    elif shape.kind in ("stall", "sleep"):
        wall = p * periods.stall_every * cal.step_seconds  # S/N = p*T
        seconds = wall if shape.kind == "sleep" else wall / cal.extra_wall_per_cpu
        plan.update(stall_wall_seconds=wall, stall_seconds=seconds)
        mode = ",mode:sleep" if shape.kind == "sleep" else ""
        extra = ["--inject", f"stall=rank:{rank},every:{periods.stall_every},"
                             f"seconds:{min(60.0, seconds):.4f}{mode}"]
    elif shape.kind == "burst":
        factor = 1 + (p * cal.step_seconds * periods.burst_every / periods.burst_steps
                      / (cal.work_cpu_seconds * cal.extra_wall_per_cpu))
        plan.update(burst_factor=factor)
        extra = ["--inject", f"burst=rank:{rank},steps:{periods.burst_steps},"
                             f"every:{periods.burst_every},factor:{min(20.0, factor):.3f}"]
    if shape.kind in ("steady", "steadycost", "two", "node", "moving"):
        # the job's expected loss: the extra CPU of one slowed rank per step, in the others'
        # wall time, over the step (several slowed at once cost about one: the last arrival)
        plan["expected_cost"] = ((slowdown if slowdown > 1 else 1 + p) - 1) \
            * cal.work_cpu_seconds * cal.extra_wall_per_cpu / cal.step_seconds
    else:
        plan["expected_cost"] = p
    spec = " ".join(([f"--slow-rank {slow_rank} --slowdown {slowdown:g}"] if slowdown > 1
                     else []) + extra)
    plan["flags"] = spec
    return slowdown, slow_rank, extra, plan


# ------------------------------------------------------------------------------- running
def run_pair(out: Path, shape: Shape, cal: Calibration, periods: Periods, *, run: int,
             steps: int, window: int, slow_from: int, world_size: int) -> list[dict[str, Any]]:
    """One injected demo and one clean demo at once; their windows, reports, logs and a
    ``.meta.json`` each land in ``out``."""
    slowdown, slow_rank, extra, plan = shape_flags(shape, cal, periods, run=run,
                                                    world_size=world_size)
    stems = {"injected": out / f"{shape.name}_run{run}",
             "clean": out / f"{shape.name}_run{run}_clean"}
    commands = {
        # slow_rank as the flag's text: "1,3" for two ranks
        "injected": demo_command(stems["injected"], slowdown=slowdown,
                                 slow_rank=slow_rank,  # type: ignore[arg-type]
                                 seed=100 + run, steps=steps, window=window,
                                 slow_from=slow_from, device="cpu") + extra,
        "clean": demo_command(stems["clean"], slowdown=1.0, slow_rank=0, seed=1000 + run,
                              steps=steps, window=window, slow_from=slow_from, device="cpu"),
    }
    sampler = LoadSampler()
    started = time.perf_counter()
    procs = {}
    for role, command in commands.items():
        log = open(f"{stems[role]}.log", "w")  # noqa: SIM115 (closed below, after the run)
        procs[role] = (log, subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT))
    metas = []
    for role, (log, proc) in procs.items():
        try:
            status = proc.wait(timeout=3600)
        except subprocess.TimeoutExpired:
            proc.kill()
            status = proc.wait()
        log.close()
        metas.append({"stem": stems[role].name, "role": role, "status": status,
                      "wall_seconds": time.perf_counter() - started})
    load = sampler.stop()
    for meta in metas:
        meta.update(shape=shape.name, run=run, steps=steps, window=window, slow_from=slow_from,
                    load=load, calibration=asdict(cal),
                    plan=plan,
                    # the demo's flags, its files named relative to ``out``
                    command=[c.replace(f"{out}/", "") for c in commands[meta["role"]][3:]],
                    paired_with=stems["clean" if meta["role"] == "injected" else
                                      "injected"].name)
        (out / f"{meta['stem']}.meta.json").write_text(json.dumps(meta, indent=1))
        if meta["status"] != 0:
            print((out / f"{meta['stem']}.log").read_text()[-2000:], file=sys.stderr)
    return metas


#: The calibration's probe stall: CPU seconds, every so many steps (a few % of a step's time).
PROBE_STALL_SECONDS, PROBE_STALL_EVERY = 0.05, 10


def calibrate(out: Path, *, steps: int, window: int) -> Calibration:
    """Two short demos at once, as the pairs run (8 ranks on the machine's cores: a demo alone
    steps about twice as fast): a clean one and a probe with a compute stall on rank 1 from its
    second window (:meth:`Calibration.from_reports`).

    Raises:
        RuntimeError: a demo failed.
    """
    probe = ["--inject", f"stall=rank:1,every:{PROBE_STALL_EVERY},"
                         f"seconds:{PROBE_STALL_SECONDS}"]
    procs = []
    for name, extra in (("calibration_clean", []), ("calibration_probe", probe)):
        stem = out / name
        command = demo_command(stem, slowdown=1.0, slow_rank=0, seed=7, steps=steps,
                               window=window, slow_from=window, device="cpu") + extra
        log = open(f"{stem}.log", "w")  # noqa: SIM115 (closed below, after the run)
        procs.append((stem, log, subprocess.Popen(command, stdout=log,
                                                  stderr=subprocess.STDOUT)))
    for stem, log, proc in procs:
        status = proc.wait()
        log.close()
        if status != 0:
            raise RuntimeError(f"the calibration demo failed (status {status}): {stem}.log")
    return Calibration.from_reports(*(json.loads(Path(f"{stem}.json").read_text())
                                      for stem, _, _ in procs))


# ------------------------------------------------------------------------------- scoring
def _who(event: dict[str, Any]) -> str:
    """A finding's subject in words: its rank, its node or ``job``."""
    return str(event["rank"]) if event.get("rank") is not None else event.get("node") or "job"


def _subject(event: dict[str, Any]) -> tuple[Any, ...]:
    return (event.get("detector"), event.get("kind"), event.get("rank"), event.get("node"))


def _acts(injected: dict[str, Any], event: dict[str, Any], step: int, steps: int,
          world_size: int) -> bool:
    """Whether the injection still acts on the event's subject at ``step`` (every shape lasts to
    the end of the run; a moving one acts on a rank only during its turn)."""
    if step >= steps:
        return False
    for shape in injected.get("shapes") or []:
        spec = shape.get("injection", "")
        if shape["shape"] == "moving" and event.get("rank") is not None:
            every = int(re.search(r"every:(\d+)", spec)[1])  # type: ignore[index]
            first = int(re.search(r"rank:(\d+)", spec)[1])  # type: ignore[index]
            turn = (step - shape["from_step"]) // every
            if (first + turn) % world_size == event["rank"]:
                return True
        elif event.get("rank") in shape["ranks"] or (
                event.get("node") is not None and event.get("node") == shape.get("node")):
            return True
        elif shape["shape"] == "moving" and event.get("kind") == "moving":
            return True
    return False


def score_run(report: dict[str, Any], *, window: int) -> dict[str, Any]:
    """Score one injected run from its demo report (``--report``).

    Returns:
        ``ranks`` (every injected rank), ``node``, ``moving``, ``named`` (bool),
        ``named_step`` (the first step by which every expected subject was named), ``windows``
        (windows from the onset to it), ``wrong_ranks``, ``early`` (findings on an injected
        rank before the onset), ``flaps``, ``cleared_while_on``, ``job_while_named``.
    """
    injected = report["injected"]
    onset, steps = injected["from_step"], report["steps"]
    world = report["world_size"]
    expected = list(injected.get("ranks") or [])
    node = injected.get("node")
    moving = any(s["shape"] == "moving" for s in injected.get("shapes") or [])
    events = report.get("finding_events") or []
    raised = [e for e in events if e["event"] == "raised" and e["step"] is not None]
    after = [e for e in raised if e["step"] >= onset]

    def first(match: Any) -> int | None:
        return min((e["step"] for e in after if match(e)), default=None)

    if moving:
        named_step = first(lambda e: e["kind"] == "moving" or e["rank"] in expected)
    else:
        per_rank = [first(lambda e, r=r: e["rank"] == r) for r in expected]
        named_step = None if None in per_rank or not per_rank else max(per_rank)  # type: ignore[type-var]
        if node is not None:
            by_node = first(lambda e: e["rank"] is None and e.get("node") == node)
            candidates = [s for s in (named_step, by_node) if s is not None]
            named_step = min(candidates) if candidates else None
    windows = None if named_step is None else (named_step + 1) // window - onset // window
    wrong = sorted({e["rank"] for e in raised if e["rank"] is not None
                    and e["rank"] not in expected}
                   | {e["node"] for e in raised if e["rank"] is None and e.get("node")
                      and e["node"] != node})
    early = sum(1 for e in raised if e["step"] < onset and e["rank"] in expected)
    # flaps: a subject on the injection cleared while it still acts on it, raised again later
    flaps = cleared_on = 0
    open_subjects: set[tuple[Any, ...]] = set()
    job_while_named = 0
    for i, e in enumerate(events):
        if e["step"] is None:
            continue
        if e["event"] == "raised":
            if (e["kind"] == "job_slowdown" and e["rank"] is None and not e.get("node")
                    and any(_acts(injected, {"rank": s[2], "node": s[3], "kind": s[1]},
                                  e["step"], steps, world) for s in open_subjects)):
                job_while_named += 1
            open_subjects.add(_subject(e))
            continue
        open_subjects.discard(_subject(e))
        if e["step"] >= onset and _acts(injected, e, e["step"], steps, world):
            cleared_on += 1
            if any(_subject(later) == _subject(e) and later["event"] == "raised"
                   for later in events[i + 1:]):
                flaps += 1
    return {"ranks": expected, "node": node, "moving": moving,
            "named": named_step is not None and (moving or node is not None
                                                 or bool(expected)),
            "named_step": named_step, "windows": windows, "wrong_ranks": wrong,
            "early": early, "flaps": flaps, "cleared_while_on": cleared_on,
            "job_while_named": job_while_named}


def lost_share(report: dict[str, Any], clean_step_seconds: float | None) -> float | None:
    """The job's time lost to the injection after the onset, as a share of the clean step
    (module docstring, "How the cost is measured"); None when not measured."""
    injected = report["injected"]
    after = report["steps"] - injected["from_step"]
    if not clean_step_seconds or after <= 0:
        return None
    total = 0.0
    for shape in injected.get("shapes") or []:
        lost = [e["steps"] * (e["others_wait_seconds_on"] - e["others_wait_seconds_off"])
                for e in shape.get("effect") or []
                if e and e.get("steps") and e.get("others_wait_seconds_on") is not None
                and e.get("others_wait_seconds_off") is not None]
        if lost:
            total += sum(lost) if shape["shape"] == "moving" else max(lost)
    return total / after / clean_step_seconds


def mean_step_seconds(jsonl: Path, first: int, last: int) -> float | None:
    """The median rank's mean step wall time over the saved windows wholly within steps
    [first, last) (``step_sum_seconds / steps_count``); None without those columns."""
    sums = counts = None
    docs = [json.loads(line) for line in jsonl.read_text().splitlines() if line.strip()]
    width = docs[1]["step"] - docs[0]["step"] if len(docs) > 1 else 1
    for doc in docs:
        if doc["step"] - width + 1 < first or doc["step"] >= last:
            continue
        record = WindowRecord.from_saved(doc)
        try:
            step_sum = np.asarray(record["step_sum_seconds"], dtype=float)
            count = np.asarray(record["steps_count"], dtype=float)
        except KeyError:
            return None
        sums = step_sum if sums is None else sums + step_sum
        counts = count if counts is None else counts + count
    if sums is None or counts is None:
        return None
    per_rank = sums / np.where(counts > 0, counts, np.nan)
    return float(np.nanmedian(per_rank)) if np.isfinite(per_rank).any() else None


def slower_after_onset(jsonl: Path, *, onset: int, steps: int, window: int) -> float | None:
    """A run's mean step after the onset over before, minus 1 (the first window, the warm-up,
    left out; :func:`mean_step_seconds`); None without the windows or their sums."""
    if not jsonl.exists():
        return None
    before = mean_step_seconds(jsonl, window, onset)
    after = mean_step_seconds(jsonl, onset, steps)
    return after / before - 1 if before and after else None


def score_dir(out: Path) -> list[dict[str, Any]]:
    """Every injected run saved in ``out`` (its ``.meta.json``, report, windows), scored with
    its clean twin."""
    runs = []
    for meta_path in sorted(out.glob("*.meta.json")):
        meta = json.loads(meta_path.read_text())
        if meta.get("role") != "injected":
            continue
        stem = out / meta["stem"]
        twin_meta_path = out / f"{meta['paired_with']}.meta.json"
        twin = json.loads(twin_meta_path.read_text()) if twin_meta_path.exists() else None
        row: dict[str, Any] = {"shape": meta["shape"], "run": meta["run"], "stem": meta["stem"],
                               "status": meta["status"], "load": meta["load"],
                               "plan": meta.get("plan"), "wall_seconds": meta["wall_seconds"],
                               "calibration": meta.get("calibration")}
        report_path = Path(f"{stem}.json")
        if meta["status"] != 0 or not report_path.exists():
            row["error"] = f"the injected demo failed (status {meta['status']})"
            runs.append(row)
            continue
        report = json.loads(report_path.read_text())
        row.update(score_run(report, window=meta["window"]))
        clean_report_path = out / f"{meta['paired_with']}.json"
        clean_step = None
        if twin is not None and twin["status"] == 0 and clean_report_path.exists():
            clean = json.loads(clean_report_path.read_text())
            row["clean_findings"] = [
                {k: e.get(k) for k in ("step", "rank", "node", "kind", "detector")}
                for e in clean.get("finding_events") or [] if e["event"] == "raised"]
            steps_ = [r["step_seconds_median"] for r in clean["ranks"]
                      if r.get("step_seconds_median") is not None]
            clean_step = float(np.median(steps_)) if steps_ else None
        else:
            row["clean_findings"] = None  # the clean twin failed: not counted as clean
        row["clean_step_seconds"] = clean_step
        row["cost"] = lost_share(report, clean_step)
        span = {"onset": meta["slow_from"], "steps": meta["steps"], "window": meta["window"]}
        row["job_slower"] = slower_after_onset(Path(f"{stem}.jsonl"), **span)
        row["clean_slower"] = slower_after_onset(out / f"{meta['paired_with']}.jsonl", **span)
        row["named_by"] = sorted({f"{e['kind']}:{_who(e)}"
                                  for e in report.get("finding_events") or []
                                  if e["event"] == "raised"})
        runs.append(row)
    return runs


def _spread(values: list[float], scale: float = 1.0, digits: int = 0) -> str:
    if not values:
        return "-"
    return (f"{scale * float(np.median(values)):.{digits}f} "
            f"({scale * float(np.percentile(values, 95)):.{digits}f})")


def table(runs: list[dict[str, Any]]) -> str:
    """Per shape, in the order first run: a markdown table."""
    lines = ["| shape | flags (run 0) | pairs | named | windows onset→name median (p95) | "
             "wrong ranks | before onset | flaps | job_slowdown while named | clean runs' "
             "findings | cost planned | cost measured (others' wait) median (min-max) | job "
             "slower after onset median (its clean twin's) | load avg |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    shapes = list(dict.fromkeys(r["shape"] for r in runs))
    for name in shapes:
        cell = [r for r in runs if r["shape"] == name]
        ok = [r for r in cell if "error" not in r]
        named = [r for r in ok if r["named"]]
        windows = [r["windows"] for r in named if r["windows"] is not None]
        clean = [r for r in ok if r.get("clean_findings") is not None]
        costs = [r["cost"] for r in ok if r.get("cost") is not None]
        slower = [r["job_slower"] for r in ok if r.get("job_slower") is not None]
        loads = [x for r in cell for x in r["load"]]
        flags = next((r["plan"]["flags"] for r in cell if r.get("plan")), "")
        failed = f" ({len(cell) - len(ok)} failed)" if len(ok) < len(cell) else ""
        cost = (f"{100 * np.median(costs):.1f}% ({100 * min(costs):.1f}-"
                f"{100 * max(costs):.1f}%)" if costs else "-")
        twin = [r["clean_slower"] for r in ok if r.get("clean_slower") is not None]
        slower_text = (f"{100 * np.median(slower):+.1f}%" if slower else "-") + (
            f" ({100 * np.median(twin):+.1f}%)" if twin else "")
        planned = [r["plan"]["expected_cost"] for r in cell
                   if (r.get("plan") or {}).get("expected_cost") is not None]
        planned_text = f"{100 * np.median(planned):.1f}%" if planned else "-"
        load = f"{min(loads):.1f}-{max(loads):.1f}" if loads else "-"
        lines.append(
            f"| {name} | `{flags}` | {len(ok)}{failed} | {len(named)} of {len(ok)} | "
            f"{_spread(windows, digits=1)} | {sum(len(r['wrong_ranks']) for r in ok)} | "
            f"{sum(r['early'] for r in ok)} | {sum(r['flaps'] for r in ok)} | "
            f"{sum(r['job_while_named'] for r in ok)} | "
            f"{sum(len(r['clean_findings']) for r in clean)} in {len(clean)} | "
            f"{planned_text} | {cost} | "
            f"{slower_text} | {load} |")
    return "\n".join(lines)


def _read_report(out: Path, meta: dict[str, Any]) -> dict[str, Any] | None:
    path = out / f"{meta['stem']}.json"
    return json.loads(path.read_text()) if meta["status"] == 0 and path.exists() else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default=DEFAULT_SHAPES,
                   help=f"comma list of KIND[PERCENT] (kinds: {', '.join(KINDS)})")
    p.add_argument("--runs", type=int, default=2, help="pairs per shape (default 2)")
    p.add_argument("--first-run", type=int, default=0,
                   help="number of the first run (seeds, ranks follow it): to add runs to DIR")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--slow-from", type=int, default=200)
    p.add_argument("--window", type=int, default=20)
    p.add_argument("--world-size", type=int, default=4)
    periods = Periods()
    p.add_argument("--stall-every", type=int, default=periods.stall_every,
                   help=f"steps between stalls (default {periods.stall_every})")
    p.add_argument("--burst-steps", type=int, default=periods.burst_steps,
                   help=f"K, steps of a burst (default {periods.burst_steps})")
    p.add_argument("--burst-every", type=int, default=periods.burst_every,
                   help=f"M, steps from one burst to the next (default {periods.burst_every})")
    p.add_argument("--moving-every", type=int, default=periods.moving_every,
                   help=f"steps a moving slowness stays on a rank (default "
                        f"{periods.moving_every})")
    p.add_argument("--calibrate-steps", type=int, default=160,
                   help="steps of the two calibration demos (default 160)")
    p.add_argument("--calibration", metavar="T,C,RHO",
                   help="step seconds, work CPU seconds, wait per CPU second of extra work: "
                        "skip the calibration demos")
    p.add_argument("--out", help="keep reports, windows and logs here (default: a temp dir)")
    p.add_argument("--json", help="write every run's score here (default: OUT/shapes.json)")
    p.add_argument("--replay", metavar="DIR", help="only re-score the runs saved in DIR")
    args = p.parse_args(argv)
    out = Path(args.replay or args.out or tempfile.mkdtemp(prefix="laggard-shapes-"))
    out.mkdir(parents=True, exist_ok=True)
    if not args.replay:
        shapes = [Shape.parse(n) for n in args.shapes.split(",") if n.strip()]
        if args.calibration:
            cal = Calibration(*(float(v) for v in args.calibration.split(",")))
        else:
            cal = calibrate(out, steps=args.calibrate_steps, window=args.window)
        print(f"calibration: step {1e3 * cal.step_seconds:.1f} ms, work "
              f"{1e3 * cal.work_cpu_seconds:.1f} ms CPU, {cal.extra_wall_per_cpu:.2f} s of the "
              "others' wait per CPU s of extra work", flush=True)
        periods = Periods(args.stall_every, args.burst_steps, args.burst_every,
                          args.moving_every)
        running = RunningCalibration(cal)
        for run in range(args.first_run, args.first_run + args.runs):
            for shape in shapes:  # interleaved: the load falls on every shape
                metas = run_pair(out, shape, running.current, periods, run=run,
                                 steps=args.steps, window=args.window,
                                 slow_from=args.slow_from, world_size=args.world_size)
                running.add(*(_read_report(out, m) for m in metas))
                print(f"run {run} {shape.name} ({metas[0]['plan']['flags']}): status "
                      f"{[m['status'] for m in metas]}, {metas[0]['wall_seconds']:.0f} s, load "
                      f"{metas[0]['load'][0]:.1f}-{metas[0]['load'][2]:.1f}", flush=True)
    runs = score_dir(out)
    Path(args.json or out / "shapes.json").write_text(json.dumps(runs, indent=1))
    setups = sorted({f"{m['steps']} steps, onset at step {m['slow_from']}, windows of "
                     f"{m['window']} steps" for m in (json.loads(p.read_text())
                                                      for p in out.glob("*.meta.json"))})
    print(f"\n## Shapes of a slowness: {len(runs)} pairs from {out} (4 gloo ranks; "
          f"{'; '.join(setups)})\n")
    print(table(runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
