"""Hangs named while the job hangs, repeated: each injected kind, clean runs, a long checkpoint.

Each run is a real ``laggard demo`` (W gloo ranks on this machine, a node agent, PyTorch's
launcher) read from its ``--report`` JSON:

* per hang kind (``python``, ``spin``, ``data``, ``skip``, and ``device`` on
  ``--device emulated-async``), ``--runs`` runs of ``--inject hang=rank:R,step:S,kind:K`` with the
  rank and step varied run to run: *named* (rank 0's monitor reported a hang within the demo's
  ``--hang-bound``), *correct* (it named the injected rank with the expected culprit kind, and
  no other rank), and the seconds from the hang (the hanging rank's wall clock when it hung) to
  the report (rank 0's wall clock when its ``on_hang`` ran; one machine, one clock);
* ``--clean-runs`` runs with nothing injected and ``--checkpoint-runs`` runs with
  ``--inject checkpoint=step:S,factor:20`` (a step 20 times the usual on every rank): any hang
  reported is *false*.

The machine is shared: the 1-minute load average is read before and after each run. Runs are
bounded: each demo by its ``--hang-bound`` and this script's ``--run-timeout``, the whole by
``--budget`` seconds (what is left is skipped and said so).

Usage::

    python benchmarks/hang_detection.py --runs 5 --clean-runs 10 --checkpoint-runs 2 \\
        --out hang_runs.jsonl          # about 35 runs, 20-40 s each on 2 shared cores
    python benchmarks/hang_detection.py --runs 1 --kinds data --clean-runs 0 --checkpoint-runs 0
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

#: Every hang kind of ``laggard demo --inject``, and the device each needs.
KINDS = {"python": "cpu", "spin": "cpu", "data": "cpu", "skip": "cpu", "device": "emulated-async"}


@dataclass(slots=True)
class Run:
    """One demo run, scored from its report."""

    case: str  # a hang kind, "clean" or "checkpoint xF"
    rank: int | None
    step: int | None
    status: int
    wall_seconds: float
    load_before: float
    load_after: float
    named: bool = False
    correct: bool | None = None
    seconds_to_name: float | None = None
    culprits: list[dict[str, Any]] = field(default_factory=list)
    false_reports: int = 0
    checked: bool = False
    message: str = ""
    checkpoint: str = ""  # rank 0's line on how long the checkpoint step took
    error: str = ""


def run_demo(case: str, rank: int | None, step: int | None, args: argparse.Namespace,
             seed: int) -> Run:
    """One ``laggard demo`` run of ``case``; its report scored."""
    with tempfile.TemporaryDirectory(prefix="hang-bench-") as tmp:
        report = Path(tmp) / "report.json"
        flags = ["--world-size", str(args.world_size), "--window", str(args.window),
                 "--seed", str(seed), "--report", str(report),
                 "--hang-bound", str(args.hang_bound)]
        if case in KINDS:
            flags += ["--steps", str(args.steps), "--device", KINDS[case],
                      "--inject", f"hang=rank:{rank},step:{step},kind:{case}"]
        else:
            flags += ["--steps", str(args.clean_steps), "--slowdown", "1.0"]
            if case.startswith("checkpoint"):
                factor = float(case.removeprefix("checkpoint x"))
                flags += ["--inject", f"checkpoint=step:{step},factor:{factor:g}"]
        load_before = os.getloadavg()[0]
        started = time.monotonic()
        try:
            proc = subprocess.run([sys.executable, "-m", "laggard.cli", "demo", *flags],
                                  capture_output=True, text=True, timeout=args.run_timeout,
                                  stdin=subprocess.DEVNULL)
            status, out = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as exc:
            # the demo stops its children on SIGTERM and SIGKILL alike (own sessions, by pid)
            status, out = -1, f"past --run-timeout: {str(exc.stdout or '')[-400:]}"
        run = Run(case=case, rank=rank, step=step, status=status,
                  wall_seconds=round(time.monotonic() - started, 1),
                  load_before=load_before, load_after=os.getloadavg()[0],
                  checkpoint=next((line for line in out.splitlines()
                                   if line.startswith("checkpoint: ")), ""))
        try:
            hang = json.loads(report.read_text())["hang"]
        except (OSError, ValueError, KeyError):
            run.error = out[-600:]
            return run
    run.named, run.correct = bool(hang["named"]), hang["correct"]
    run.seconds_to_name, run.culprits = hang["seconds_to_name"], hang["culprits"]
    run.false_reports, run.checked = len(hang["false_reports"]), bool(hang["checked"])
    report_doc = hang.get("report") or {}
    run.message = str(report_doc.get("message", ""))[:300] if isinstance(report_doc, dict) else ""
    return run


def run_cluster(kind: str, node: int, args: argparse.Namespace) -> Run:
    """One ``laggard cluster-demo --fault hang`` run (3 emulated nodes, a real Prometheus at a
    1 s scrape and rule interval, alert ``for:`` cut to 5 s): the in-job figure and the
    seconds until ``LaggardJobHung`` fired, with its ranks and kind."""
    with tempfile.TemporaryDirectory(prefix="hang-bench-") as tmp:
        report = Path(tmp) / "report.json"
        load_before = os.getloadavg()[0]
        started = time.monotonic()
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "laggard.cli", "cluster-demo", "--nodes", "3",
                 "--fault", "hang", "--hang-kind", kind, "--fault-node", str(node),
                 "--steps", str(args.steps), "--window", str(args.window),
                 "--fault-at-step", str(args.hang_step), "--hang-bound", "90",
                 "--timeout", str(args.run_timeout - 30), "--json", str(report)],
                capture_output=True, text=True, timeout=args.run_timeout,
                stdin=subprocess.DEVNULL)
            status, out = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired:
            status, out = -1, "past --run-timeout"
        run = Run(case=f"prometheus {kind}", rank=node, step=args.hang_step, status=status,
                  wall_seconds=round(time.monotonic() - started, 1), load_before=load_before,
                  load_after=os.getloadavg()[0])
        try:
            doc = json.loads(report.read_text())
        except (OSError, ValueError):
            run.error = out[-600:]
            return run
    verdict, prom = doc["verdict"], doc["job"]["prometheus"]
    run.named, run.correct = bool(prom["firing"]), bool(verdict["prometheus_correct"])
    run.seconds_to_name = prom["seconds_to_firing"]
    run.culprits = [{"rank": r, "kind": prom["labels"].get("kind")} for r in prom["ranks"]]
    run.checked = True
    run.message = (f"in the job: correct {verdict['in_job_correct']} after "
                   f"{verdict['in_job_seconds']} s; alert labels {prom['labels']}")
    return run


def plan(args: argparse.Namespace) -> list[tuple[str, int | None, int | None]]:
    """The runs to make, interleaved (one of each kind in turn) so that a change of the
    machine's load falls on every kind alike."""
    runs: list[tuple[str, int | None, int | None]] = []
    for i in range(args.runs):
        for kind in args.kinds:
            # python cannot be rank 0 (its heartbeat names hangs); the others rotate over all
            ranks = list(range(1 if kind == "python" else 0, args.world_size))
            runs.append((kind, ranks[(i + len(runs)) % len(ranks)], args.hang_step + i % 3 * 5))
    runs += [("clean", None, None)] * args.clean_runs
    # the cluster's 1 rank per node: rank = node index (node 0 holds rank 0)
    runs += [(f"prometheus {kind}", 1 + i % 2, args.hang_step)
             for i in range(args.cluster_runs) for kind in args.cluster_kinds]
    for factor in args.factors:
        runs += [(f"checkpoint x{factor:g}", None, args.checkpoint_step)] * args.checkpoint_runs
    return runs


