"""End to end against a real Prometheus: every dashboard query returns data, the alerts fire.

A real ``laggard agent --collector.nvml.fake-gpus 2`` receives the per-step records of a 4-rank
job whose rank 2 is slowed (datagrams on the agent's real UDP intake, as ``TrainingMonitor``
sends them), and Debian's ``prometheus`` binary scrapes it every second with laggard's rule
files loaded. Then:

- every template variable's ``label_values(...)`` query finds values, and every query of every
  panel of every dashboard, with the variables substituted as Grafana does, returns data through
  Prometheus's HTTP API;
- the straggler alerts (the in-job detector's verdict and the cross-node recording-rule one) fire
  for rank 2 and for no other rank; the fake GPUs' power-cap episode fires the throttle alert,
  their NVML XID 13 the warning XID alert, and an XID 79 line in the kernel log the critical one.
  ``for:`` durations are set to 0 in a copy of the rules: the expressions are the shipped ones,
  the waiting is not what this test is about.

Prometheus is always stopped, by its pid, whatever happens in the test.
"""

from __future__ import annotations

import math
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import FIXTURES, AgentProcess, budget, start_agent, stop_agent

from laggard.dashboards.catalog import render_dashboards
from laggard.demo.harness import PrometheusServer, laggard_rules
from laggard.detectors.finding import Finding, Severity
from laggard.wire import CollectiveTiming, Heartbeat, StepRecord, WindowReport

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(120),
    pytest.mark.skipif(shutil.which("prometheus") is None,
                       reason="prometheus missing: apt-get install prometheus"),
]

WORLD_SIZE = 4
SLOW_RANK = 2
SLOWDOWN = 1.3
#: The feeder's run id; the demo job of the second test sends none (no run label).
RUN = "e2e-run"
#: Ranks 0 and 1 drive the fake GPUs 0 and 1 (their UUIDs as the fake NVML gives them), so
#: laggard_rank_info joins them with those GPUs' series; ranks 2 and 3 name no device.
RANK_UUIDS = {0: "GPU-fa4e0000-0000-0000-0000-000000000000",
              1: "GPU-fa4e0000-0000-0000-0000-000000000001"}
#: Stand-ins for Grafana's built-in variables; windows long enough to span several scrapes.
BUILTINS = {"$__rate_interval": "10s", "$__range": "5m", "$__interval": "1s"}
#: How long every panel may take to show data (the first scrape lands after ~5-6 s).
DATA_DEADLINE_S = 30.0


@pytest.fixture
def kernel_log(tmp_path: Path) -> Path:
    """The agent's kernel log: a syslog file of its own (this host's /dev/kmsg is shared)."""
    path = tmp_path / "kern.log"
    path.write_text("")
    return path


@pytest.fixture
def agent(kernel_log: Path) -> Iterator[AgentProcess]:
    # InfiniBand ports from the fixture tree of a real H100 node's sysfs (this host has none).
    agent = start_agent("--collector.nvml.fake-gpus", "2", "--collector.interval", "0.5",
                        "--node.name", "e2e-node",
                        "--path.kmsg", str(kernel_log),
                        "--path.sysfs", str(FIXTURES / "infiniband" / "sys"))
    try:
        yield agent
    finally:
        stop_agent(agent)


@pytest.fixture
def prometheus(agent: AgentProcess, tmp_path: Path) -> Iterator[PrometheusServer]:
    with PrometheusServer(tmp_path, [f"127.0.0.1:{agent.port}"], interval_s=1.0,
                          rules=laggard_rules(alert_for="0s")) as server:
        yield server


class RankFeeder:
    """Sends what a 4-rank job's TrainingMonitor sends, rank 2 slowed, until stopped."""

    def __init__(self, intake_port: int, steps_per_second: float = 25.0) -> None:
        self._address = ("127.0.0.1", intake_port)
        self._period = 1.0 / steps_per_second
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.sent = 0

    def __enter__(self) -> RankFeeder:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        rng = random.Random(7)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            step = 0
            while not self._stop.is_set():
                for rank in range(WORLD_SIZE):
                    sock.sendto(_step_record(rank, step, rng).encode(), self._address)
                    if step % 10 == 0:  # a TrainingMonitor's heartbeats, about 2.5 a second
                        sock.sendto(Heartbeat(rank=rank, world_size=WORLD_SIZE, step=step + 1,
                                              run=RUN, pid=os.getpid()).encode(),
                                    self._address)
                if step % 10 == 9:
                    sock.sendto(_window_report(step).encode(), self._address)
                self.sent += 1
                step += 1
                self._stop.wait(self._period)


