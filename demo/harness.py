"""Process plumbing shared by the demos, the tests and the benchmarks: free loopback ports,
waiting for a server to answer, and a real Prometheus server with laggard's rules.

Nothing here imports torch: the agent's tests use it on a machine without it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.resources
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = ["NotReadyError", "PrometheusServer", "free_port", "laggard_rules", "wait_until_ready"]


class NotReadyError(RuntimeError):
    """A server did not answer in time, or its process exited first; the message says which."""


def free_port(kind: int = socket.SOCK_STREAM, host: str = "127.0.0.1") -> int:
    """A port on ``host`` that was free a moment ago (TCP by default; ``SOCK_DGRAM`` for UDP).

    Another process may take it before the caller binds it; on a test machine that is rare.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, kind) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def load_factor() -> float:
    """How many times slower than idle this machine runs now: the 1-minute load average per
    usable CPU (``os.getloadavg()[0] / len(os.sched_getaffinity(0))``), at least 1.0.

    A wait whose ceiling is only there to stop a real hang multiplies its idle-machine figure by
    this (see :func:`scaled`): at a load average of 20 on 2 cores a start-up that takes 3 s
    alone takes about 30 s, and a fixed 30 s budget fails a server that was coming up.
    """
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except OSError:  # no load average on this platform
        return 1.0
    return max(1.0, load / max(1, cpus))


def scaled(seconds: float) -> float:
    """``seconds`` (a budget measured on an idle machine) times :func:`load_factor` now."""
    return seconds * load_factor()


def wait_until_ready(url: str, *, timeout: float, what: str = "server",
                     procs: Iterable[subprocess.Popen[Any]] = ()) -> None:
    """Poll ``url`` every 0.1 s until it answers HTTP 2xx.

    Args:
        url: what to GET (``/metrics``, ``/-/ready``).
        timeout: seconds to wait in all on an idle machine; the wait is ``scaled`` by the
            machine's load, re-measured while it waits (a ceiling against a real hang, not a
            start-up time to meet: the processes in ``procs`` exiting ends it at once).
        what: the server's name in the error message.
        procs: processes that must stay alive meanwhile (the server, its launcher).

    Raises:
        NotReadyError: the scaled ``timeout`` passed, or one of ``procs`` exited before the
            server answered.
    """
    procs = list(procs)
    started = time.monotonic()
    while True:
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            pass
        for proc in procs:
            if proc.poll() is not None:
                raise NotReadyError(f"{what} exited {proc.returncode} before answering at {url}")
        waited = time.monotonic() - started
        if waited > scaled(timeout):
            raise NotReadyError(f"{what} did not answer at {url} within {waited:.0f} s "
                                f"({timeout:g} s on an idle machine, scaled by the load)")
        time.sleep(0.1)


def laggard_rules(alert_for: str | None = None) -> dict[str, str]:
    """laggard's Prometheus rule files (name -> text), as shipped in ``laggard.dashboards``.

    Args:
        alert_for: when given (``"0s"``, ``"2s"``), every alert's ``for:`` duration is replaced
            by it: the expressions stay the shipped ones, only the waiting is cut (demos, tests).
    """
    folder = importlib.resources.files("laggard.dashboards") / "rules"
    rules = {}
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith((".yml", ".yaml")):
            text = entry.read_text()
            if alert_for is not None:
                text = re.sub(r"^(\s*for:\s*)\S+", rf"\g<1>{alert_for}", text, flags=re.MULTILINE)
            rules[entry.name] = text
    return rules


def process_tree(pid: int) -> list[int]:
    """The pids of every living descendant of ``pid`` (psutil), ``[]`` when ``pid`` is gone.

    Read before signalling: a child killed first re-parents its own children to init."""
    import psutil

    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def signal_tree(pid: int, descendants: list[int], signum: int) -> None:
    """Send ``signum`` to ``pid``, each of ``descendants`` and each one's process group.

    torchrun starts each rank in a session of its own, so a signal to the launcher's group
    misses the ranks (and whatever they started, which keeps the launcher's stdout open);
    processes already gone or not ours are skipped."""
    for target in [pid, *descendants]:
        for kill in (os.killpg, os.kill):
            try:
                kill(target, signum)
            except (ProcessLookupError, PermissionError):
                pass


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM it when the process that started it dies, even by
    SIGKILL, so no Prometheus outlives a killed demo or test (Linux ``prctl(2)``,
    ``PR_SET_PDEATHSIG``; elsewhere a no-op)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


