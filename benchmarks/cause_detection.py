"""Cause detection on real runs: ``laggard demo`` with each injected cause, repeated, beside clean
runs measured in the same session.

Each run is a real demo (4 gloo ranks; ``--parallel pp`` by default: 2 pipeline stages x 2
data-parallel ranks) with one scenario injected, scored from its ``--report`` JSON (the in-job
findings, and the report's own verdict per injection, :func:`laggard.demo.report.
cause_outcomes`). Scenarios (``--scenarios``, interleaved run by run so the machine's load
falls on all alike):

==============  ===========================================  ==================================
scenario        flags                                        right when
==============  ===========================================  ==================================
clean           none                                         nothing is named
slow            ``--slow-rank R --slowdown 1.25``            a compute straggler on R only
stage           ``--inject stage=stage:S,layers:1``          stage_imbalance of stage S, no rank
gc              ``--inject gc=rank:R``                       kind gc on R only
tokens          ``--inject tokens=rank:R,factor:1.3``        load_imbalance on R (pp: R's
                                                             pipeline) only
tokens-nonote   ``... ,note:off``                            nothing expected: what is named
                                                             is listed
==============  ===========================================  ==================================

Per scenario: hits / runs, runs with a wrong rank named, runs with a false kind (another kind on
the injected ranks, or a stage finding where none was injected), what was named (counts), and
the median run time and load. The injected rank and stage rotate with the run's index.

With ``--parallel pp`` the tokens scenarios run at ``--tokens-world-size`` ranks (6: 3 per
stage): longer sequences go through a whole pipeline, and with 2 ranks per stage that pipeline
is half of every peer group, so no rank stands out of the pooled comparison's median (4 ranks:
nothing is named, see docs/demo.md).

Usage::

    python benchmarks/cause_detection.py --runs 2                  # ~1.5 min per run, 2 cores
    python benchmarks/cause_detection.py --runs 5 --out DIR        # keep the reports
    python benchmarks/cause_detection.py --replay DIR              # re-score saved reports
    python benchmarks/cause_detection.py --parallel ddp --scenarios clean,gc,tokens
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SCENARIOS = ("clean", "slow", "stage", "gc", "tokens", "tokens-nonote")


def world_of(scenario: str, args: argparse.Namespace) -> int:
    """The ranks of one run of ``scenario`` (module docstring: tokens in a pipeline)."""
    if scenario.startswith("tokens") and args.parallel == "pp":
        return max(args.world_size, args.tokens_world_size)
    return int(args.world_size)


def scenario_flags(scenario: str, index: int, parallel: str, world: int) -> list[str]:
    """The demo's flags for one run of ``scenario`` (the injected rank / stage rotates)."""
    rank = (1 + index) % world
    if scenario == "clean":
        return ["--slowdown", "1.0"]
    if scenario == "slow":
        return ["--slow-rank", str(rank), "--slowdown", "1.25"]
    if scenario == "stage":
        return ["--inject", f"stage=stage:{index % 2},layers:1"]
    if scenario == "gc":
        return ["--inject", f"gc=rank:{rank}"]
    if scenario == "tokens":
        return ["--inject", f"tokens=rank:{rank},factor:1.3"]
    if scenario == "tokens-nonote":
        return ["--inject", f"tokens=rank:{rank},factor:1.3,note:off"]
    raise ValueError(f"unknown scenario {scenario!r} (scenarios: {', '.join(SCENARIOS)})")


def run_one(out: Path, scenario: str, index: int, args: argparse.Namespace) -> dict[str, Any]:
    """One demo run; returns its metadata (the report is written beside it)."""
    stem = out / f"{scenario}-{index}"
    world = world_of(scenario, args)
    cmd = [sys.executable, "-m", "laggard.cli", "demo", "--parallel", args.parallel,
           "--world-size", str(world), "--steps", str(args.steps),
           "--window", str(args.window), "--slow-from", str(args.slow_from),
           "--seed", str(index), "--report", f"{stem}.json",
           *scenario_flags(scenario, index, args.parallel, world)]
    load = os.getloadavg()[0]
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          timeout=args.timeout)
    meta = {"scenario": scenario, "index": index, "cmd": cmd[2:], "status": proc.returncode,
            "wall_seconds": time.monotonic() - started, "load": load}
    Path(f"{stem}.meta.json").write_text(json.dumps(meta) + "\n")
    Path(f"{stem}.out").write_text(proc.stdout + proc.stderr)
    return meta


