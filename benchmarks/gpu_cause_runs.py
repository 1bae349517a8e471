"""Issue 22's demo targets on real runs: the cause from the GPU's state, and two jobs on one agent.

1. **Throttle tied to the slowed rank** (``laggard demo --throttle-slow-gpu``): the fake GPUs'
   scenario holds the slowed rank's GPU at ``sw_thermal``; the compute finding on that rank must
   name the reason. The same slowdown with ``--fake-gpus`` (no throttle) must name none ("no
   clock event on its GPU").
2. **Two jobs at once on one agent**: one ``laggard agent``, two ``laggard demo --use-agent``
   started together with different world sizes and run ids, a straggler in one. Each report
   names its own straggler (or none), and the agent's ``/metrics`` carries both runs' ranks,
   apart (``laggard_rank_step_median_seconds{run, rank}``), with ``laggard_straggler_active``
   only in the run that has one.

Usage::

    python benchmarks/gpu_cause_runs.py --runs 3      # ~1 min per demo on 2 cores

Prints one line per run (with the load average before it) and a summary; exit status 1 if a
target is missed. The machine is shared with other work: the load is printed beside each run.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from laggard.demo.harness import free_port, wait_until_ready
from laggard.detectors.throttle import LIMITING_REASONS

DEMO = [sys.executable, "-m", "laggard.cli", "demo"]


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.1f}/{five:.1f}"


def _demo(args: list[str], report: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([*DEMO, *args, "--report", str(report)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)


def _finish(proc: subprocess.Popen[bytes], report: Path, timeout: float) -> dict[str, Any]:
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return {"error": "timeout"}
    if proc.returncode != 0 or not report.exists():
        return {"error": f"exit {proc.returncode}: {err.decode()[-500:]}"}
    return json.loads(report.read_text())


def _rank_findings(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for f in report.get("findings", []) if f.get("rank") is not None
            and f.get("detector") == "straggler"]


def throttle_runs(runs: int, steps: int, tmp: Path, timeout: float) -> tuple[int, int, int]:
    """Returns (throttled runs naming the reason, unthrottled runs naming none, runs)."""
    named = clean = 0
    for i in range(runs):
        slow = 1 + i % 3
        for throttle in (True, False):
            flags = ["--world-size", "4", "--steps", str(steps), "--slow-from", str(steps // 4),
                     "--slow-rank", str(slow), "--seed", str(i),
                     "--throttle-slow-gpu" if throttle else "--fake-gpus"]
            load = _load()
            start = time.monotonic()
            path = tmp / f"throttle-{i}-{throttle}.json"
            report = _finish(_demo(flags, path), path, timeout)
            wall = time.monotonic() - start
            mine = [f for f in _rank_findings(report) if f["rank"] == slow]
            others = [f for f in _rank_findings(report) if f["rank"] != slow]
            causes = [(f.get("evidence") or {}).get("gpu_state", {}).get("cause") for f in mine]
            text = mine[0]["message"].split("; compute: ", 1)[-1] if mine else "-"
            if throttle:
                ok = bool(mine) and not others and all(c == ["sw_thermal"] for c in causes) \
                    and "sw_thermal active in 100% of the window" in text
                named += ok
            else:
                ok = bool(mine) and not others and all(c is None for c in causes) \
                    and text.startswith("no clock event") \
                    and not any(r in text for r in LIMITING_REASONS)
                clean += ok
            print(f"{'throttled' if throttle else 'no throttle'} run {i}: rank {slow} slowed; "
                  f"{'OK ' if ok else 'MISS'} cause: {text!r}; other ranks named: "
                  f"{[f['rank'] for f in others]}; {wall:.0f} s; {load}"
                  + (f"; {report['error']}" if "error" in report else ""), flush=True)
    return named, clean, runs


def _scrape(url: str) -> dict[str, dict[str, set[str]]]:
    """run -> {"steps": ranks with steps, "straggler": ranks flagged} from /metrics."""
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    out: dict[str, dict[str, set[str]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            run = s.labels.get("run")
            if run is None or "rank" not in s.labels:
                continue
            entry = out.setdefault(run, {"steps": set(), "straggler": set()})
            if s.name == "laggard_rank_step_median_seconds":  # a rank with steps
                entry["steps"].add(s.labels["rank"])
            if s.name == "laggard_straggler_active" and s.value == 1:
                entry["straggler"].add(s.labels["rank"])
    return out


def two_job_runs(runs: int, steps: int, tmp: Path, timeout: float) -> tuple[int, int]:
    """Returns (runs meeting every two-job target, runs)."""
    passed = 0
    for i in range(runs):
        metrics = f"127.0.0.1:{free_port()}"
        intake = f"127.0.0.1:{free_port(socket.SOCK_DGRAM)}"
        agent = subprocess.Popen(
            [sys.executable, "-m", "laggard.cli", "agent", "--web.listen-address", metrics,
             "--intake.address", intake, "--collector.interval", "0.5"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            wait_until_ready(f"http://{metrics}/metrics", timeout=15, what="agent",
                             procs=[agent])
            load = _load()
            start = time.monotonic()
            run_a, run_b = f"bench-a-{i}", f"bench-b-{i}"
            common = ["--use-agent", metrics, "--intake-address", intake, "--steps", str(steps),
                      "--slow-from", str(steps // 4), "--seed", str(i)]
            paths = tmp / f"two-a-{i}.json", tmp / f"two-b-{i}.json"
            procs = [_demo([*common, "--run", run_a, "--world-size", "4", "--slow-rank", "2",
                            "--slowdown", "1.25"], paths[0]),
                     _demo([*common, "--run", run_b, "--world-size", "3",
                            "--slowdown", "1.0"], paths[1])]
            reports = [_finish(p, path, timeout) for p, path in zip(procs, paths, strict=True)]
            wall = time.monotonic() - start
            seen = _scrape(f"http://{metrics}/metrics")
        finally:
            agent.terminate()
            agent.wait(timeout=10)
        a_named = sorted({f["rank"] for f in _rank_findings(reports[0])})
        b_named = sorted({f["rank"] for f in _rank_findings(reports[1])})
        a, b = seen.get(run_a, {}), seen.get(run_b, {})
        ok = (a_named == [2] and b_named == []
              and a.get("steps") == {"0", "1", "2", "3"} and b.get("steps") == {"0", "1", "2"}
              and a.get("straggler") == {"2"} and not b.get("straggler")
              and set(seen) == {run_a, run_b})
        passed += ok
        errors = "; ".join(r["error"] for r in reports if "error" in r)
        print(f"two jobs run {i}: {'OK ' if ok else 'MISS'} run a (4 ranks, rank 2 slowed) "
              f"named {a_named}, run b (3 ranks, none slowed) named {b_named}; /metrics runs "
              f"{sorted(seen)}: a ranks {sorted(a.get('steps', []))} flagged "
              f"{sorted(a.get('straggler', []))}, b ranks {sorted(b.get('steps', []))} flagged "
              f"{sorted(b.get('straggler', []))}; {wall:.0f} s; {load}"
              + (f"; {errors}" if errors else ""), flush=True)
    return passed, runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=240)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per demo")
    parser.add_argument("--only", choices=["throttle", "two-jobs"], default=None)
    args = parser.parse_args(argv)
    ok = True
    with tempfile.TemporaryDirectory(prefix="laggard-gpu-cause-") as tmp:
        if args.only in (None, "throttle"):
            named, clean, runs = throttle_runs(args.runs, args.steps, Path(tmp), args.timeout)
            print(f"throttle tied to the slowed rank: reason named in {named} of {runs}; "
                  f"same slowdown without a throttle: none named in {clean} of {runs}")
            ok &= named == runs and clean == runs
        if args.only in (None, "two-jobs"):
            passed, runs = two_job_runs(args.runs, args.steps, Path(tmp), args.timeout)
            print(f"two jobs on one agent: every target met in {passed} of {runs}")
            ok &= passed == runs
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