#: ``PR_SET_PDEATHSIG`` from ``<linux/prctl.h>``.
_PR_SET_PDEATHSIG = 1


class PrometheusServer:
    """A real Prometheus server on a free loopback port, scraping laggard agents.

    Use as a context manager (or call :meth:`start` and :meth:`stop`): the server is stopped by
    its pid, SIGTERM then SIGKILL, however the block ends.

    Args:
        workdir: where its configuration, TSDB and log go.
        targets: ``host:port`` of every agent (scrape job ``laggard``, as the rules expect).
        interval_s: scrape and rule-evaluation interval in seconds.
        rules: rule file texts by file name (see :func:`laggard_rules`).
        config: a whole configuration instead of the one scrape job of ``targets`` (its
            ``rule_files`` are replaced by the paths ``rules`` are written to, when given).
        flags: more command-line flags (``--web.enable-remote-write-receiver``).

    Raises:
        FileNotFoundError: no ``prometheus`` binary on PATH (Debian: ``apt-get install
            prometheus``).
    """

    def __init__(self, workdir: Path, targets: list[str], interval_s: float = 1.0,
                 rules: dict[str, str] | None = None, *, config: dict[str, Any] | None = None,
                 flags: Iterable[str] = ()) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            raise FileNotFoundError("prometheus not found: install it (Debian: apt-get install "
                                    "prometheus) or put it on PATH")
        self.binary = binary
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.workdir = workdir
        rule_paths = []
        for name, text in (rules or {}).items():
            path = workdir / name
            path.write_text(text)
            rule_paths.append(str(path))
        self.flags = list(flags)
        if config is None:
            interval = f"{int(interval_s * 1000)}ms"
            config = {
                "global": {"scrape_interval": interval, "evaluation_interval": interval,
                           "scrape_timeout": interval},
                "scrape_configs": [{"job_name": "laggard",
                                    "static_configs": [{"targets": targets}]}],
            }
        if rule_paths or "rule_files" not in config:
            config = {**config, "rule_files": rule_paths}
        self.config_path = workdir / "prometheus.yml"
        self.config_path.write_text(json.dumps(config, indent=1))  # JSON is YAML
        self.log_path = workdir / "prometheus.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 20.0) -> PrometheusServer:
        """Start it and wait until ``/-/ready`` answers.

        Raises:
            NotReadyError: it exited or was not ready within ``timeout`` seconds (it is stopped).
        """
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [self.binary, f"--config.file={self.config_path}",
                 f"--storage.tsdb.path={self.workdir / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{self.port}",
                 "--storage.tsdb.retention.time=1h", "--log.level=warn", *self.flags],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=_die_with_parent)
        try:
            wait_until_ready(f"{self.url}/-/ready", timeout=timeout, what="prometheus",
                             procs=[self.proc])
        except NotReadyError as exc:
            self.stop()
            raise NotReadyError(f"{exc}; its log: {self.log_path}") from None
        return self

    def api(self, path: str, **params: str) -> Any:
        """GET ``/api/v1/PATH`` and return its ``data``.

        Raises:
            OSError: the server did not answer; ValueError: it answered with an error.
        """
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=5) as resp:
            doc = json.load(resp)
        if doc.get("status") != "success":
            raise ValueError(f"prometheus: {doc.get('error', doc)}")
        return doc["data"]

    def query(self, promql: str) -> list[dict[str, Any]]:
        """Instant query; the result vector, empty when the query fails or finds nothing."""
        try:
            return self.api("query", query=promql).get("result", [])
        except (OSError, ValueError):
            return []

    def alerts(self) -> list[dict[str, Any]]:
        """Active alerts (pending and firing); empty when the server does not answer."""
        try:
            return self.api("alerts").get("alerts", [])
        except (OSError, ValueError):
            return []

    def stop(self) -> None:
        """Stop the server by its pid (SIGTERM, then SIGKILL after 10 s); safe to call twice."""
        if self.proc is None:
            return
        for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
            if self.proc.poll() is not None:
                return
            try:
                os.kill(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(wait_s)
                return
            except subprocess.TimeoutExpired:
                continue

    def __enter__(self) -> PrometheusServer:
        return self.start() if self.proc is None else self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