def score(meta: dict[str, Any], report: dict[str, Any] | None) -> dict[str, Any]:
    """One run's verdict: ``hit`` (None for scenarios expecting nothing in particular),
    ``wrong`` (a rank named that was not injected), ``false_kind``, and ``named``."""
    if report is None:
        return {**meta, "hit": False, "wrong": False, "false_kind": False, "named": ["FAILED"]}
    named = [f"{_where(f)}:{f['kind']}" for f in report.get("findings") or []
             if (f.get("detector") or "straggler") == "straggler"]
    named = sorted(set(named))
    if meta["scenario"] == "clean":
        return {**meta, "hit": not named, "wrong": bool(named), "false_kind": False,
                "named": named}
    outcomes = report.get("causes") or []
    outcome = outcomes[-1] if outcomes else None  # the scenario's injection (slow: the only)
    if outcome is None:
        return {**meta, "hit": False, "wrong": bool(named), "false_kind": False, "named": named}
    return {**meta, "hit": outcome["hit"], "wrong": bool(outcome["wrong_ranks"]),
            "false_kind": bool(outcome["false_kinds"]), "named": named}


def _where(finding: dict[str, Any]) -> str:
    if finding.get("rank") is not None:
        return f"r{finding['rank']}"
    evidence = finding.get("evidence") or {}
    return str(evidence.get("peer_group") or finding.get("subject") or "job")


def load_runs(out: Path) -> list[dict[str, Any]]:
    """Every saved run in ``out``, scored."""
    runs = []
    for meta_path in sorted(out.glob("*.meta.json")):
        meta = json.loads(meta_path.read_text())
        report_path = meta_path.with_name(meta_path.name.replace(".meta.json", ".json"))
        report = json.loads(report_path.read_text()) if report_path.is_file() else None
        runs.append(score(meta, report))
    return runs


def table(runs: list[dict[str, Any]]) -> str:
    """Per scenario: hits/N, wrong ranks, false kinds, what was named, run time and load."""
    lines = [f"{'scenario':<14} {'hits/N':>7} {'wrong':>5} {'false kind':>10} {'s/run':>6} "
             f"{'load':>5}  named (runs)"]
    by: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for run in runs:
        by[run["scenario"]].append(run)
    for scenario in [s for s in SCENARIOS if s in by] + sorted(set(by) - set(SCENARIOS)):
        rs = by[scenario]
        counted = [r for r in rs if r["hit"] is not None]
        hits = (f"{sum(bool(r['hit']) for r in counted)}/{len(counted)}"
                if counted else "-")
        names = collections.Counter(n for r in rs for n in r["named"])
        named = ", ".join(f"{n} ({c})" for n, c in sorted(names.items())) or "nothing"
        wall = sorted(r["wall_seconds"] for r in rs)[len(rs) // 2]
        load = sorted(r["load"] for r in rs)[len(rs) // 2]
        lines.append(f"{scenario:<14} {hits:>7} {sum(r['wrong'] for r in rs):>5} "
                     f"{sum(r['false_kind'] for r in rs):>10} {wall:>6.0f} {load:>5.1f}  "
                     f"{named}")
    failed = [r for r in runs if r["status"] != 0]
    if failed:
        stems = ", ".join(f"{r['scenario']}-{r['index']}" for r in failed)
        lines.append(f"runs that failed: {stems}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=2, help="runs per scenario (default 2)")
    p.add_argument("--first-run", type=int, default=0,
                   help="index of the first run (seed, injected rank): add runs to an --out")
    p.add_argument("--scenarios", default=",".join(SCENARIOS))
    p.add_argument("--parallel", choices=["ddp", "fsdp", "pp"], default="pp")
    p.add_argument("--world-size", type=int, default=4)
    p.add_argument("--tokens-world-size", type=int, default=6,
                   help="pp: ranks of the tokens scenarios (default 6; docstring)")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--slow-from", type=int, default=100, help="onset of slow and gc")
    p.add_argument("--window", type=int, default=20)
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    p.add_argument("--out", help="keep the runs' reports here (default: a temporary folder)")
    p.add_argument("--replay", metavar="DIR", help="only re-score the runs saved in DIR")
    args = p.parse_args(argv)
    if args.replay:
        print(table(load_runs(Path(args.replay))))
        return 0
    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    for s in scenarios:
        scenario_flags(s, 0, args.parallel, args.world_size)  # refuse an unknown one now
    with tempfile.TemporaryDirectory(prefix="laggard-causes-") as tmp:
        out = Path(args.out) if args.out else Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        for index in range(args.first_run, args.first_run + args.runs):
            for scenario in scenarios:  # interleaved: the load falls on every scenario alike
                meta = run_one(out, scenario, index, args)
                print(f"{scenario}-{index}: status {meta['status']}, "
                      f"{meta['wall_seconds']:.0f} s, load {meta['load']:.1f}", flush=True)
        runs = load_runs(out)
        print(table(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
