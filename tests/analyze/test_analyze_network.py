"""Findings from InfiniBand ports and /proc/net/dev counters (``laggard.analyze.network``;
answers from corpus/EXPECTED.md). The listings themselves are parsed in
tests/parsers/test_infiniband_listing.py and tests/parsers/test_proc_net_dev.py."""

from __future__ import annotations

from support import FIXTURES

from laggard.analyze.network import ib_findings, netdev_findings
from laggard.parsers.infiniband_listing import parse_ib_listing, parse_ibstat
from laggard.parsers.proc_net_dev import parse_proc_net_dev

DIR = FIXTURES / "analyze"


def test_ib01_link_downed_is_the_warning_and_data_is_reported_in_bytes():
    with open(DIR / "ib01_sysfs_infiniband_counters_h100_grep_listing.txt") as f:
        ports = parse_ib_listing(f)
    findings = {f.subject: f for f in ib_findings("x", ports)}
    assert findings["mlx5_1 port 1"].severity.value == "warning"  # the anomaly
    assert findings["mlx5_1 port 1"].evidence["errors"]["link_downed"] == 255
    assert findings["mlx5_0 port 1"].severity.value == "info"
    assert findings["mlx5_0 port 1"].evidence["port_rcv_data_bytes"] == 230539874932483 * 4


def test_ibstat_port_down_is_critical():
    with open(FIXTURES / "infiniband" / "ibstat_mlx5_2_port_down.txt") as f:
        ports = parse_ibstat(f)
    (f,) = ib_findings("x", ports)
    assert f.subject == "mlx5_2 port 1" and f.severity.value == "critical"


def test_net01_bridge_drops_are_info():
    devices = parse_proc_net_dev((DIR / "net01_proc_net_dev_bond_bridge_host_rx_drops.txt")
                                 .read_text())
    (f,) = netdev_findings("x", devices, "Tue Nov 13 18:12:01 GMT 2018")
    assert f.subject == "br0" and f.evidence["receive_drop"] == 17015
    assert f.severity.value == "info"  # drops, no errors