def _step_record(rank: int, step: int, rng: random.Random) -> StepRecord:
    slow = SLOWDOWN if rank == SLOW_RANK else 1.0
    jitter = rng.uniform(0.97, 1.03)
    forward, backward = 0.010 * slow * jitter, 0.020 * slow * jitter
    # The others wait in the all-reduce for the slow rank; it arrives last and waits least.
    wait = 0.002 if rank == SLOW_RANK else 0.002 + 0.030 * (SLOWDOWN - 1)
    allreduce = 0.015
    return StepRecord(
        rank=rank, world_size=WORLD_SIZE, step=step, local_rank=rank, node="e2e-node", run=RUN,
        uuid=RANK_UUIDS.get(rank),
        phases={"data": 0.002, "forward": forward, "backward": backward, "optimizer": 0.003},
        collective_wait_seconds=wait,
        step_seconds=0.002 + 0.030 * SLOWDOWN + 0.002 + 0.003,
        collectives=[CollectiveTiming("allreduce", allreduce, 1 << 20)],
        comm={"total_seconds": allreduce, "exposed_seconds": 0.004, "bytes": 1 << 20,
              "raw_bytes": 4 << 20},
    )


def _window_report(step: int) -> WindowReport:
    finding = Finding(
        detector="straggler", kind="compute", severity=Severity.WARNING,
        message=f"rank {SLOW_RANK} is a straggler: compute {SLOWDOWN:.2f}x the median rank",
        rank=SLOW_RANK, node="e2e-node", step=step,
        evidence={"compute_ratio": SLOWDOWN},
    )
    return WindowReport(
        step=step, world_size=WORLD_SIZE, run=RUN,
        scores={r: (SLOWDOWN - 1 if r == SLOW_RANK else 0.0) for r in range(WORLD_SIZE)},
        findings=[finding.to_dict()],
    )


_LABEL_VALUES = re.compile(r"^label_values\((?P<series>.+),\s*(?P<label>\w+)\)$")


def _substitute(text: str, values: dict[str, str]) -> str:
    for name in sorted(values, key=len, reverse=True):
        text = text.replace(f"${name}", values[name])
    for builtin, value in BUILTINS.items():
        text = text.replace(builtin, value)
    return text


def _resolve_variables(prom: PrometheusServer, dashboard: dict[str, Any]) -> dict[str, str]:
    """Evaluate each query variable as Grafana does; multi-values become ``(a|b)`` regexes.

    Raises:
        AssertionError: a variable whose query finds no value.
    """
    values: dict[str, str] = {}
    for variable in dashboard["templating"]["list"]:
        if variable["type"] != "query":
            continue
        match = _LABEL_VALUES.match(variable["query"])
        assert match, variable["query"]
        series = _substitute(match["series"], values)
        found = sorted({s[match["label"]] for s in prom.api("series", **{"match[]": series})
                        if match["label"] in s})
        if not found and variable["name"] == "run":
            # Ranks of a sender without a run id carry no run label (Prometheus drops empty
            # ones): Grafana's "All" (.*) is what selects them.
            values["run"] = ".*"
            continue
        assert found, f"{dashboard['uid']}: variable ${variable['name']} finds no value"
        # Grafana escapes regex metacharacters, doubled for a PromQL string literal.
        escaped = [re.escape(v).replace("\\", "\\\\") for v in found]
        values[variable["name"]] = "(" + "|".join(escaped) + ")"
    return values


def _dead_queries(prom: PrometheusServer, uids: tuple[str, ...] | None = None) -> list[str]:
    """Every panel query of every dashboard (or of those in ``uids``) without a number now."""
    dead = []
    for dashboard in render_dashboards().values():
        if uids is not None and dashboard["uid"] not in uids:
            continue
        try:
            values = _resolve_variables(prom, dashboard)
        except AssertionError as exc:
            dead.append(str(exc))
            continue
        for panel in dashboard["panels"]:
            for target in panel.get("targets", []):
                expr = _substitute(target["expr"], values)
                # Data means a number: a query whose every sample is NaN (0/0) draws nothing.
                if not any(math.isfinite(float(s["value"][1])) for s in prom.query(expr)):
                    dead.append(f"{dashboard['uid']} / {panel['title']} / {target['refId']}: "
                                f"{expr}")
    return dead


def _firing(prom: PrometheusServer, alertname: str) -> set[str]:
    """Ranks for which ``alertname`` is firing."""
    return {a["labels"].get("rank", "") for a in prom.api("alerts")["alerts"]
            if a["labels"]["alertname"] == alertname and a["state"] == "firing"}


def _ever_fired(prom: PrometheusServer, alertname: str, **labels: str) -> bool:
    matchers = "".join(f', {k}="{v}"' for k, v in labels.items())
    return bool(prom.query(
        f'max_over_time(ALERTS{{alertname="{alertname}", alertstate="firing"{matchers}}}[5m])'))


