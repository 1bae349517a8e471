"""InfiniBand listings (sysfs grep, ibstat, perfquery) and /proc/net/dev (answers from
corpus/EXPECTED.md)."""

from __future__ import annotations

from support import FIXTURES

from laggard.analyze.network import ib_findings, netdev_findings
from laggard.parsers.infiniband_listing import parse_ib_listing, parse_ibstat, parse_perfquery
from laggard.parsers.proc_net_dev import parse_proc_net_dev

DIR = FIXTURES / "analyze"


def test_ib01_listing_three_devices():
    with open(DIR / "ib01_sysfs_infiniband_counters_h100_grep_listing.txt") as f:
        ports = {p.device: p for p in parse_ib_listing(f)}
    assert sorted(ports) == ["mlx5_0", "mlx5_1", "mlx5_bond_0"]
    m0 = ports["mlx5_0"]
    assert (m0.rate, m0.state, m0.phys_state, m0.link_layer) == (
        "400 Gb/sec (4X NDR)", "ACTIVE", "LinkUp", "InfiniBand")
    assert m0.counters["link_downed"] == 0 and m0.counters["port_rcv_errors"] == 14
    assert m0.counters["excessive_buffer_overrun_errors"] == 15
    assert m0.counters["port_xmit_wait"] == 2489603687
    assert m0.counters["port_rcv_data"] == 230539874932483  # 4-byte words
    m1 = ports["mlx5_1"]
    assert m1.counters["link_downed"] == 255 and m1.counters["port_rcv_switch_relay_errors"] == 2
    assert m1.counters["port_rcv_data"] == 205128687774249
    bond = ports["mlx5_bond_0"]
    assert (bond.rate, bond.link_layer) == ("200 Gb/sec (2X NDR)", "Ethernet")
    findings = {f.subject: f for f in ib_findings("x", list(ports.values()))}
    assert findings["mlx5_1 port 1"].severity.value == "warning"  # the anomaly
    assert findings["mlx5_1 port 1"].evidence["errors"]["link_downed"] == 255
    assert findings["mlx5_0 port 1"].severity.value == "info"
    assert findings["mlx5_0 port 1"].evidence["port_rcv_data_bytes"] == 230539874932483 * 4


def test_ibstat_port_down_is_critical():
    lines = ["CA 'mlx5_2'", "\tCA type: MT4129", "\tPort 1:", "\t\tState: Down",
             "\t\tPhysical state: Disabled", "\t\tRate: 400", "\t\tLink layer: InfiniBand",
             "CA 'mlx5_3'", "\tPort 1:", "\t\tState: Active", "\t\tPhysical state: LinkUp"]
    ports = parse_ibstat(lines)
    assert [(p.device, p.state, p.phys_state, p.is_up) for p in ports] == [
        ("mlx5_2", "DOWN", "Disabled", False), ("mlx5_3", "ACTIVE", "LinkUp", True)]
    (f,) = ib_findings("x", ports)
    assert f.subject == "mlx5_2 port 1" and f.severity.value == "critical"


def test_perfquery_counters_map_to_sysfs_names():
    lines = ["# Port counters: Lid 12 port 1 (CapMask: 0x5A00)", "PortSelect:......1",
             "SymbolErrorCounter:..............7", "LinkDownedCounter:...............2",
             "PortXmitWait:....................99"]
    (port,) = parse_perfquery(lines)
    assert port.device == "lid 12" and port.errors == {"link_downed": 2, "symbol_error": 7}


def test_net01_bridge_drops_with_echoed_command_and_date():
    text = (DIR / "net01_proc_net_dev_bond_bridge_host_rx_drops.txt").read_text()
    devices = parse_proc_net_dev(text)
    assert devices["bond0"]["receive_bytes"] == 1263036860348
    assert devices["bond0"]["receive_packets"] == 1658934221
    assert devices["bond0"]["receive_multicast"] == 6855409
    assert devices["bond0"]["transmit_bytes"] == 2547124549840
    (f,) = netdev_findings("x", devices, "Tue Nov 13 18:12:01 GMT 2018")
    assert f.subject == "br0" and f.evidence["receive_drop"] == 17015
    assert f.severity.value == "info"  # drops, no errors


def test_head_banners_and_space_separated_listings():
    lines = ["==> /sys/class/infiniband/mlx5_4/ports/1/counters/link_downed <==", "3", "",
             "==> /sys/class/infiniband/mlx5_4/ports/1/state <==", "1: DOWN",
             "/sys/class/infiniband/mlx5_5/ports/1/counters/symbol_error 9"]
    ports = {p.device: p for p in parse_ib_listing(lines)}
    assert ports["mlx5_4"].counters["link_downed"] == 3 and ports["mlx5_4"].state == "DOWN"
    assert ports["mlx5_5"].errors == {"symbol_error": 9}
