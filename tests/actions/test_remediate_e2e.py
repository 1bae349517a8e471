"""End to end with real parts: a laggard agent whose fake GPU 1 is lost (the fake NVML's
``default`` scenario loses the last GPU at steps 50-59 of every 60-step period, one step a
second), Prometheus with laggard's rules scraping it, Debian's Alertmanager routing
``LaggardGpuLost`` to ``laggard remediate`` (with a bearer token), and a one-node Slurm
cluster (munged, slurmctld, slurmd). The first loss is met by a dry run: it drains nothing and
says what it would do; the second by ``--act``: the node is drained with laggard's reason
(``sinfo -R``), and resumed when the alert resolves.

Only LaggardGpuLost is routed: the same scenario's Xid 48 (a critical XID, at step 40) would
drain the node for good (a critical XID's end does not give a node back), which is right, and
is not this test's subject. The guards (per-hour cap, someone else's drain) are tested on the
same real Slurm in test_remediate_slurm.py.
"""

from __future__ import annotations

import shutil
import time
from datetime import datetime
from pathlib import Path

import pytest
from support import wait_for
from support_remediate import Alertmanager, start_remediate, wait_line, with_alertmanager
from support_slurm import SlurmCluster, slurm_cluster  # noqa: F401

from laggard.demo.harness import PrometheusServer, free_port, laggard_rules

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    shutil.which("prometheus") is None, reason="prometheus missing: apt-get install prometheus")]


def test_a_lost_gpu_drains_its_node_and_its_end_resumes_it(
        slurm_cluster: SlurmCluster, agent_factory, tmp_path: Path) -> None:  # noqa: F811
    node = slurm_cluster.node
    agent = agent_factory("--collector.nvml.fake-gpus", "2", "--node.name", node)
    port = free_port()
    token = tmp_path / "token"
    token.write_text("s3cret-for-the-test\n")
    alertmanager = Alertmanager(tmp_path, f"http://127.0.0.1:{port}/alerts", "LaggardGpuLost",
                                token)
    prometheus = PrometheusServer(tmp_path, [f"127.0.0.1:{agent.port}"],
                                  rules=laggard_rules())
    with_alertmanager(prometheus.config_path, alertmanager.url)
    common = ("--prometheus-url", prometheus.url, "--max-nodes-per-hour", "2",
              "--web.bearer-token-file", str(token))
    dry = acting = None
    try:
        prometheus.start()
        dry = start_remediate(tmp_path, *common, port=port, env=slurm_cluster.env)
        # the first loss (scenario step 50, ~50 s after the agent started): a dry run
        would = wait_line(dry, "action=drain", f"target={node}", timeout=120)
        assert "outcome=would_act" in would and "reason=laggard:gpu_lost:" in would, would
        assert "why=\"LaggardGpuLost firing instance=127.0.0.1:" in would
        assert "laggard:" not in slurm_cluster.sinfo_reasons()
        # resolved (the GPU is back at step 60): nothing to resume, nothing drained
        resumed = wait_line(dry, "action=resume", timeout=60)
        assert "outcome=skipped" in resumed and "not drained" in resumed, resumed
        assert not slurm_cluster.state().drained
        dry.stop()

        # the second loss (step 110): acting
        acting = start_remediate(tmp_path, "--act", *common, port=port, env=slurm_cluster.env)
        drained = wait_line(acting, "action=drain", timeout=120)
        assert "outcome=acted" in drained, drained
        reasons = slurm_cluster.sinfo_reasons()
        assert f"{node}|laggard:gpu_lost:gpu1" in reasons.splitlines(), reasons
        assert slurm_cluster.state().drained_by_laggard
        back = wait_line(acting, "action=resume", timeout=60)
        assert "outcome=acted" in back, back
        assert wait_for(lambda: not slurm_cluster.state().drained, 10)
        assert "laggard:" not in slurm_cluster.sinfo_reasons()
        _print_latency(prometheus, acting.log.read_text(), drained, back)
    finally:
        for process in (dry, acting):
            if process is not None:
                process.stop()
        prometheus.stop()
        alertmanager.stop()


def _print_latency(prometheus: PrometheusServer, log: str, drained: str, back: str) -> None:
    """Print (for benchmarks' figures, never asserted) the seconds from the first scrape that
    saw GPU 1 lost to the drain's audit line, and from the first that saw it back to the
    resume's: scrape and rule evaluation at 1 s, Alertmanager's group_wait and group_interval
    at 1 s, the receiver, scontrol."""
    def logged_at(audit: str) -> float:
        line = next(ln for ln in log.splitlines() if ln.endswith(audit))
        return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()

    now = time.time()
    data = prometheus.api("query_range", query='max(laggard_gpu_lost{gpu="1"})',
                          start=str(now - 90), end=str(now), step="1")
    points = [(float(t), float(v)) for t, v in data["result"][0]["values"]]
    # the last loss that began before the drain (the range also holds the dry run's)
    starts = [t for (_, v0), (t, v) in zip(points, points[1:], strict=False)
              if v0 == 0 and v == 1 and t <= logged_at(drained)]
    lost = starts[-1]
    well = next(t for t, v in points if t > lost and v == 0)
    print(f"\nlost GPU scraped -> drained: {logged_at(drained) - lost:.1f} s; "
          f"back -> resumed: {logged_at(back) - well:.1f} s")
