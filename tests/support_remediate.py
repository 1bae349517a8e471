"""For the remediate tests: Alertmanager webhook payloads (version 4) in the form Alertmanager
0.25 sends (prometheus.io/docs/alerting/latest/configuration/#webhook_config), and real
processes: ``laggard remediate`` and Debian's ``prometheus-alertmanager``."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support import budget, wait_for

from laggard.demo.harness import NotReadyError, free_port, wait_until_ready


def alert(name: str, status: str = "firing", *, severity: str = "critical",
          starts_at: str = "2026-12-02T10:00:00Z", **labels: str) -> dict[str, Any]:
    """One alert of a notification; its fingerprint hashes its labels, as Alertmanager's."""
    all_labels = {"alertname": name, "severity": severity, **labels}
    fingerprint = hashlib.sha256(json.dumps(sorted(all_labels.items())).encode()).hexdigest()
    return {"status": status, "labels": all_labels, "annotations": {"summary": name},
            "startsAt": starts_at,
            "endsAt": "0001-01-01T00:00:00Z" if status == "firing" else "2026-12-02T10:05:00Z",
            "generatorURL": "http://prometheus:9090/graph", "fingerprint": fingerprint[:16]}


def payload(*alerts: dict[str, Any]) -> bytes:
    """A notification of ``alerts`` (one group), as the webhook's POST body."""
    firing = any(a["status"] == "firing" for a in alerts)
    return json.dumps({
        "version": "4", "groupKey": '{}:{alertname="x"}', "truncatedAlerts": 0,
        "status": "firing" if firing else "resolved", "receiver": "laggard",
        "groupLabels": {}, "commonLabels": {}, "commonAnnotations": {},
        "externalURL": "http://alertmanager:9093", "alerts": list(alerts)}).encode()


# -- real processes: laggard remediate and Alertmanager ---------------------------------------



@dataclass
class RemediateProcess:
    """A running ``laggard remediate`` (its output, audit lines included, in ``log``)."""

    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/alerts"

    def audit(self) -> list[str]:
        """Its audit lines so far (``audit action=... target=... outcome=...``)."""
        text = self.log.read_text(errors="replace")
        return [ln[ln.index("audit "):] for ln in text.splitlines() if " audit action=" in ln]

    def post(self, body: bytes, token: str | None = None) -> tuple[int, dict]:
        """POST a webhook body (with ``Authorization: Bearer TOKEN`` when given); the HTTP
        status and the JSON answer."""
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        request = urllib.request.Request(self.url, data=body, method="POST", headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=budget(20)) as response:
                return response.status, json.load(response)
        except urllib.error.HTTPError as exc:
            return exc.code, json.load(exc)

    def stop(self) -> str:
        """SIGTERM it (SIGKILL after ``budget(10)`` s); its whole output."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=budget(10))
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.log.read_text(errors="replace")


def start_remediate(workdir: Path, *flags: str, port: int | None = None,
                    env: dict[str, str] | None = None) -> RemediateProcess:
    """Start ``python -m laggard.cli remediate FLAGS`` on a loopback port and wait until it
    answers ``/-/healthy``."""
    port = port or free_port()
    log = workdir / f"remediate-{port}-{len(list(workdir.glob('remediate-*')))}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "laggard.cli", "remediate",
             "--web.listen-address", f"127.0.0.1:{port}", *flags],
            stdout=out, stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"})
    process = RemediateProcess(proc, port, log)
    try:
        wait_until_ready(f"http://127.0.0.1:{port}/-/healthy", timeout=20,
                         what="laggard remediate", procs=[proc])
    except NotReadyError as exc:
        raise RuntimeError(f"{exc}: {process.stop()}") from None
    return process


ALERTMANAGER_CONFIG = """\
route:
  receiver: "null"
  group_by: [alertname, instance]
  group_wait: 1s
  group_interval: 1s
  repeat_interval: 1h
  routes:
    - matchers: ['alertname=~"{alerts}"']
      receiver: laggard
receivers:
  - name: "null"
  - name: laggard
    webhook_configs:
      - url: {url}
        send_resolved: true
        http_config:
          authorization:
            credentials_file: {token_file}
"""


class Alertmanager:
    """Debian's ``prometheus-alertmanager`` on a loopback port, routing the alerts named by
    ``alerts`` (a regular expression) to a webhook URL, with the bearer token in
    ``token_file``, and everything else nowhere.

    Raises:
        pytest.skip.Exception: the binary is missing, or it did not start (with its log).
    """

    def __init__(self, workdir: Path, webhook_url: str, alerts: str, token_file: Path) -> None:
        binary = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
        if binary is None:
            pytest.skip("prometheus-alertmanager not installed (apt-get install "
                        "prometheus-alertmanager)")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = workdir / "alertmanager.yml"
        config.write_text(ALERTMANAGER_CONFIG.format(url=webhook_url, alerts=alerts,
                                                     token_file=token_file))
        self.log = workdir / "alertmanager.log"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [binary, f"--config.file={config}", f"--storage.path={workdir / 'am-data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--cluster.listen-address=",
                 "--log.level=info"], stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_until_ready(f"{self.url}/-/ready", timeout=20, what="alertmanager",
                             procs=[self.proc])
        except NotReadyError as exc:
            self.stop()
            pytest.skip(f"alertmanager did not start: {exc}: "
                        f"{self.log.read_text(errors='replace')[-1500:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=budget(10))
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def with_alertmanager(config_path: Path, alertmanager_url: str) -> None:
    """Add an ``alerting`` section sending to ``alertmanager_url`` to a Prometheus
    configuration written as JSON (:class:`laggard.demo.harness.PrometheusServer`'s)."""
    config = json.loads(config_path.read_text())
    config["alerting"] = {"alertmanagers": [{"static_configs": [
        {"targets": [alertmanager_url.removeprefix("http://")]}]}]}
    config_path.write_text(json.dumps(config, indent=1))


def wait_line(process: RemediateProcess, *needles: str, timeout: float) -> str:
    """The first audit line of ``process`` holding every needle, waited for up to
    ``budget(timeout)`` s; fails the test with the output when none came."""
    found: list[str] = []

    def seen() -> bool:
        found[:] = [ln for ln in process.audit() if all(n in ln for n in needles)]
        # a receiver that exited or failed to decide (a traceback) ends the wait at once
        return bool(found) or process.proc.poll() is not None or \
            "Traceback" in process.log.read_text(errors="replace")

    wait_for(seen, timeout)
    assert found, f"no audit line with {needles}: {process.log.read_text(errors='replace')}"
    return found[0]
