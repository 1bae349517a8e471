"""netdev collector on a fixture tree (``proc/net/dev`` with counters glued to the colon, sysfs
``carrier_changes`` and ``operstate``): golden exposition, no procfs, partial sysfs and rows the
parser skips. The file format is tested in tests/parsers/test_proc_net_dev.py."""

import shutil

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from support import FIXTURES

from laggard.collectors.base import NoDataError
from laggard.collectors.netdev import NetdevCollector

PROC = FIXTURES / "netdev" / "proc"
SYS = FIXTURES / "netdev" / "sys"


def test_collector_exposition_on_a_fixture_tree():
    registry = CollectorRegistry()
    registry.register(NetdevCollector(proc_root=str(PROC)))
    text = generate_latest(registry).decode()
    assert 'laggard_network_receive_bytes_total{device="eth0"} 1.263036860348e+12' in text
    assert 'laggard_network_transmit_packets_total{device="lo"} 48213.0' in text
    assert "# TYPE laggard_network_receive_drop_total counter" in text


def test_golden_exposition(expose, golden):
    golden("netdev/netdev.prom", expose(NetdevCollector(proc_root=str(PROC),
                                                        sysfs_root=str(SYS))))


def test_exposition_passes_promtool(expose, promtool):
    promtool(expose(NetdevCollector(proc_root=str(PROC), sysfs_root=str(SYS))))


def test_missing_procfs_is_no_data(tmp_path):
    with pytest.raises(NoDataError):
        list(NetdevCollector(proc_root=str(tmp_path)).collect())


def test_carrier_changes_and_operstate_from_sysfs_where_present():
    registry = CollectorRegistry()
    registry.register(NetdevCollector(proc_root=str(PROC), sysfs_root=str(SYS)))
    assert registry.get_sample_value("laggard_network_carrier_changes_total",
                                     {"device": "eth0"}) == 7
    assert registry.get_sample_value("laggard_network_up", {"device": "eth0"}) == 1
    assert registry.get_sample_value("laggard_network_up", {"device": "lo"}) == 0
    # lo has no carrier_changes file: left out, not exported as 0.
    assert registry.get_sample_value("laggard_network_carrier_changes_total",
                                     {"device": "lo"}) is None


def test_partial_sysfs_and_a_cut_row_cost_only_their_own_series(tmp_path):
    shutil.copytree(PROC, tmp_path / "proc")
    shutil.copytree(SYS, tmp_path / "sys")
    dev = tmp_path / "proc" / "net" / "dev"
    dev.write_text(dev.read_text() + "  eth1: 1263036860348 1658934221    0")  # a partial read
    eth0 = tmp_path / "sys" / "class" / "net" / "eth0"
    (eth0 / "carrier_changes").write_text("N/A\n")  # not a count
    (eth0 / "operstate").unlink()  # the device vanished from sysfs between the two reads
    registry = CollectorRegistry()
    registry.register(NetdevCollector(proc_root=str(tmp_path / "proc"),
                                      sysfs_root=str(tmp_path / "sys")))
    labels = {"device": "eth0"}
    assert registry.get_sample_value("laggard_network_carrier_changes_total", labels) is None
    assert registry.get_sample_value("laggard_network_up", labels) is None
    assert registry.get_sample_value("laggard_network_receive_errs_total", labels) == 3
    assert registry.get_sample_value("laggard_network_receive_bytes_total",
                                     {"device": "eth1"}) is None
    assert registry.get_sample_value("laggard_network_up", {"device": "lo"}) == 0
