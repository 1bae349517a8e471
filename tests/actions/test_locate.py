"""From an alert to its node through a real Prometheus (its HTTP API) scraping a static agent
exposition, and the corrupt rank from that agent's /findings; the job-share guard on it."""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from support import wait_for
from support_remediate import alert, payload

from laggard.actions.alert_actions import ALERT_ACTIONS
from laggard.actions.alertmanager import parse_webhook
from laggard.actions.exclude_file import ExcludeFile
from laggard.actions.locate import LocateError, Locator, Target
from laggard.actions.remediator import Config, Remediator
from laggard.demo.harness import PrometheusServer

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    shutil.which("prometheus") is None, reason="prometheus missing: apt-get install prometheus")]

#: Run "big" has ranks on n1-n4, run "small" one rank on n5; the agent is n1's.
EXPOSITION = "".join([
    "# TYPE laggard_agent_info gauge\n",
    'laggard_agent_info{node="n1"} 1\n',
    "# TYPE laggard_rank_info gauge\n",
    *(f'laggard_rank_info{{run="big",rank="{r}",node="n{r + 1}",gpu="0"}} 1\n' for r in range(4)),
    'laggard_rank_info{run="small",rank="0",node="n5",gpu="0"} 1\n',
])

#: The agent's /findings: rank 2 of run "big" sent corrupt gradients; a cleared and a warning
#: finding, and a check fault, name no one.
FINDINGS = [
    {"detector": "integrity", "kind": "result_mismatch", "severity": "critical", "rank": 2,
     "run": "big", "step": 40, "message": "rank 2's all-reduce result differs"},
    {"detector": "integrity", "kind": "result_mismatch", "severity": "critical", "rank": 1,
     "run": "big", "cleared": True, "message": "cleared"},
    {"detector": "integrity", "kind": "check_fault", "severity": "warning", "rank": 3,
     "run": "big", "message": "a fault of the check"},
    {"detector": "straggler", "kind": "compute", "severity": "critical", "rank": 0,
     "run": "big", "message": "slow"},
]


class _Agent(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/metrics":
            body, kind = EXPOSITION.encode(), "text/plain; version=0.0.4"
        else:
            body, kind = json.dumps(FINDINGS).encode(), "application/json"
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(Prometheus's URL, the static agent's instance), once the first scrape is queryable."""
    agent = ThreadingHTTPServer(("127.0.0.1", 0), _Agent)
    threading.Thread(target=agent.serve_forever, daemon=True).start()
    instance = f"127.0.0.1:{agent.server_address[1]}"
    server = PrometheusServer(tmp_path_factory.mktemp("prom"), [instance]).start()
    try:
        assert wait_for(lambda: bool(server.query("laggard_rank_info")), 30)
        yield server.url, instance
    finally:
        server.stop()
        agent.shutdown()


def test_nodes_from_the_agent_and_rank_identities(prometheus: tuple[str, str]) -> None:
    url, instance = prometheus
    locator = Locator(url)
    assert locator.agent_node(instance) == "n1"
    assert locator.rank_node("big", "2") == "n3"
    assert locator.run_nodes("big") == {"n1", "n2", "n3", "n4"}
    assert locator.node_runs("n5") == {"small"}
    assert locator.targets(ALERT_ACTIONS["LaggardGpuLost"], {"instance": instance}) == [
        Target("n1")]
    with pytest.raises(LocateError, match='laggard_rank_info of run big rank 9: no node'):
        locator.rank_node("big", "9")
    with pytest.raises(LocateError, match="no instance label"):
        locator.targets(ALERT_ACTIONS["LaggardGpuLost"], {})
    with pytest.raises(LocateError, match="Connection refused"):
        Locator("http://127.0.0.1:9").agent_node(instance)


def test_the_corrupt_rank_comes_from_the_reporting_agents_findings(
        prometheus: tuple[str, str]) -> None:
    url, instance = prometheus
    locator = Locator(url)
    assert locator.corrupt_ranks(instance, "result_mismatch") == [("big", "2")]
    assert locator.corrupt_ranks(instance, "nonfinite") == []
    assert locator.targets(ALERT_ACTIONS["LaggardGradientsCorrupt"],
                           {"instance": instance, "kind": "result_mismatch"}) == [
        Target("n3", {"run": "big", "rank": "2"})]


def test_the_job_share_guard_counts_the_jobs_nodes(prometheus: tuple[str, str],
                                                   tmp_path: Path) -> None:
    url, instance = prometheus
    target = ExcludeFile(tmp_path / "exclude", act=True)
    remediator = Remediator(target, Locator(url),
                            Config(max_nodes_per_hour=10, max_job_percent=25))

    def send(*alerts: dict) -> list[tuple[str, str, str, str]]:
        return [(d.target, d.outcome, d.reason, d.detail)
                for d in remediator.handle(parse_webhook(payload(*alerts)))]

    sdc = send(alert("LaggardGradientsCorrupt", instance=instance, kind="result_mismatch"))
    assert sdc == [("n3", "acted", "laggard:sdc:big/rank2/result_mismatch",
                    f"add n3 to {target.path}")]
    # 25 % of big's 4 nodes is 1, held: its rank 0's hang does not take n1 too
    assert send(alert("LaggardJobHung", run="big", rank="0", kind="device")) == [
        ("n1", "skipped", "laggard:hung:big/rank0/device",
         "job share: laggard holds 1 of run big's 4 node(s) (--max-job-percent 25)")]
    # run small's one node: at least one node of a job may go
    assert send(alert("LaggardJobHung", run="small", rank="0", kind="missing"))[0][:2] == (
        "n5", "acted")
    assert target.excluded() == ["n3", "n5"]
