"""nccl-tests output parser on the corpus tables (answers from corpus/EXPECTED.md)."""

from __future__ import annotations

from support import FIXTURES

from laggard.analyze.network import nccl_tests_findings
from laggard.parsers.nccl_tests import GIB, parse_nccl_tests

DIR = FIXTURES / "analyze"


def result_of(name: str):
    with open(DIR / name, encoding="utf-8") as f:
        return parse_nccl_tests(f)


def test_all_reduce_16_ranks_sweep():
    r = result_of("nccltests01_all_reduce_perf_2node_16rank_h100_a3mega_8B_to_8G.txt")
    assert r.nranks == 16 and r.inferred_nranks == 16
    assert [d.host for d in r.devices] == ["node01"] * 8 + ["node02"] * 8
    assert r.devices[2].pci_bus_id == "0000:0b:00" and "H100" in r.devices[2].name
    assert len(r.rows) == 31 and r.wrong_total == 0 and r.out_of_bounds == 0
    gib = r.row_at(GIB)
    assert (gib.time_us, gib.algbw, gib.busbw, gib.inplace_busbw) == (6759.0, 158.86, 297.86,
                                                                      298.82)
    top = r.row_at(8 * GIB)
    assert (top.time_us, top.algbw, top.busbw, top.inplace_busbw) == (47535.0, 180.71, 338.82,
                                                                      337.35)
    assert r.peak is top
    assert r.avg_busbw == 70.742  # the trailer's mean over all sizes, not the peak
    assert r.rows[0].redop == "sum" and r.rows[0].root == -1


def test_alltoall_32_ranks_without_device_lines():
    r = result_of("nccltests03_alltoall_perf_32x_h800_4x400G_ib.txt")
    assert r.nranks is None
    assert r.inferred_nranks == 32  # busbw = algbw * 31/32
    top = r.row_at(8 * GIB)
    assert (top.time_us, top.algbw, top.busbw, top.inplace_busbw) == (282400.0, 30.42, 29.47,
                                                                      29.03)
    assert r.row_at(GIB).busbw == 26.91
    assert r.avg_busbw == 11.1949
    assert sum(1 for row in r.rows if row.size_bytes == 0) == 4
    assert {row.inplace_wrong for row in r.rows} == {None}  # "N/A"
    assert {row.redop for row in r.rows} == {"none"}


def test_findings_report_peak_gib_and_the_dip_after_the_plateau():
    (f,) = nccl_tests_findings("t", result_of(
        "nccltests01_all_reduce_perf_2node_16rank_h100_a3mega_8B_to_8G.txt"))
    assert f.kind == "busbw" and f.severity.value == "info"
    assert f.evidence["peak_busbw_gbps"] == 338.82 and f.evidence["busbw_1gib_gbps"] == 297.86
    assert f.evidence["ranks"] == 16 and f.evidence["dips_after_plateau"] == []
    (f3,) = nccl_tests_findings("t", result_of("nccltests03_alltoall_perf_32x_h800_4x400G_ib.txt"))
    assert f3.evidence["ranks"] == 32 and f3.evidence["busbw_1gib_gbps"] == 26.91
    assert f3.evidence["dips_after_plateau"] == [256 << 20]  # 25.49 < 0.9 x 29.47
    assert f3.severity.value == "warning"


def test_wrong_results_and_launcher_prefixes():
    lines = [
        "# Using devices",
        "#   Rank  0 Pid  12345 on   gpu-a device  0 [0x1a] Tesla V100-SXM2-32GB",
        "[1,0]<stdout>:     1048576        262144     float     sum      -1    203.2    5.16"
        "    9.68      3    207.2    5.06    9.49      0",
        "0:     2097152        524288     float     sum      -1    254.0    8.26   15.48      0"
        "    252.9    8.29   15.55      0",
        "# Out of bounds values : 3 FAILED",
    ]
    r = parse_nccl_tests(lines)
    assert [row.size_bytes for row in r.rows] == [1048576, 2097152]
    assert r.devices[0].host == "gpu-a" and r.devices[0].pci_bus_id == "0x1a"
    assert r.wrong_total == 3 and r.out_of_bounds == 3
    (f,) = nccl_tests_findings("t", r)
    assert f.severity.value == "critical" and "WRONG" in f.message
