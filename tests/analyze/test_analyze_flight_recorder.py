"""Flight-recorder dumps: the restricted unpickler, the three encodings, and cross-rank matching
on NVRx's 16-rank GPU_ERROR dump set (answers from corpus/EXPECTED.md)."""

from __future__ import annotations

import json
import pickle
import pickletools

import pytest
from support import FIXTURES

from laggard.detectors.flight_recorder import analyze_dumps
from laggard.parsers.flight_recorder import DumpError, load_dump, parse_fr_trace_report

DIR = FIXTURES / "analyze"
NVRX = DIR / "fr_nvrx_gpu_error_2nd"


def nvrx_dumps():
    return [load_dump(str(p)) for p in sorted(NVRX.iterdir())]


def test_nvrx_dumps_load_with_builtin_types_only():
    dumps = nvrx_dumps()
    per_rank = {d.rank: len(d.entries) for d in dumps}
    assert [per_rank[r] for r in range(16)] == [11] * 8 + [25, 20, 25, 25, 25, 25, 20, 25]
    assert sum(per_rank.values()) == 278
    d9 = next(d for d in dumps if d.rank == 9)
    assert d9.version == "2.9" and d9.nccl_version == "2.27.3"
    assert d9.groups["72"] == ("EXPERT_MODEL_PARALLEL_GROUP", tuple(range(8, 16)))
    # pg_status is keyed by the local uid (11 on rank 9), tied to PG "72" through the entries
    assert d9.status["72"].last_enqueued == 44790 and d9.status["72"].last_completed == 44787


def test_nvrx_first_lagging_collective_is_pg72_all_to_all_missing_9_and_14():
    analysis = analyze_dumps(nvrx_dumps())
    first = analysis.lagging[0]
    assert (first.pg, first.seq, first.op) == ("72", 44791, "all_to_all")
    assert first.input_sizes == ((2048, 5120),) and first.input_dtypes == ("BFloat16",)
    assert first.missing == (9, 14) and first.present == (8, 10, 11, 12, 13, 15)
    assert first.status[9] == (44790, 44787) and first.status[8] == (44796, 44790)
    assert {lag.pg for lag in analysis.lagging if lag.op != "?"} == {
        "72", "37", "38", "64", "69", "70", "90"}
    # pg_status shows the same lag where every ring buffer has dropped the collective's entry
    evicted = {lag.pg: lag.missing for lag in analysis.lagging if lag.op == "?"}
    assert evicted == {"0": (9, 14), "42": (9,), "57": (14,)}
    assert analysis.stuck == [] and analysis.p2p == []
    assert analysis.stragglers == (9, 14)
    assert analysis.mismatches == []  # all_to_all sizes differ by design: not a desync


def test_fr01_printed_dump_with_tuples_and_ellipsis():
    d = load_dump(str(DIR / "fr01_flight_recorder_unpickled_dump_documented_entry.txt"))
    assert d.version == "2.5" and d.rank is None
    assert d.groups == {"0": ("default_pg", (0, 1))}
    st = d.status["0"]
    assert (st.last_enqueued, st.last_started, st.last_completed) == (2, -1, 2)
    (e,) = d.entries
    assert (e.record_id, e.seq, e.p2p_seq, e.op, e.state) == (0, 1, 0, "all_reduce", "completed")
    assert e.input_sizes == ((3, 4),) and e.input_dtypes == ("Float",)
    assert e.timeout_ms == 600000 and e.time_created_ns == 1724779239936775119


def test_fr02_torchfrtrace_report():
    with open(DIR / "fr02_torchfrtrace_not_all_ranks_joining_2rank_example.txt") as f:
        (issue,) = parse_fr_trace_report(f)
    assert (issue.collective, issue.entry, issue.op) == (5, 4, "nccl:all_reduce")
    assert issue.missing_ranks == (1,) and issue.expected_ranks == 2
    assert issue.input_sizes == "[[3, 4]]" and issue.state == "scheduled"


class _Boom:
    def __reduce__(self):
        import os

        return (os.system, ("touch /tmp/laggard-pwned",))


def test_a_pickle_that_calls_anything_is_refused(tmp_path):
    path = tmp_path / "trace_0"
    path.write_bytes(pickle.dumps({"entries": [_Boom()], "version": "2.9"}, protocol=2))
    with pytest.raises(DumpError, match="refusing posix.system|refusing os.system"):
        load_dump(str(path))
    # and a class that would merely be built is refused too
    path.write_bytes(pickle.dumps({"entries": [], "x": {1, 2}.__class__}))
    with pytest.raises(DumpError, match="refusing builtins.set"):
        load_dump(str(path))


