"""InfiniBand listings: a ``grep -r . /sys/class/infiniband`` listing (the corpus' ib01, answers
from corpus/EXPECTED.md), ``head`` banners, ``ibstat`` and ``perfquery`` output; values that are
not counters and a listing cut mid-line. Findings from these ports are tested in
tests/analyze/test_analyze_network.py."""

from __future__ import annotations

from support import FIXTURES

from laggard.parsers.infiniband_listing import parse_ib_listing, parse_ibstat, parse_perfquery

IB01 = FIXTURES / "analyze" / "ib01_sysfs_infiniband_counters_h100_grep_listing.txt"


def test_ib01_listing_three_devices():
    with open(IB01) as f:
        ports = {p.device: p for p in parse_ib_listing(f)}
    assert sorted(ports) == ["mlx5_0", "mlx5_1", "mlx5_bond_0"]
    m0 = ports["mlx5_0"]
    assert (m0.rate, m0.state, m0.phys_state, m0.link_layer) == (
        "400 Gb/sec (4X NDR)", "ACTIVE", "LinkUp", "InfiniBand")
    assert m0.is_up is True
    assert m0.counters["link_downed"] == 0 and m0.counters["port_rcv_errors"] == 14
    assert m0.counters["excessive_buffer_overrun_errors"] == 15
    assert m0.counters["port_xmit_wait"] == 2489603687
    assert m0.counters["port_rcv_data"] == 230539874932483  # 4-byte words
    assert m0.counters["rx_write_requests"] == 3809045607  # hw_counters/ too
    m1 = ports["mlx5_1"]
    assert m1.counters["link_downed"] == 255 and m1.counters["port_rcv_switch_relay_errors"] == 2
    assert m1.counters["port_rcv_data"] == 205128687774249
    bond = ports["mlx5_bond_0"]
    assert (bond.rate, bond.link_layer) == ("200 Gb/sec (2X NDR)", "Ethernet")


def test_head_banners_and_space_separated_listings():
    lines = ["==> /sys/class/infiniband/mlx5_4/ports/1/counters/link_downed <==", "3", "",
             "==> /sys/class/infiniband/mlx5_4/ports/1/state <==", "1: DOWN",
             "/sys/class/infiniband/mlx5_5/ports/1/counters/symbol_error 9"]
    ports = {p.device: p for p in parse_ib_listing(lines)}
    assert ports["mlx5_4"].counters["link_downed"] == 3 and ports["mlx5_4"].state == "DOWN"
    assert ports["mlx5_4"].is_up is False
    assert ports["mlx5_5"].errors == {"symbol_error": 9}


def test_values_that_are_not_counters_and_a_cut_last_line_are_left_out():
    port = "/sys/class/infiniband/mlx5_9/ports/1/"
    lines = IB01.read_text().splitlines() + [
        port + "counters/symbol_error:N/A",
        port + "counters/port_rcv_errors:" + "9" * 4000,  # no 64-bit counter has 4000 digits
        "garbage without a path",
        port + "counters/link_downed:3",
        port + "counters/port_xmit_discards",  # cut before its value
    ]
    ports = {p.device: p for p in parse_ib_listing(lines)}
    assert ports["mlx5_9"].counters == {"link_downed": 3}
    assert ports["mlx5_0"].counters["port_rcv_errors"] == 14  # the file's own ports unchanged


def test_ibstat_state_physical_state_and_rate_per_port():
    with open(FIXTURES / "infiniband" / "ibstat_mlx5_2_port_down.txt") as f:
        ports = parse_ibstat(f)
    assert [(p.device, p.port, p.state, p.phys_state, p.rate, p.is_up) for p in ports] == [
        ("mlx5_2", 1, "DOWN", "Disabled", "400", False),
        ("mlx5_3", 1, "ACTIVE", "LinkUp", None, True)]
    assert ports[0].link_layer == "InfiniBand"


def test_ibstat_fields_before_any_port_are_not_a_port():
    assert parse_ibstat(["\t\tState: Active", "CA 'mlx5_0'", "\tCA type: MT4129"]) == []


def test_perfquery_counters_map_to_sysfs_names():
    lines = ["# Port counters: Lid 12 port 1 (CapMask: 0x5A00)", "PortSelect:......1",
             "SymbolErrorCounter:..............7", "LinkDownedCounter:...............2",
             "PortXmitWait:....................99"]
    (port,) = parse_perfquery(lines)
    assert port.device == "lid 12" and port.errors == {"link_downed": 2, "symbol_error": 7}
    assert port.counters["port_xmit_wait"] == 99


def test_perfquery_extended_header_and_lines_before_any_header():
    lines = ["SymbolErrorCounter:..............7",  # no port yet: ignored
             "# Port extended counters: Lid 3 port 2 (CapMask: 0x1A00)",
             "LinkDownedCounter:...............garbage", "LinkDownedCounter:...............4"]
    (port,) = parse_perfquery(lines)
    assert (port.device, port.port, port.counters) == ("lid 3", 2, {"link_downed": 4})
