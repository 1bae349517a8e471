"""A real ``laggard remediate`` process draining a real Slurm node (munged, slurmctld, slurmd
from Debian's slurm-wlm) on webhook POSTs in Alertmanager's format: dry run, act, idempotence,
the per-hour cap, a node drained by someone else left alone, a bad payload refused.
The whole pipeline (Prometheus, Alertmanager, an agent's lost GPU): test_remediate_e2e.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from support_remediate import alert, payload, start_remediate
from support_slurm import SlurmCluster, slurm_cluster  # noqa: F401

pytestmark = pytest.mark.slow


def _lost(node: str, gpu: str = "1", status: str = "firing") -> bytes:
    return payload(alert("LaggardGpuLost", status, node=node, instance=f"{node}:9477", gpu=gpu))


def test_dry_run_drains_nothing_and_act_drains_with_laggards_reason(
        slurm_cluster: SlurmCluster, tmp_path: Path) -> None:  # noqa: F811
    node = slurm_cluster.node
    dry = start_remediate(tmp_path, "--max-job-percent", "100", env=slurm_cluster.env)
    try:
        status, answer = dry.post(_lost(node))
        assert status == 200
        (decision,) = answer["decisions"]
        assert (decision["action"], decision["outcome"], decision["reason"]) == (
            "drain", "would_act", "laggard:gpu_lost:gpu1")
        assert decision["detail"] == (f"scontrol update nodename={node} state=drain "
                                      "reason=laggard:gpu_lost:gpu1")
        assert laggard_reasons(slurm_cluster) == []
    finally:
        out = dry.stop()
    assert "outcome=would_act" in out and "(slurm, dry run)" in out

    acting = start_remediate(tmp_path, "--act", "--max-job-percent", "100",
                             "--max-nodes-per-hour", "1", env=slurm_cluster.env)
    try:
        assert acting.post(_lost(node))[1]["decisions"][0]["outcome"] == "acted"
        assert laggard_reasons(slurm_cluster) == [f"{node}|laggard:gpu_lost:gpu1"]
        # Alertmanager's repeat: nothing decided, nothing run
        assert acting.post(_lost(node)) == (200, {"decisions": []})
        assert acting.post(_lost(node, status="resolved"))[1]["decisions"][0]["outcome"] == \
            "acted"
        assert laggard_reasons(slurm_cluster) == []
        assert not slurm_cluster.state().drained
        # the hour's one node is spent: another GPU's loss on the same node is refused
        (capped,) = acting.post(_lost(node, gpu="0"))[1]["decisions"]
        assert (capped["outcome"], capped["detail"]) == (
            "skipped", "per-hour cap: 1 node(s) taken in the last hour "
                       "(--max-nodes-per-hour 1)")
        assert not slurm_cluster.state().drained
        # a body that is not Alertmanager's version 4 payload: 400, the receiver keeps serving
        assert acting.post(b'{"version": "3", "alerts": []}')[0] == 400
        assert acting.post(b"{")[0] == 400
    finally:
        out = acting.stop()
    audit = [ln for ln in out.splitlines() if " audit action=" in ln]
    assert len(audit) == 3, out  # drain, resume, the cap's refusal: one line each


def test_a_node_drained_by_someone_else_is_left_alone(slurm_cluster: SlurmCluster,  # noqa: F811
                                                     tmp_path: Path) -> None:
    node = slurm_cluster.node
    slurm_cluster.drain_as_someone_else("fan_replacement")
    acting = start_remediate(tmp_path, "--act", "--max-job-percent", "100",
                             env=slurm_cluster.env)
    try:
        (fired,) = acting.post(_lost(node))[1]["decisions"]
        assert fired["outcome"] == "skipped"
        assert fired["detail"].startswith("drained by someone else (fan_replacement)")
        (resolved,) = acting.post(_lost(node, status="resolved"))[1]["decisions"]
        assert (resolved["action"], resolved["outcome"], resolved["detail"]) == (
            "resume", "skipped", "not taken out for this alert: left as it is")
        state = slurm_cluster.state()
        assert state.drained and state.reason == "fan_replacement"
    finally:
        acting.stop()


def test_after_a_restart_only_the_alert_that_drained_a_node_resumes_it(
        slurm_cluster: SlurmCluster, tmp_path: Path) -> None:  # noqa: F811
    node = slurm_cluster.node
    flags = ("--act", "--max-job-percent", "100")
    first = start_remediate(tmp_path, *flags, env=slurm_cluster.env)
    try:
        assert first.post(_lost(node))[1]["decisions"][0]["outcome"] == "acted"
    finally:
        first.stop()
    again = start_remediate(tmp_path, *flags, env=slurm_cluster.env)
    try:
        # another GPU's alert resolving: not the reason on the node, no decision, no resume
        assert again.post(_lost(node, gpu="0", status="resolved")) == (200, {"decisions": []})
        assert laggard_reasons(slurm_cluster) == [f"{node}|laggard:gpu_lost:gpu1"]
        # a new alert on the node joins laggard's drain (read back from Slurm), runs nothing
        (joined,) = again.post(_lost(node, gpu="0"))[1]["decisions"]
        assert (joined["outcome"], joined["detail"]) == (
            "skipped", "already held by laggard (laggard:gpu_lost:gpu1)")
        # the alert that drained it resolves: its reason is on the node, but the new alert
        # holds it still
        (held,) = again.post(_lost(node, status="resolved"))[1]["decisions"]
        assert (held["action"], held["outcome"], held["detail"]) == (
            "resume", "skipped", "still held by 1 other alert(s)")
        assert laggard_reasons(slurm_cluster) == [f"{node}|laggard:gpu_lost:gpu1"]
        # the last holder resolves: resumed
        (back,) = again.post(_lost(node, gpu="0", status="resolved"))[1]["decisions"]
        assert (back["action"], back["outcome"]) == ("resume", "acted")
        assert laggard_reasons(slurm_cluster) == []
    finally:
        again.stop()


def laggard_reasons(cluster: SlurmCluster) -> list[str]:
    """``sinfo -R``'s ``node|reason`` lines whose reason is laggard's."""
    return [ln for ln in cluster.sinfo_reasons().splitlines() if "|laggard:" in ln]