def summary(runs: list[Run]) -> str:
    """One Markdown row per case."""
    rows = ["| case | runs | named | right rank(s) and kind | seconds to name: median (min-max) "
            "| false reports | load average |", "|---|---|---|---|---|---|---|"]
    for case in dict.fromkeys(r.case for r in runs):
        these = [r for r in runs if r.case == case]
        loads = [x for r in these for x in (r.load_before, r.load_after)]
        load = f"{min(loads):.1f}-{max(loads):.1f}"
        false = sum(r.false_reports for r in these)
        if case in KINDS or case.startswith("prometheus"):
            named = sum(r.named for r in these)
            correct = sum(bool(r.correct) for r in these)
            secs = [r.seconds_to_name for r in these if r.seconds_to_name is not None]
            timing = (f"{statistics.median(secs):.1f} ({min(secs):.1f}-{max(secs):.1f})"
                      if secs else "-")
            rows.append(f"| {case} | {len(these)} | {named} of {len(these)} | "
                        f"{correct} of {len(these)} | {timing} | {false} | {load} |")
        else:
            unchecked = sum(not r.checked for r in these)
            note = f" ({unchecked} not checked)" if unchecked else ""
            rows.append(f"| {case} | {len(these)} | - | - | - | {false}{note} | {load} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=5, help="runs per hang kind (default 5)")
    p.add_argument("--kinds", nargs="+", default=list(KINDS), choices=list(KINDS))
    p.add_argument("--clean-runs", type=int, default=10)
    p.add_argument("--cluster-runs", type=int, default=0,
                   help="runs per --cluster-kinds of `laggard cluster-demo --fault hang` (root, "
                        "network namespaces, Debian's prometheus): the Prometheus figure")
    p.add_argument("--cluster-kinds", nargs="+", default=["data"], choices=list(KINDS)[:4])
    p.add_argument("--checkpoint-runs", type=int, default=2)
    p.add_argument("--world-size", type=int, default=4)
    p.add_argument("--window", type=int, default=10)
    p.add_argument("--steps", type=int, default=400, help="steps of a hang run (it stops early)")
    p.add_argument("--hang-step", type=int, default=20, help="first hang step (+0, 5, 10)")
    p.add_argument("--clean-steps", type=int, default=80, help="steps of a clean run")
    p.add_argument("--checkpoint-step", type=int, default=40)
    p.add_argument("--factors", type=float, nargs="+", default=[20.0],
                   help="the checkpoint step's factors, each --checkpoint-runs times (default "
                        "20; 100 makes the step outlast the monitor's 10 s hang threshold)")
    p.add_argument("--hang-bound", type=float, default=60.0)
    p.add_argument("--run-timeout", type=float, default=300.0)
    p.add_argument("--budget", type=float, default=3600.0, help="seconds for all runs")
    p.add_argument("--out", default="", help="append each run as a JSON line")
    args = p.parse_args(argv)
    started = time.monotonic()
    runs: list[Run] = []
    todo = plan(args)
    for n, (case, rank, step) in enumerate(todo):
        if time.monotonic() - started > args.budget:
            print(f"budget of {args.budget:g} s spent: {len(todo) - n} runs skipped", flush=True)
            break
        run = (run_cluster(case.split()[1], rank or 1, args) if case.startswith("prometheus")
               else run_demo(case, rank, step, args, seed=n))
        runs.append(run)
        print(f"{n + 1:3d}/{len(todo)} {case:10s} rank {run.rank} step {run.step}: status "
              f"{run.status}, named {run.named}, correct {run.correct}, "
              f"{run.seconds_to_name} s, false {run.false_reports}, "
              f"{[(c.get('rank'), c.get('kind')) for c in run.culprits]}, "
              f"load {run.load_before:.1f}-{run.load_after:.1f}, {run.wall_seconds} s"
              + (f"\n     {run.checkpoint}" if run.checkpoint else "")
              + (f"\n     {run.error.strip()[-300:]}" if run.error else ""), flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(asdict(run)) + "\n")
    print(summary(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
