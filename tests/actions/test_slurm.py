"""The Slurm drain module: its reason, its reading of scontrol, and a real slurmctld's node drained,
left alone and resumed (munged + slurmctld + slurmd from slurm-wlm: tests/support_slurm.py)."""

from __future__ import annotations

import logging

import pytest
from support_slurm import SlurmCluster, slurm_cluster  # noqa: F401 - the fixture

from laggard.actions.audit import Decision, record
from laggard.actions.slurm import (
    NodeState,
    Slurm,
    SlurmError,
    drain_reason,
    is_laggard_reason,
    local_node_name,
    parse_show_node,
)

# `scontrol -o show node vm` of slurm-wlm 22.05.8 on this machine, drained by hand (cut in the
# middle, where it lists hardware).
SHOW_DRAINED = (
    "NodeName=vm Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=1.61 "
    "NodeAddr=127.0.0.1 NodeHostName=vm Version=22.05.8 State=IDLE+DRAIN ThreadsPerCore=1 "
    "Partitions=debug  BootTime=2026-12-02T11:48:49 SlurmdStartTime=2026-12-02T12:06:07 "
    "CfgTRES=cpu=2,mem=1M,billing=2 AllocTRES= CapWatts=n/a CurrentWatts=0 AveWatts=0 "
    "ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s "
    "Reason=someone: fan [root@2026-12-02T12:06:19]\n")
SHOW_IDLE = ("NodeName=vm Arch=x86_64 State=IDLE ThreadsPerCore=1 TmpDisk=0 Weight=1 "
             "ExtSensorsTemp=n/s\n")


def test_the_reason_is_one_structured_token() -> None:
    assert drain_reason("gpu_lost", "0000:91:00") == "laggard:gpu_lost:0000:91:00"
    assert drain_reason("xid", "48 on\tgpu 0\n") == "laggard:xid:48_on_gpu_0"
    assert len(drain_reason("straggler", "r" * 500)) == 128
    assert is_laggard_reason("laggard:xid:48/gpu0")
    assert not is_laggard_reason("someone: fan") and not is_laggard_reason(None)


def test_the_node_name_is_slurmds_else_the_short_host_name() -> None:
    assert local_node_name({"SLURMD_NODENAME": "gpu-07"}) == "gpu-07"
    assert "." not in local_node_name({})


def test_scontrol_output_is_read_with_its_reason_and_state_flags() -> None:
    drained = parse_show_node(SHOW_DRAINED)
    assert drained == NodeState("vm", "IDLE+DRAIN", "someone: fan")
    assert drained.drained and not drained.drained_by_laggard
    idle = parse_show_node(SHOW_IDLE)
    assert idle == NodeState("vm", "IDLE", "") and not idle.drained
    assert NodeState("n", "MIXED+DRAIN", "laggard:hung:rank2").drained_by_laggard
    with pytest.raises(SlurmError, match="no NodeName/State"):
        parse_show_node("Node nosuch not found\n")


def test_an_audit_line_is_one_logfmt_line_that_cannot_be_forged(caplog) -> None:
    caplog.set_level(logging.INFO, logger="laggard.audit")
    decision = record(Decision(action="drain", target="n1", outcome="would_act",
                               why='GPU 1 lost\naudit outcome=acted "x"', reason="laggard:a:b"))
    assert [r.getMessage() for r in caplog.records] == [decision.line()]
    assert decision.line() == ('audit action=drain target=n1 outcome=would_act reason=laggard:a:b '
                               'why="GPU 1 lost\\\\naudit outcome=acted \\"x\\""')
    with pytest.raises(ValueError, match="outcome"):
        Decision(action="drain", target="n1", outcome="maybe", why="")


def test_no_scontrol_is_a_failed_decision_not_an_exception(caplog) -> None:
    caplog.set_level(logging.INFO, logger="laggard.audit")
    decision = Slurm(act=True, scontrol="/nonexistent/scontrol").drain("n1", "laggard:a:b",
                                                                       why="test")
    assert decision.outcome == "failed" and "/nonexistent/scontrol" in decision.detail
    assert caplog.records[-1].levelno == logging.WARNING


def _reasons(cluster: SlurmCluster) -> list[str]:
    return [line.split("|", 1)[1] for line in cluster.sinfo_reasons().splitlines()]


def test_a_real_node_is_drained_once_left_alone_when_not_ours_and_resumed_when_ours(
        slurm_cluster: SlurmCluster, caplog) -> None:  # noqa: F811 - the fixture
    caplog.set_level(logging.INFO, logger="laggard.audit")
    node, env = slurm_cluster.node, slurm_cluster.env
    reason = drain_reason("gpu_lost", "gpu1")

    dry = Slurm(env=env).drain(node, reason, why="GPU 1 lost")
    assert dry.outcome == "would_act", dry
    assert dry.detail == f"scontrol update nodename={node} state=drain reason={reason}"
    assert _reasons(slurm_cluster) == [] and not slurm_cluster.state().drained

    slurm = Slurm(act=True, env=env, source="test")
    assert slurm.drain(node, reason, why="GPU 1 lost").outcome == "acted"
    assert _reasons(slurm_cluster) == [reason]
    again = slurm.drain(node, drain_reason("xid", "48/gpu0"), why="Xid 48")
    assert (again.outcome, again.detail) == ("skipped", f"already drained by laggard ({reason})")
    assert _reasons(slurm_cluster) == [reason]

    assert slurm.resume(node, why="healthy").outcome == "acted"
    assert not slurm_cluster.state().drained and _reasons(slurm_cluster) == []
    assert slurm.resume(node, why="healthy").outcome == "skipped"

    slurm_cluster.drain_as_someone_else("fan replaced, burn-in")
    assert slurm.drain(node, reason, why="GPU 1 lost").outcome == "skipped"
    resumed = slurm.resume(node, why="healthy")
    assert resumed.outcome == "skipped" and "someone else" in resumed.detail
    assert _reasons(slurm_cluster) == ["fan replaced, burn-in"]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 7 and all(line.startswith("audit action=") for line in lines)