def test_truncated_and_corrupt_pickles_give_clear_errors(tmp_path):
    data = (NVRX / "_dump_3").read_bytes()
    cut = tmp_path / "trace_3"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(DumpError, match="truncated"):
        load_dump(str(cut))
    bad = tmp_path / "trace_4"
    bad.write_bytes(data[:2] + b"\xff" * 64)
    with pytest.raises(DumpError):
        load_dump(str(bad))
    assert "STOP" in {op.name for op, _, _ in pickletools.genops(data)}


def _dump(entries, status, groups):
    return {"version": "2.9", "pg_config": groups, "pg_status": status, "entries": entries}


def _entry(seq, op="all_reduce", sizes=((4, 4),), dtype="Float", state="scheduled", t=0):
    return {"record_id": seq, "pg_id": 0, "process_group": ["0", "default_pg"],
            "collective_seq_id": seq, "p2p_seq_id": 0, "op_id": seq,
            "profiling_name": f"nccl:{op}", "time_created_ns": t, "input_sizes": sizes,
            "input_dtypes": [dtype], "output_sizes": sizes, "output_dtypes": [dtype],
            "state": state, "is_p2p": False, "timeout_ms": 600000}


def test_json_dumps_size_mismatch_is_a_desync_and_a_missing_rank_is_found(tmp_path):
    groups = {"0": {"name": "0", "desc": "default_pg", "ranks": [0, 1, 2]}}
    ok = {"0": {"last_enqueued_collective": 5, "last_started_collective": -1,
                "last_completed_collective": 4}}
    behind = {"0": {"last_enqueued_collective": 4, "last_started_collective": -1,
                    "last_completed_collective": 4}}
    files = {
        0: _dump([_entry(5, t=10)], ok, groups),
        1: _dump([_entry(5, sizes=((8, 4),), t=11)], ok, groups),
        2: _dump([_entry(4, state="completed")], behind, groups),
    }
    for rank, doc in files.items():
        (tmp_path / f"nccl_trace_rank_{rank}.json").write_text(json.dumps(doc))
    dumps = [load_dump(str(p)) for p in sorted(tmp_path.iterdir())]
    assert [d.rank for d in dumps] == [0, 1, 2]
    analysis = analyze_dumps(dumps)
    (mismatch,) = analysis.mismatches
    assert mismatch.seq == 5 and sorted(mismatch.signatures.values()) == [(0,), (1,)]
    (lag,) = analysis.lagging
    assert lag.seq == 5 and lag.not_enqueued == (2,) and analysis.stragglers == (2,)


def test_a_rank_without_a_dump_is_reported_as_such(tmp_path):
    groups = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}}
    status = {"0": {"last_enqueued_collective": 3, "last_started_collective": -1,
                    "last_completed_collective": 2}}
    (tmp_path / "trace_0").write_bytes(pickle.dumps(_dump([_entry(3)], status, groups)))
    analysis = analyze_dumps([load_dump(str(tmp_path / "trace_0"))])
    (lag,) = analysis.lagging
    assert lag.no_dump == (1,) and lag.missing == (1,)


def test_text_that_is_neither_json_nor_a_printed_dump(tmp_path):
    path = tmp_path / "dump.txt"
    path.write_text('{"pg_config": {}, "entries": [__import__("os")]}')
    with pytest.raises(DumpError, match="neither JSON nor a printed dump"):
        load_dump(str(path))


@pytest.mark.parametrize("doc", [
    {"entries": [{"process_group": 5, "collective_seq_id": "x", "input_sizes": 3}],
     "pg_config": [], "pg_status": 5},
    {"entries": [None, 5, "x"], "pg_config": {"0": "zz"},
     "pg_status": {"0": {"last_enqueued_collective": "abc"}}},
    {"entries": [{"process_group": [None], "pg_id": [1], "profiling_name": 7,
                  "input_dtypes": 5, "input_sizes": [[1, [2]]]}], "version": None},
])
def test_dumps_with_wrong_types_load_without_surprises(tmp_path, doc):
    path = tmp_path / "trace_0"
    path.write_bytes(pickle.dumps(doc))
    dump = load_dump(str(path))
    analyze_dumps([dump])  # nothing to match, and nothing raised
    assert all(isinstance(e.input_sizes, tuple) for e in dump.entries)
