"""The tracer's progress counters (``trace_progress``) and op vocabulary (``trace_ops``), with
plain data: no torch, no process group."""

from __future__ import annotations

from laggard.integrations.trace_ops import op_name, wire_bytes
from laggard.integrations.trace_progress import MAX_P2P_PAIRS, ProgressCounter, ProgressTable
from laggard.integrations.trace_records import GroupInfo

DP = GroupInfo(index=0, name="0", backend="gloo", ranks=(0, 1, 2, 3), desc="dp")


def test_completion_is_a_watermark_in_issue_order():
    counter = ProgressCounter()
    seqs = [counter.issue("allreduce", float(t)) for t in range(3)]
    assert seqs == [1, 2, 3] and counter.pending_at == 0.0
    counter.complete(2, 5.0)  # out of order: 1 still pending
    assert counter.completed == 0 and counter.pending_at == 0.0
    counter.complete(1, 6.0)
    assert counter.completed == 2 and counter.pending_at == 2.0
    counter.complete(1, 7.0)  # already counted: nothing changes
    counter.complete(3, 8.0)
    assert counter.completed == 3 and counter.pending_at is None and counter.times == {}


def test_pairs_beyond_the_limit_are_counted_as_dropped_not_followed():
    stats = {"p2p_pairs_dropped": 0}
    table = ProgressTable(stats)
    handles = [table.issue(DP, "send", peer, 0.0) for peer in range(MAX_P2P_PAIRS + 2)]
    assert all(h is not None for h in handles[:MAX_P2P_PAIRS])
    assert handles[MAX_P2P_PAIRS:] == [None, None] and stats["p2p_pairs_dropped"] == 2
    assert table.issue(DP, "recv", None, 0.0) is None  # a P2P op without its peer: not counted
    assert stats["p2p_pairs_dropped"] == 2


def test_a_completion_only_source_counts_a_group_no_issuing_source_counts():
    table = ProgressTable({"p2p_pairs_dropped": 0})
    table.completed_unissued(DP, "allreduce", 1.0)
    table.completed_unissued(DP, "send", 1.0)  # P2P: never in the group's own count
    [only] = table.snapshot(3.0)
    assert (only.group, only.issued, only.completed, only.op) == ("dp:0", 1, 1, "allreduce")
    assert only.issued_age_seconds == 2.0 and only.pending_age_seconds is None
    handle = table.issue(DP, "allreduce", None, 4.0)  # now counted at issue ...
    table.completed_unissued(DP, "allreduce", 5.0)  # ... so a backend record is not recounted
    ProgressTable.complete(handle, 6.0)
    [after] = table.snapshot(6.0)
    assert (after.issued, after.completed) == (2, 2)


def test_op_names_and_wire_bytes():
    assert op_name("OpType.ALLREDUCE") == "allreduce"
    assert op_name("nccl:_reduce_scatter_base") == "reduce_scatter"
    assert op_name("nccl:all_gather_into_tensor_coalesced") == "allgather"
    assert op_name("nccl:SOME_NEW_OP") == "somenewop"
    assert wire_bytes("alltoall", 4000, 4) == 3000 and wire_bytes("broadcast", 10, 4) == 10
    assert wire_bytes("allreduce", 100, 0) == 0  # a world of 0 is read as 1
