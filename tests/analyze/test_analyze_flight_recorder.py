"""Cross-rank matching of flight-recorder dumps (``laggard.detectors.flight_recorder``): NVRx's
16-rank GPU_ERROR set (answers from corpus/EXPECTED.md), a size mismatch, a rank without a dump.
Loading the dumps is tested in tests/parsers/test_flight_recorder.py."""

from __future__ import annotations

import json
import pickle

from support import FIXTURES

from laggard.detectors.flight_recorder import analyze_dumps
from laggard.parsers.flight_recorder import load_dump

NVRX = FIXTURES / "analyze" / "fr_nvrx_gpu_error_2nd"


def test_nvrx_first_lagging_collective_is_pg72_all_to_all_missing_9_and_14():
    analysis = analyze_dumps([load_dump(str(p)) for p in sorted(NVRX.iterdir())])
    first = analysis.lagging[0]
    assert (first.pg, first.seq, first.op) == ("72", 44791, "all_to_all")
    assert first.input_sizes == ((2048, 5120),) and first.input_dtypes == ("BFloat16",)
    assert first.missing == (9, 14) and first.present == (8, 10, 11, 12, 13, 15)
    assert first.status[9] == (44790, 44787) and first.status[8] == (44796, 44790)
    assert {lag.pg for lag in analysis.lagging if lag.op != "?"} == {
        "72", "37", "38", "64", "69", "70", "90"}
    # the P2P-counted groups (default_pg carries the pipeline's sends here, 42 and 57 are
    # pipeline groups) count p2p_seq_id in pg_status: never compared across their members
    assert all(lag.op != "?" for lag in analysis.lagging)
    # both have pending work their peers completed: stuck on the device, the root cause
    assert {(st.pg, st.seq, st.op, st.stuck) for st in analysis.stuck if st.pg == "72"} == {
        ("72", 44788, "all_to_all", (9, 14))}
    assert {c.kind for c in analysis.verdict.culprits} == {"device"}
    assert {stall.stalled for stall in analysis.p2p} == {9, 14}
    assert analysis.stragglers == analysis.verdict.ranks == (9, 14)
    assert analysis.mismatches == []  # all_to_all sizes differ by design: not a desync


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
