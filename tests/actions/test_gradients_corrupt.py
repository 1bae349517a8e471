"""LaggardGradientsCorrupt on real parts: rank 0's WindowReport carries the integrity check's
finding on rank 2 to a real agent (its UDP intake), a real Prometheus with laggard's rules fires
the alert, and remediate finds rank 2's node from the agent's own /findings and
laggard_rank_info."""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

import pytest
from support import wait_for
from support_remediate import payload

from laggard.actions.alertmanager import parse_webhook
from laggard.actions.exclude_file import ExcludeFile
from laggard.actions.locate import Locator
from laggard.actions.remediator import Config, Remediator
from laggard.demo.harness import PrometheusServer, laggard_rules
from laggard.detectors.finding import Finding, Severity
from laggard.wire import StepRecord, WindowReport

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    shutil.which("prometheus") is None, reason="prometheus missing: apt-get install prometheus")]


def test_corrupt_gradients_fire_and_name_the_ranks_node(agent_factory, tmp_path: Path) -> None:
    agent = agent_factory()
    corrupt = Finding(detector="integrity", kind="result_mismatch", severity=Severity.CRITICAL,
                      rank=2, step=40, message="rank 2's all-reduce result differs from its "
                                               "peers'").to_dict()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for rank in range(4):
            sock.sendto(StepRecord(rank=rank, world_size=4, step=40, run="job",
                                   node=f"gpu-{rank:02d}", step_seconds=0.1).encode(),
                        ("127.0.0.1", agent.intake_port))
        sock.sendto(WindowReport(step=40, world_size=4, run="job", findings=[corrupt]).encode(),
                    ("127.0.0.1", agent.intake_port))
    prometheus = PrometheusServer(tmp_path, [f"127.0.0.1:{agent.port}"], rules=laggard_rules())
    try:
        prometheus.start()
        firing: list[dict] = []

        def fired() -> bool:
            firing[:] = [a for a in prometheus.alerts()
                         if a["labels"]["alertname"] == "LaggardGradientsCorrupt"
                         and a["state"] == "firing"]
            return bool(firing)

        assert wait_for(fired, 30), prometheus.alerts()
        labels = firing[0]["labels"]
        assert labels["kind"] == "result_mismatch" and labels["severity"] == "critical"
        assert labels["instance"] == f"127.0.0.1:{agent.port}"
        target = ExcludeFile(tmp_path / "exclude", act=True)
        remediator = Remediator(target, Locator(prometheus.url), Config(max_job_percent=25))
        body = payload({"status": "firing", "labels": labels, "annotations": {},
                        "startsAt": firing[0]["activeAt"], "fingerprint": "f1"})
        (decision,) = remediator.handle(parse_webhook(body))
    finally:
        prometheus.stop()
    assert (decision.target, decision.outcome, decision.reason) == (
        "gpu-02", "acted", "laggard:sdc:job/rank2/result_mismatch")
    assert target.excluded() == ["gpu-02"]
