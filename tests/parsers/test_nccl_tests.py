"""nccl-tests output (``all_reduce_perf``, ``alltoall_perf``): the corpus tables (answers from
corpus/EXPECTED.md), launcher prefixes on result rows, wrong results and out-of-bounds counts,
a table cut mid-row. Findings from these results are tested in
tests/analyze/test_analyze_nccl_tests.py."""

from __future__ import annotations

from support import FIXTURES, parse_file

from laggard.parsers.nccl_tests import GIB, parse_nccl_tests

DIR = FIXTURES / "analyze"
ALL_REDUCE = DIR / "nccltests01_all_reduce_perf_2node_16rank_h100_a3mega_8B_to_8G.txt"


def result_of(name: str):
    return parse_file(parse_nccl_tests, DIR / name)


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


def test_wrong_results_and_launcher_prefixes():
    with open(FIXTURES / "nccl_tests" / "launcher_prefixes_wrong_results.txt") as f:
        r = parse_nccl_tests(f)
    assert [row.size_bytes for row in r.rows] == [1048576, 2097152]  # "[1,0]<stdout>:", "0:"
    assert r.devices[0].host == "gpu-a" and r.devices[0].pci_bus_id == "0x1a"
    assert r.rows[0].wrong == 3 and r.rows[1].wrong == 0
    assert r.wrong_total == 3 and r.out_of_bounds == 3


def test_a_table_cut_mid_row_keeps_the_whole_rows():
    lines = ALL_REDUCE.read_text().splitlines()
    first = next(n for n, line in enumerate(lines) if line.strip().startswith("8 "))
    cut = lines[:first + 3] + [lines[first + 3][:30]]  # three rows, then half of one
    r = parse_nccl_tests(cut)
    assert [row.size_bytes for row in r.rows] == [8, 16, 32]
    assert r.avg_busbw is None  # the trailer was never reached
