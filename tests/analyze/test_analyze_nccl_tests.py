"""nccl-tests findings (``laggard.analyze.network.nccl_tests_findings``): peak and 1 GiB bus
bandwidth, the dip after the plateau, wrong results (answers from corpus/EXPECTED.md). The output
format is parsed in tests/parsers/test_nccl_tests.py."""

from __future__ import annotations

from support import FIXTURES, parse_file

from laggard.analyze.network import nccl_tests_findings
from laggard.parsers.nccl_tests import parse_nccl_tests

DIR = FIXTURES / "analyze"


def result_of(path):
    return parse_file(parse_nccl_tests, path)


def test_findings_report_peak_gib_and_the_dip_after_the_plateau():
    (f,) = nccl_tests_findings(
        "t", result_of(DIR / "nccltests01_all_reduce_perf_2node_16rank_h100_a3mega_8B_to_8G.txt"))
    assert f.kind == "busbw" and f.severity.value == "info"
    assert f.evidence["peak_busbw_gbps"] == 338.82 and f.evidence["busbw_1gib_gbps"] == 297.86
    assert f.evidence["ranks"] == 16 and f.evidence["dips_after_plateau"] == []
    (f3,) = nccl_tests_findings(
        "t", result_of(DIR / "nccltests03_alltoall_perf_32x_h800_4x400G_ib.txt"))
    assert f3.evidence["ranks"] == 32 and f3.evidence["busbw_1gib_gbps"] == 26.91
    assert f3.evidence["dips_after_plateau"] == [256 << 20]  # 25.49 < 0.9 x 29.47
    assert f3.severity.value == "warning"


def test_wrong_results_are_critical():
    (f,) = nccl_tests_findings("t", result_of(
        FIXTURES / "nccl_tests" / "launcher_prefixes_wrong_results.txt"))
    assert f.severity.value == "critical" and "WRONG" in f.message
