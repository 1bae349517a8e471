"""The ``nccl_inspector`` collector tailing a real directory that a writer appends to (the
corpus' Inspector JSONL samples): appended, partial and rewritten files, golden exposition, no
directory. The record formats themselves are tested in tests/parsers/test_nccl_inspector.py."""

from __future__ import annotations

import shutil

import pytest
from support import FIXTURES

from laggard.collectors.base import NoDataError
from laggard.collectors.nccl_inspector import NcclInspectorCollector

DIR = FIXTURES / "analyze" / "inspector"


def test_collector_tails_appends_partial_lines_and_rewrites(tmp_path, expose, value):
    out = tmp_path / "node01-pid48.log"
    shutil.copy(DIR / "inspector04_doc_v4.3_dump_stats_marker_then_records.jsonl", out)
    collector = NcclInspectorCollector(str(tmp_path))
    text = expose(collector)
    assert value(text, 'laggard_nccl_collective_seconds_count{op="AllReduce"}') == 1
    assert value(text, 'laggard_nccl_collective_seconds_sum{op="AllReduce"}') == \
        pytest.approx(0.061974)
    assert value(text, 'laggard_nccl_collective_seconds_bucket{le="0.1",op="AllReduce"}') == 1
    assert value(text, 'laggard_nccl_collective_seconds_bucket{le="0.05",op="AllReduce"}') == 0
    assert value(text, 'laggard_nccl_bus_bandwidth_bytes_per_second{op="ReduceScatter"}') == \
        pytest.approx(366.134533e9)
    assert value(text, 'laggard_nccl_collective_bytes_total{op="AllReduce"}') == 17179869184
    assert value(text, "laggard_nccl_inspector_dropped_records_total") == 512

    line = (DIR / "inspector06_real_payload_v4.0_allreduce_3nodes_float_exec_time.jsonl") \
        .read_text().strip()
    with open(out, "a") as f:
        f.write(line + "\n" + line[:40])  # one whole record and the start of the next
    text = expose(collector)
    assert value(text, 'laggard_nccl_collective_seconds_count{op="AllReduce"}') == 2
    with open(out, "a") as f:
        f.write(line[40:] + "\nnot json\n")
    text = expose(collector)
    assert value(text, 'laggard_nccl_collective_seconds_count{op="AllReduce"}') == 3
    assert value(text, "laggard_nccl_inspector_malformed_lines_total") == 1
    assert value(text, 'laggard_nccl_bus_bandwidth_bytes_per_second{op="AllReduce"}') == \
        pytest.approx(0.55585e9)

    out.write_text(line + "\n")  # the file was rewritten (a new job with the same pid)
    text = expose(collector)
    assert value(text, 'laggard_nccl_collective_seconds_count{op="AllReduce"}') == 4


def test_collector_output_passes_promtool(tmp_path, expose, promtool):
    shutil.copy(DIR / "inspector02_doc_v4.0_verbose_reducescatter_event_trace.jsonl",
                tmp_path / "a.jsonl")
    promtool(expose(NcclInspectorCollector(str(tmp_path))))


def test_collector_without_directory_reports_no_data_naming_the_flag(tmp_path):
    # The agent logs this message: it names the flag to give, not an internal field.
    with pytest.raises(NoDataError, match=r"--collector\.nccl_inspector\.dir .*absent: no such"):
        list(NcclInspectorCollector(str(tmp_path / "absent")).collect())
    with pytest.raises(NoDataError, match=r"--collector\.nccl_inspector\.dir DIR") as caught:
        list(NcclInspectorCollector("").collect())
    assert "AgentConfig" not in str(caught.value)


def test_golden_exposition_of_every_jsonl_sample(tmp_path, expose, golden):
    for sample in DIR.glob("*.jsonl"):
        shutil.copy(sample, tmp_path)
    golden("nccl_inspector/every_sample.prom", expose(NcclInspectorCollector(str(tmp_path))))