def test_every_panel_has_data_and_the_alerts_fire(
    agent: AgentProcess, prometheus: PrometheusServer, kernel_log: Path
) -> None:
    # GPU 0 (PCI 0000:18:00 in the fake) falls off the bus, as the kernel logs it.
    with kernel_log.open("a") as log:
        log.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S+00:00', time.gmtime())} e2e-node kernel: "
                  "NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has "
                  "fallen off the bus.\n")
    with RankFeeder(agent.intake_port) as feeder:
        deadline = time.monotonic() + budget(DATA_DEADLINE_S)
        dead = _dead_queries(prometheus)
        while dead and time.monotonic() < deadline:
            time.sleep(1.0)
            dead = _dead_queries(prometheus)
        assert feeder.sent > 0
        assert not dead, "queries without data:\n" + "\n".join(dead)

        expected = {str(SLOW_RANK)}
        alerts = ("LaggardStragglerDetected", "LaggardStragglerRank")
        deadline = time.monotonic() + budget(10)
        while any(_firing(prometheus, a) != expected for a in alerts):
            assert time.monotonic() < deadline, {a: _firing(prometheus, a) for a in alerts}
            time.sleep(0.5)

    # The fake GPUs' scenario: a power cap on GPU 0 (seconds 10-19, SM clock at 71 % of max) and
    # XID 13 on GPU 1 from NVML's event at second 20; XID 79 on GPU 0 from the kernel log above.
    # ALERTS keeps the history of each alert.
    expected_alerts = [
        ("LaggardGpuThrottled", {"gpu": "0"}),
        ("LaggardGpuXidCritical", {"gpu": "0", "xid": "79"}),
        ("LaggardGpuXid", {"gpu": "1", "xid": "13"}),
    ]
    deadline = time.monotonic() + budget(25)
    for alertname, labels in expected_alerts:
        while not _ever_fired(prometheus, alertname, **labels):
            assert time.monotonic() < deadline, f"{alertname} never fired for {labels}"
            time.sleep(1.0)
    assert not _ever_fired(prometheus, "LaggardGpuXidCritical", xid="13")
    # Healthy parts stay quiet: every collector works, the fixture's ports are ACTIVE and its
    # old link_downed count of 255 does not rise.
    for alertname in ("LaggardAgentDown", "LaggardCollectorFailing", "LaggardInfinibandLinkDown",
                      "LaggardInfinibandPortNotActive"):
        assert not _ever_fired(prometheus, alertname), alertname

    # The cross-node recording rules name the same rank with the expected ratio.
    ratios = {s["metric"]["rank"]: float(s["value"][1]) for s in prometheus.query(
        "instance_rank:laggard_compute_seconds_per_step:ratio_to_median")}
    assert set(ratios) == {str(r) for r in range(WORLD_SIZE)}
    assert max(ratios, key=ratios.get) == str(SLOW_RANK)
    assert ratios[str(SLOW_RANK)] == pytest.approx(SLOWDOWN, rel=0.05)


@pytest.mark.timeout(300)
def test_demo_training_job_straggler_named_by_prometheus(
    agent: AgentProcess, prometheus: PrometheusServer, tmp_path: Path
) -> None:
    """The real job: PyTorch's launcher, 3 gloo ranks of the demo model, rank 1 slowed 2x.

    Its TrainingMonitor sends to the fixture's agent; the in-job detector's finding and the
    cross-node recording rules must both name rank 1, and the per-rank dashboards have data.
    """
    pytest.importorskip("torch")
    # 120 steps: rank 0 analyses each window on a thread of its own, at most one window late;
    # at a load of 15-20 a 60-step job once ended before any straggler score had been scraped
    # (the score panel is the one that only rank 0's window reports feed).
    launcher = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "3",
         "-m", "laggard.demo.worker", "--steps", "120", "--window", "5",
         "--slow-rank", "1", "--slowdown", "2.0", "--slow-from", "0",
         "--intake-address", f"127.0.0.1:{agent.intake_port}",
         "--result", str(tmp_path / "result.json")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        per_rank = ("laggard-job-overview", "laggard-communication")
        dead = _dead_queries(prometheus, per_rank)
        while dead and launcher.poll() is None:
            time.sleep(1.0)
            dead = _dead_queries(prometheus, per_rank)
        if dead:  # the job ended first: one more look, while its last samples are recent
            dead = _dead_queries(prometheus, per_rank)
        output, _ = launcher.communicate(timeout=budget(240))
        assert launcher.returncode == 0, output.decode()[-3000:]
        assert not dead, "queries without data while the job ran:\n" + "\n".join(dead)
        deadline = time.monotonic() + budget(15)
        for alertname in ("LaggardStragglerDetected", "LaggardStragglerRank"):
            while not _ever_fired(prometheus, alertname, rank="1"):
                assert time.monotonic() < deadline, (
                    f"{alertname} never fired for rank 1; the job said:\n"
                    + output.decode()[-3000:])
                time.sleep(1.0)
            for rank in ("0", "2"):
                assert not _ever_fired(prometheus, alertname, rank=rank), (alertname, rank)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()


def test_prometheus_is_stopped_by_pid_when_the_test_fails(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="the test failed"):
        with PrometheusServer(tmp_path, []) as server:
            assert server.proc is not None
            pid = server.proc.pid
            os.kill(pid, 0)  # alive
            raise RuntimeError("the test failed")
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
