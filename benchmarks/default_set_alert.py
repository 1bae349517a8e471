"""The 10% demo straggler alerts through the agent's default series set (issue 34's target).

One real ``laggard agent`` with its default flags (no ``--intake.rank-histograms``), a real
Prometheus (Debian's) scraping it every second with laggard's shipped rules (``for:`` cut to
5 s, as the cluster demo does), and ``laggard demo --slowdown 1.10`` reporting to that agent.
Prometheus's active alerts are polled while the demo runs; the run prints each straggler alert
seen firing (name, rank) and when, against the demo's own verdict.

Usage: ``python benchmarks/default_set_alert.py [--runs 1] [--workdir DIR]``
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from laggard.demo.harness import PrometheusServer, free_port, laggard_rules

STRAGGLER_ALERTS = ("LaggardStraggler",)


def one_run(workdir: Path) -> dict:
    web, intake = free_port(), free_port()
    agent = subprocess.Popen(
        [sys.executable, "-m", "laggard.cli", "agent", "--web.listen-address",
         f"127.0.0.1:{web}", "--intake.address", f"127.0.0.1:{intake}", "--intake.socket", ""],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    fired: dict[tuple[str, str], float] = {}
    try:
        with PrometheusServer(workdir, [f"127.0.0.1:{web}"], interval_s=1.0,
                              rules=laggard_rules(alert_for="5s")) as prometheus:
            started = time.monotonic()
            demo = subprocess.Popen(
                [sys.executable, "-m", "laggard.cli", "demo", "--slowdown", "1.10",
                 "--use-agent", f"127.0.0.1:{web}", "--intake-address", f"127.0.0.1:{intake}"],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            while demo.poll() is None:
                for alert in prometheus.alerts():
                    labels = alert.get("labels", {})
                    if (alert.get("state") == "firing"
                            and labels.get("alertname", "").startswith(STRAGGLER_ALERTS)):
                        key = (labels["alertname"], labels.get("rank", ""))
                        fired.setdefault(key, round(time.monotonic() - started, 1))
                time.sleep(1.0)
            output = demo.communicate()[0]
    finally:
        agent.terminate()
        agent.wait(10)
    verdict = next((line for line in output.splitlines() if line.startswith("injected slowdown")),
                   "no verdict line")
    return {"fired": fired, "demo": verdict, "load": os.getloadavg()[0]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args(argv)
    for run in range(args.runs):
        workdir = Path(args.workdir or tempfile.mkdtemp(prefix="laggard-alert-")) / str(run)
        workdir.mkdir(parents=True, exist_ok=True)
        result = one_run(workdir)
        alerts = ", ".join(f"{name} rank {rank} at {t:g} s" for (name, rank), t in
                           sorted(result["fired"].items(), key=lambda kv: kv[1])) or "none"
        print(f"run {run + 1}: firing: {alerts}; demo: {result['demo']}; "
              f"load {result['load']:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
