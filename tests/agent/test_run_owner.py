"""A run belongs to its senders (issue 32, item 2): the RankTable with the identities the kernel
gives (``SenderIdentity``), as the Unix-socket intake hands them over; UDP is ``sender=None``."""

from __future__ import annotations

import logging

from support import registry_of

from laggard.agent.context import FindingLog
from laggard.agent.run_metrics import RunMetrics
from laggard.agent.run_table import FOREIGN_SENDER, RankTable
from laggard.agent.sender import SenderIdentity
from laggard.wire import CLOSED_PHASE, Heartbeat, StepRecord, WindowReport

OWNER = SenderIdentity(pid=4001, uid=1000, gid=1000)
OWNER_RANK_1 = SenderIdentity(pid=4002, uid=1000, gid=1000)
OTHER_USER = SenderIdentity(pid=6666, uid=1001, gid=1001)
ROOT = SenderIdentity(pid=1, uid=0, gid=0)


def _step(rank, step, run="job", world=2):
    return StepRecord(run=run, rank=rank, world_size=world, step=step).encode()


def _report(step, findings=(), run="job", world=2):
    return WindowReport(run=run, step=step, world_size=world, scores={0: 0.1, 1: 4.0},
                        findings=list(findings)).encode()


def _straggler(rank, severity="warning", **extra):
    return {"detector": "straggler", "kind": "compute", "severity": severity, "rank": rank,
            "step": 9, "message": "slow", "evidence": {}, **extra}


def _running_job(findings: FindingLog | None = None) -> RankTable:
    """Run ``job``: two ranks of uid 1000 at step 9, rank 1 flagged by a window report."""
    table = RankTable(rank_histograms=True,
                      max_ranks=64, findings=findings or FindingLog(), default_node="n0")
    for step in range(10):
        table.ingest(_step(0, step), OWNER)
        table.ingest(_step(1, step), OWNER_RANK_1)
    table.ingest(_report(9, [_straggler(1)]), OWNER)
    return table


def _value(table, name, labels=None):
    return registry_of(RunMetrics(table)).get_sample_value(name, labels or {})


def test_another_uids_records_are_refused_and_the_run_is_kept(caplog):
    table = _running_job()
    caplog.set_level(logging.WARNING, logger="laggard.agent.run_table")
    # A forged critical straggler, a step 0 (a "restart") and a heartbeat of another world size.
    table.ingest(_report(10, [_straggler(0, "critical")]), OTHER_USER)
    table.ingest(_step(1, 0), OTHER_USER)
    table.ingest(Heartbeat(run="job", rank=1, world_size=8, step=0).encode(), OTHER_USER)
    assert table.rejected == {FOREIGN_SENDER: 3}
    assert _value(table, "laggard_intake_rejected_total", {"reason": "foreign_sender"}) == 3
    assert _value(table, "laggard_steps_total", {"run": "job", "rank": "1"}) == 10
    assert _value(table, "laggard_straggler_active",
                  {"run": "job", "rank": "1", "kind": "compute"}) == 1
    assert _value(table, "laggard_straggler_active",
                  {"run": "job", "rank": "0", "kind": "compute"}) is None
    assert table.forgotten == {} and table.job_resets == {}
    # Logged once for that uid, with the sender's pid and uid and the owner's.
    lines = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(lines) == 1
    assert "pid 6666 uid 1001 for run 'job', owned by uid 1000" in lines[0]


def test_the_owners_new_process_restarts_its_rank():
    table = _running_job()
    restarted = SenderIdentity(pid=5002, uid=1000, gid=1000)
    table.ingest(_step(1, 0), restarted)
    assert table.forgotten == {"restart": 1}
    assert _value(table, "laggard_steps_total", {"run": "job", "rank": "1"}) == 1
    assert table.rejected == {}


def test_udp_records_are_refused_for_a_run_owned_over_the_socket():
    table = _running_job()
    table.ingest(_step(1, 0))
    table.ingest(_report(10, [_straggler(0, "critical")]))
    assert table.rejected == {FOREIGN_SENDER: 2}
    assert _value(table, "laggard_steps_total", {"run": "job", "rank": "1"}) == 10


