"""NCCL Inspector JSONL: every documented record shape (answers from corpus/EXPECTED.md), orphan
bodies and garbage lines counted. The collector that tails these files is tested in
tests/collectors/test_nccl_inspector.py."""

from __future__ import annotations

import json

import pytest
from support import FIXTURES

from laggard.parsers.nccl_inspector import InspectorStream, parse_inspector_lines

DIR = FIXTURES / "analyze" / "inspector"


def records_of(name: str):
    with open(DIR / name, encoding="utf-8") as f:
        return parse_inspector_lines(f)


def test_v40_basic_record():
    (r,), stream = records_of("inspector01_doc_v4.0_allreduce_coll_perf.jsonl")
    assert (r.comm_id, r.rank, r.n_ranks, r.nnodes) == ("0x7f8c496ae9f661", 2, 8, 1)
    assert (r.op, r.sn, r.msg_size_bytes, r.exec_time_us) == ("AllReduce", 1407, 17179869184,
                                                              61974.0)
    assert r.algbw_gbs == 277.210914 and r.busbw_gbs == 485.119099
    assert r.busbw_gbs == pytest.approx(r.algbw_gbs * 2 * 7 / 8, rel=1e-6)
    assert r.algbw_gbs == pytest.approx(r.msg_size_bytes / r.exec_time_us / 1e3, rel=1e-6)
    assert r.timing_source is None and stream.malformed == 0


def test_v40_verbose_reduce_scatter():
    (r,), _ = records_of("inspector02_doc_v4.0_verbose_reducescatter_event_trace.jsonl")
    assert (r.op, r.sn, r.msg_size_bytes, r.exec_time_us, r.rank) == (
        "ReduceScatter", 1231, 2147483648, 41057.0, 4)
    # for ReduceScatter the size is per rank: algbw = size x n_ranks / time
    assert r.algbw_gbs == pytest.approx(r.msg_size_bytes * 8 / r.exec_time_us / 1e3, rel=1e-6)
    assert r.busbw_gbs == pytest.approx(r.algbw_gbs * 7 / 8, rel=1e-6)
    assert r.timing_source == "kernel_gpu"
    assert r.kernel_span_us == 1752867229275811 - 1752867229235181 == 40630
    assert r.cpu_span_us == 5  # the CPU start->stop callbacks, not the execution


def test_v42_comm_name_algo_proto():
    (r,), _ = records_of("inspector03_doc_v4.2_comm_name_algo_proto.jsonl")
    assert (r.comm_name, r.algo, r.proto, r.version) == ("DP Group 0", "RING", "LL", "v4.2")


def test_v43_marker_gives_context_and_its_count_mismatch_is_flagged():
    records, stream = records_of("inspector04_doc_v4.3_dump_stats_marker_then_records.jsonl")
    assert [(r.op, r.sn, r.rank, r.n_ranks, r.pid) for r in records] == [
        ("AllReduce", 1407, 2, 8, 1639453), ("ReduceScatter", 1231, 2, 8, 1639453)]
    assert stream.markers == 1 and stream.last_stats.stats["coll_records"] == 1024
    assert stream.last_stats.stats["proxy_pxn_skipped_process_total"] == 5
    assert stream.count_mismatches == 1  # 1024 announced, 2 followed
    assert stream.dropped == 512


def test_v43_proxy_step_and_op_are_read_not_taken_for_collectives():
    records, stream = records_of("inspector05_doc_v4.3_proxy_step_and_op_inner_objects.jsonl")
    assert records == [] and stream.proxy == 2 and stream.malformed == 0
    with open(DIR / "inspector05_doc_v4.3_proxy_step_and_op_inner_objects.jsonl") as f:
        s = InspectorStream()
        step, op = (s.feed(line) for line in f)
    for r in (step, op):
        assert (r.parent_type, r.parent_sn, r.proxy_op_sn, r.rank, r.peer, r.direction,
                r.channel_id) == ("coll", 1407, 12, 2, 3, "send", 0)
    assert (step.record_type, step.trans_size_bytes, step.duration_us) == (
        "proxy_step", 1048576, 40)
    assert (op.record_type, op.n_steps, op.n_steps_completed, op.n_steps_dropped,
            op.duration_us) == ("proxy_op", 1, 1, 0, 70)
    # real lines wrap the same object under a top-level "proxy_trace" field
    wrapped = json.dumps({"proxy_trace": {"record_type": "proxy_op", "parent_sn": 1407}})
    s = InspectorStream()
    assert s.feed(wrapped).parent_sn == 1407 and s.proxy == 1


def test_real_payload_with_float_exec_time_reads_rank_from_header():
    (r,), _ = records_of("inspector06_real_payload_v4.0_allreduce_3nodes_float_exec_time.jsonl")
    assert (r.rank, r.n_ranks, r.nnodes, r.hostname) == (1, 3, 3, "node01")
    assert (r.op, r.sn, r.msg_size_bytes, r.exec_time_us) == ("AllReduce", 8995, 2360832, 5663.0)
    assert r.busbw_gbs == pytest.approx(r.algbw_gbs * 2 * 2 / 3, rel=1e-5)


def test_orphan_v43_body_and_garbage_lines():
    s = InspectorStream()
    assert s.feed('{"coll_perf": {"coll": "AllReduce", "coll_sn": 1, "coll_msg_size_bytes": 8,'
                  ' "coll_exec_time_us": 3}}').rank is None
    assert s.orphans == 1
    for junk in ("not json", "[1, 2]", '{"other": 1}', '{"coll_perf": {"coll": 5}}', "\x00\x01"):
        assert s.feed(junk) is None
    assert s.malformed == 5

