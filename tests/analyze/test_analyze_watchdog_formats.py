"""Watchdog timeouts and desyncs from lines written here to PyTorch's formats
(``ProcessGroupNCCL.cpp``: ``logPrefix()`` / ``createLogPrefix()`` and ``operator<<(WorkNCCL)``:
``WorkNCCL(SeqNum=%d, OpType=%s, NumelIn=%d, NumelOut=%d, Timeout(ms)=%d)``), with and without
the process-group prefix, split across files. No sample line is copied (the indented and
wrapped forms are read in tests/parsers/test_nccl_log.py)."""

from __future__ import annotations

import pytest
from support import analyze_json

PREFIXES = {
    "none": "",
    "rank": "[Rank {r}] ",
    "pg": "[PG 0 Rank {r}] ",
    "pg_desc": "[PG 0 (default_pg) Rank {r}] ",
    "pg_guid": "[PG ID 0 PG GUID 0(default_pg) Rank {r}] ",
}


def timeout_line(rank: int, seq: int, op: str, prefix: str, elapsed: int = 600_017,
                 numel: int = 4096) -> str:
    glog = f"[rank{rank}]:[E1201 09:14:{10 + rank:02d}.000001000 ProcessGroupNCCL.cpp:632] "
    return (glog + PREFIXES[prefix].format(r=rank) + "Watchdog caught collective operation "
            f"timeout: WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn={numel}, NumelOut={numel}, "
            f"Timeout(ms)=600000) ran for {elapsed} milliseconds before timing out.")


@pytest.mark.parametrize("with_prefix", ["pg", "pg_desc", "pg_guid"])
@pytest.mark.parametrize("without", ["none", "rank"])
def test_desync_found_when_one_line_lacks_the_pg_prefix(tmp_path, with_prefix, without):
    (tmp_path / "rank0.log").write_text(timeout_line(0, 57, "BROADCAST", with_prefix) + "\n")
    (tmp_path / "rank1.log").write_text(timeout_line(1, 57, "ALLREDUCE", without) + "\n")
    rc, found = analyze_json(str(tmp_path))
    assert rc == 1
    assert [f["kind"] for f in found] == ["collective_mismatch"]
    ev = found[0]["evidence"]
    assert (ev["pg"], ev["seq"]) == ("0", 57)
    assert {s["op"]: s["ranks"] for s in ev["signatures"]} == {"BROADCAST": [0],
                                                                "ALLREDUCE": [1]}


def test_same_seq_same_op_without_prefixes_is_one_timeout(tmp_path):
    (tmp_path / "job.log").write_text("\n".join(
        timeout_line(r, 12, "ALLREDUCE", "none" if r % 2 else "pg_desc") for r in range(3)))
    _, found = analyze_json(str(tmp_path))
    assert [(f["kind"], f["evidence"]["ranks"]) for f in found] == [
        ("collective_timeout", [0, 1, 2])]


def test_two_groups_on_the_same_seq_are_not_a_desync(tmp_path):
    lines = [timeout_line(0, 9, "ALLREDUCE", "pg"),
             timeout_line(1, 9, "ALLREDUCE", "pg"),
             timeout_line(0, 9, "BROADCAST", "pg").replace("[PG 0 ", "[PG 3 "),
             timeout_line(1, 9, "BROADCAST", "pg").replace("[PG 0 ", "[PG 3 ")]
    (tmp_path / "job.log").write_text("\n".join(lines) + "\n")
    _, found = analyze_json(str(tmp_path))
    assert sorted((f["kind"], f["evidence"]["pg"]) for f in found) == [
        ("collective_timeout", "0"), ("collective_timeout", "3")]