def test_a_run_first_heard_over_udp_has_no_owner_until_the_socket_names_one():
    table = RankTable(rank_histograms=True, max_ranks=64, findings=FindingLog(), default_node="n0")
    table.ingest(_step(0, 0))
    table.ingest(_step(0, 1), OTHER_USER)  # unowned: UDP senders are trusted (docs/agent.md)
    table.ingest(_step(0, 2), OWNER)  # owned by uid 1001 since the last record
    assert table.rejected == {FOREIGN_SENDER: 1}
    assert _value(table, "laggard_steps_total", {"run": "job", "rank": "0"}) == 2


def test_root_writes_any_run_and_is_counted():
    table = _running_job()
    table.ingest(_step(0, 10), ROOT)
    assert table.rejected == {}
    assert table.admin_records == 1
    assert _value(table, "laggard_intake_admin_records_total") == 1
    table.ingest(_step(0, 11), OWNER)  # the owner's own records are not counted there
    assert table.admin_records == 1


def test_two_slurm_jobs_of_one_user_are_two_owners():
    job_77 = SenderIdentity(pid=4001, uid=1000, gid=1000, labels={"slurm_job_id": "77"})
    job_78 = SenderIdentity(pid=4101, uid=1000, gid=1000, labels={"slurm_job_id": "78"})
    unknown_cgroup = SenderIdentity(pid=4002, uid=1000, gid=1000)  # exited before the lookup
    table = RankTable(rank_histograms=True, max_ranks=64, findings=FindingLog(), default_node="n0")
    table.ingest(_step(0, 0), job_77)
    table.ingest(_step(0, 0), job_78)
    table.ingest(_step(1, 0), unknown_cgroup)
    assert table.rejected == {FOREIGN_SENDER: 1}
    assert job_77.owner_cgroup() == "slurm_job_id=77"
    assert SenderIdentity(uid=1000, labels={"pod_uid": "p"}).owner_cgroup() is None


def test_a_run_whose_ranks_said_goodbye_may_be_claimed_again():
    table = RankTable(rank_histograms=True, max_ranks=64, findings=FindingLog(), default_node="n0")
    table.ingest(Heartbeat(run="job", rank=0, world_size=1, step=3).encode(), OWNER)
    table.ingest(_step(0, 0, world=2), OTHER_USER)
    assert table.rejected == {FOREIGN_SENDER: 1}
    table.ingest(Heartbeat(run="job", rank=0, world_size=1, step=3, phase=CLOSED_PHASE).encode(),
                 OWNER)
    table.ingest(_step(0, 0, world=2), OTHER_USER)  # a new job of another user, same label
    assert table.rejected == {FOREIGN_SENDER: 1}
    table.ingest(_step(0, 1, world=2), OWNER)  # now the new owner's
    assert table.rejected == {FOREIGN_SENDER: 2}


def test_findings_carry_the_kernels_pid_and_uid_not_the_datagrams(caplog):
    findings = FindingLog()
    caplog.set_level(logging.INFO, logger="laggard.findings")
    table = RankTable(rank_histograms=True, max_ranks=64, findings=findings, default_node="n0")
    table.ingest(_step(0, 0), OWNER)
    table.ingest(_report(0, [_straggler(1, sender_pid=1, sender_uid=0)]), OWNER)
    table.ingest(_report(0, [_straggler(0)], run="udp-run"))
    recent = {doc["run"]: doc for doc in findings.recent()}
    assert (recent["job"]["sender_pid"], recent["job"]["sender_uid"]) == (4001, 1000)
    assert (recent["udp-run"]["sender_pid"], recent["udp-run"]["sender_uid"]) == (None, None)
    line = next(r.getMessage() for r in caplog.records if "run=job" in r.getMessage())
    assert "sender_pid=4001 sender_uid=1000" in line
