"""Test support shared by every test folder (importable as ``support``: pyproject sets
``pythonpath = ["tests"]``): free ports, a real agent process, scraping, fixture paths."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from prometheus_client import CollectorRegistry

from laggard.demo.harness import NotReadyError, free_port, load_factor, wait_until_ready
from laggard.detectors.finding import Finding, Severity
from laggard.wire import WindowReport

__all__ = ["FIXTURES", "REPO", "AgentProcess", "DatagramSender", "budget", "free_port",
           "parse_file", "registry_of", "scrape", "start_agent", "stop_agent",
           "straggler_report", "torchrun", "wait_for"]

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"
T = TypeVar("T")


def parse_file(parse: Callable[[Iterable[str]], T], path: Path) -> T:
    """``parse`` (a pure parser taking lines) applied to the lines of the fixture at ``path``."""
    with open(path, encoding="utf-8") as f:
        return parse(f)


def budget(seconds: float) -> float:
    """A wall-clock ceiling for the tests: ``seconds`` (enough on an idle machine) times the
    machine's load per CPU now (:func:`laggard.demo.harness.load_factor`, at least 1).

    Every wait in the tests waits on its event and uses this only as the ceiling that stops a
    real hang, so that a test passing alone also passes at a load average of 20 on 2 cores
    (where everything runs about 10 times slower). Pytest-timeout's limits are scaled the same
    way (``tests/conftest.py``).
    """
    return seconds * load_factor()


def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
    """Poll ``predicate`` every 10 ms until it holds or ``budget(timeout)`` seconds pass (the
    load re-measured while waiting); its last value (for ``assert wait_for(...)``)."""
    started = time.monotonic()
    while time.monotonic() - started < budget(timeout):
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def registry_of(collector: object) -> CollectorRegistry:
    """A fresh registry holding ``collector`` (anything with ``collect()``), not collected until
    a test reads it."""

    class _Lazy:
        def collect(self):
            return collector.collect()

    registry = CollectorRegistry()
    registry.register(_Lazy())
    return registry


def scrape(url: str, timeout: float = 5.0) -> str:
    """GET ``url`` and return the body as text (``timeout``: idle-machine seconds, ``budget``-ed).
    """
    with urllib.request.urlopen(url, timeout=budget(timeout)) as response:
        return response.read().decode()


@dataclass
class AgentProcess:
    """A real ``laggard agent`` subprocess on free loopback ports."""

    proc: subprocess.Popen[str]
    port: int
    intake_port: int

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def scrape(self) -> str:
        return scrape(self.metrics_url)


def start_agent(*extra: str, timeout: float = 15.0) -> AgentProcess:
    """Start ``python -m laggard.cli agent`` and wait until /metrics answers (UDP intake on a
    free port; no Unix socket unless ``extra`` gives ``--intake.socket PATH``). ``timeout`` is
    idle-machine seconds; ``wait_until_ready`` scales it by the load.

    Raises:
        RuntimeError: the agent exited, or did not answer within the scaled ``timeout``.
    """
    port, intake_port = free_port(), free_port(socket.SOCK_DGRAM)
    cmd = [sys.executable, "-m", "laggard.cli", "agent",
           "--web.listen-address", f"127.0.0.1:{port}",
           "--intake.address", f"127.0.0.1:{intake_port}",
           # Off the system's /run/laggard unless a test names a socket of its own.
           "--intake.socket", "", *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    agent = AgentProcess(proc, port, intake_port)
    try:
        wait_until_ready(agent.metrics_url, timeout=timeout, what="agent", procs=[proc])
    except NotReadyError as exc:
        _, out = stop_agent(agent)
        raise RuntimeError(f"{exc}: {out}") from None
    return agent


def stop_agent(agent: AgentProcess) -> tuple[int, str]:
    """SIGTERM the agent; return its exit status and output (SIGKILL after ``budget(10)`` s)."""
    if agent.proc.poll() is None:
        agent.proc.send_signal(signal.SIGTERM)
    try:
        out, _ = agent.proc.communicate(timeout=budget(10))
    except subprocess.TimeoutExpired:
        agent.proc.kill()
        out, _ = agent.proc.communicate()
    return agent.proc.returncode, out


def analyze_json(*paths: str) -> tuple[int, list[dict]]:
    """Run ``laggard analyze --json PATH...`` through the CLI's entry point in this process
    (cheaper than a process per call); returns the exit status and the parsed findings."""
    import contextlib
    import io
    import json

    from laggard.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["analyze", "--json", *paths])
    return rc, json.loads(out.getvalue())


def torchrun(script: Path, nproc: int, *args: str, timeout: float = 120.0
             ) -> subprocess.CompletedProcess[str]:
    """Run ``script`` as a ``torchrun --standalone`` job of ``nproc`` CPU ranks (one OpenMP
    thread each), its output captured; killed after ``budget(timeout)`` seconds (``timeout``:
    enough on an idle machine).

    Raises:
        subprocess.TimeoutExpired: the job ran past the scaled ceiling (a hang).
    """
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
         str(nproc), str(script), *args],
        env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
        timeout=budget(timeout))


class DatagramSender:
    """A training job's sends, on a daemon thread: ``send(sock, step)`` with one UDP socket for
    step 0, 1, 2, ... every ``period`` seconds until the ``with`` block ends.

    Args:
        send: sends one step's datagrams (StepRecords, WindowReports) to the agents' intakes.
        period: seconds between steps.
    """

    def __init__(self, send: Callable[[socket.socket, int], None], period: float) -> None:
        self._send = send
        self._period = period
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> DatagramSender:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            step = 0
            while not self._stop.is_set():
                self._send(sock, step)
                step += 1
                self._stop.wait(self._period)


def straggler_report(run: str, world_size: int, rank: int, step: int, ratio: float,
                     node: str) -> WindowReport:
    """The WindowReport rank 0 sends when the in-job detector names ``rank`` a compute
    straggler whose work per step is ``ratio`` times the median rank's (score ``ratio - 1``,
    every other rank 0)."""
    finding = Finding(
        detector="straggler", kind="compute", severity=Severity.WARNING,
        message=f"rank {rank} is a straggler: compute {ratio:.2f}x the median rank",
        rank=rank, node=node, step=step, evidence={"compute_ratio": ratio})
    return WindowReport(
        step=step, world_size=world_size, run=run,
        scores={r: (ratio - 1 if r == rank else 0.0) for r in range(world_size)},
        findings=[finding.to_dict()])
