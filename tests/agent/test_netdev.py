"""netdev collector: /proc/net/dev fixtures (the corpus' net01 and a small tree)."""

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from support import FIXTURES

from laggard.collectors.base import NoDataError
from laggard.collectors.netdev import NetdevCollector
from laggard.parsers.proc_net_dev import parse_proc_net_dev


def test_corpus_net01_bridge_drops_and_bond_counters():
    text = (FIXTURES / "netdev" / "net01_proc_net_dev_bond_bridge_host_rx_drops.txt").read_text()
    devices = parse_proc_net_dev(text)
    assert devices["br0"]["receive_drop"] == 17015
    assert devices["bond0"]["receive_bytes"] == 1263036860348
    assert devices["bond0"]["receive_packets"] == 1658934221
    assert devices["bond0"]["receive_multicast"] == 6855409
    assert devices["bond0"]["transmit_bytes"] == 2547124549840
    nonzero = {(d, k) for d, c in devices.items() for k, v in c.items()
               if v and k.split("_")[1] in ("errs", "drop")}
    assert nonzero == {("br0", "receive_drop")}


def test_counters_glued_to_the_colon_parse():
    devices = parse_proc_net_dev(
        (FIXTURES / "netdev" / "proc" / "net" / "dev").read_text())
    assert devices["eth0"]["receive_bytes"] == 1263036860348
    assert devices["eth0"]["receive_errs"] == 3


def test_collector_exposition_on_a_fixture_tree():
    registry = CollectorRegistry()
    registry.register(NetdevCollector(proc_root=str(FIXTURES / "netdev" / "proc")))
    text = generate_latest(registry).decode()
    assert 'laggard_network_receive_bytes_total{device="eth0"} 1.263036860348e+12' in text
    assert 'laggard_network_transmit_packets_total{device="lo"} 48213.0' in text
    assert "# TYPE laggard_network_receive_drop_total counter" in text


def test_missing_procfs_is_no_data(tmp_path):
    with pytest.raises(NoDataError):
        list(NetdevCollector(proc_root=str(tmp_path)).collect())


def test_carrier_changes_and_operstate_from_sysfs_where_present():
    registry = CollectorRegistry()
    registry.register(NetdevCollector(proc_root=str(FIXTURES / "netdev" / "proc"),
                                      sysfs_root=str(FIXTURES / "netdev" / "sys")))
    assert registry.get_sample_value("laggard_network_carrier_changes_total",
                                     {"device": "eth0"}) == 7
    assert registry.get_sample_value("laggard_network_up", {"device": "eth0"}) == 1
    assert registry.get_sample_value("laggard_network_up", {"device": "lo"}) == 0
    # lo has no carrier_changes file: left out, not exported as 0.
    assert registry.get_sample_value("laggard_network_carrier_changes_total",
                                     {"device": "lo"}) is None
