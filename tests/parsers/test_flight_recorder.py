"""Flight-recorder dumps: the restricted unpickler, the three encodings (pickle, JSON, the printed
form) and torch's fr_trace report, on NVRx's 16-rank GPU_ERROR dump set and the corpus' printed
dumps (answers from corpus/EXPECTED.md); truncated, corrupt and hostile files. Cross-rank
matching is tested in tests/analyze/test_analyze_flight_recorder.py."""

from __future__ import annotations

import json
import pickle
import pickletools

import pytest
from support import FIXTURES

from laggard.detectors.flight_recorder import analyze_dumps
from laggard.parsers.flight_recorder import (
    DumpError,
    load_dump,
    parse_fr_trace_report,
    rank_from_filename,
)

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


def test_the_same_dump_as_json_and_as_a_pickle_loads_alike(tmp_path):
    # NVRx's rank 9 pickle written again as JSON (TORCH_FR_DUMP ... json=True): same content
    pickled = load_dump(str(NVRX / "_dump_9"))
    with open(NVRX / "_dump_9", "rb") as f:
        raw = pickle.load(f)  # the corpus file, trusted here only to re-encode it
    as_json = tmp_path / "nccl_trace_rank_9.json"
    as_json.write_text(json.dumps(raw))
    loaded = load_dump(str(as_json))
    assert loaded.rank == 9 and loaded.version == pickled.version
    assert loaded.groups == pickled.groups and loaded.entries == pickled.entries


@pytest.mark.parametrize(("name", "rank"), [
    ("_dump_9", 9), ("nccl_trace_rank_14", 14), ("trace_rank3.json", 3), ("dump.txt", None),
])
def test_the_rank_is_read_from_the_file_name(name, rank):
    assert rank_from_filename(f"/tmp/fr/{name}") == rank


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
