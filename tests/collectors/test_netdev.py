"""netdev collector on a fixture tree (``proc/net/dev`` with counters glued to the colon, sysfs
``carrier_changes`` and ``operstate``): golden exposition, no procfs, partial sysfs and rows the
parser skips; on a generated tree of a node with 2,000 veths: the default device rule,
``--collector.netdev.device-include/-exclude`` and the cap on interfaces. The file format is
tested in tests/parsers/test_proc_net_dev.py."""

import argparse
import logging
import re
import shutil
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from support import FIXTURES

from laggard.agent import daemon
from laggard.agent import registry as collectors
from laggard.collectors.base import NoDataError
from laggard.collectors.netdev import DeviceFilter, NetdevCollector

PROC = FIXTURES / "netdev" / "proc"
SYS = FIXTURES / "netdev" / "sys"
#: The fixture's eth0 has a device, its lo none: this keeps lo too.
BOTH = DeviceFilter.from_flags(include="eth0|lo")


def test_collector_exposition_on_a_fixture_tree():
    registry = CollectorRegistry()
    registry.register(NetdevCollector(proc_root=str(PROC), sysfs_root=str(SYS),
                                      device_filter=BOTH))
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
    registry.register(NetdevCollector(proc_root=str(PROC), sysfs_root=str(SYS),
                                      device_filter=BOTH))
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
                                      sysfs_root=str(tmp_path / "sys"),
                                      device_filter=DeviceFilter.from_flags(include="eth.|lo")))
    labels = {"device": "eth0"}
    assert registry.get_sample_value("laggard_network_carrier_changes_total", labels) is None
    assert registry.get_sample_value("laggard_network_up", labels) is None
    assert registry.get_sample_value("laggard_network_receive_errs_total", labels) == 3
    assert registry.get_sample_value("laggard_network_receive_bytes_total",
                                     {"device": "eth1"}) is None
    assert registry.get_sample_value("laggard_network_up", {"device": "lo"}) == 0


# -- which interfaces are exported ------------------------------------------------------------

_HEADER = ("Inter-|   Receive                                                |  Transmit\n"
           " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets "
           "errs drop fifo colls carrier compressed\n")
#: Interfaces sysfs shows without a device: virtual.
_VIRTUAL = ("lo", "docker0", "cni0", "flannel.1", "vxlan.calico", "cali0123abcd", "tunl0",
            "br-5f2a", "bond0", "eth0.100")
_VETHS = tuple(f"veth{i:x}" for i in range(2000))


def _node_tree(root: Path, *, veths: tuple[str, ...] = _VETHS) -> tuple[str, str]:
    """A procfs and a sysfs of a Kubernetes GPU node: ``veths`` pod interfaces, the virtual
    interfaces above, one physical NIC (``enp65s0f0``: class/net/IF/device) and one RDMA
    interface that sysfs lists only under its InfiniBand device (``ibp12s0``)."""
    names = ("enp65s0f0", "ibp12s0", *_VIRTUAL, *veths)
    proc, sys = root / "proc", root / "sys"
    (proc / "net").mkdir(parents=True)
    rows = "".join(f"{n:>6}: {i + 1} 2 3 4 5 6 7 8 {i + 9} 10 11 12 13 14 15 16\n"
                   for i, n in enumerate(names))
    (proc / "net" / "dev").write_text(_HEADER + rows)
    for name in names:
        (sys / "class" / "net" / name).mkdir(parents=True)
        (sys / "class" / "net" / name / "operstate").write_text("up\n")
    (sys / "class" / "net" / "enp65s0f0" / "device").mkdir()
    (sys / "class" / "infiniband" / "mlx5_0" / "device" / "net" / "ibp12s0").mkdir(parents=True)
    return str(proc), str(sys)


def _devices(text: str) -> set[str]:
    """The ``device`` label values of the exposition's laggard_network_* samples."""
    return set(re.findall(r'^laggard_network_[a-z_]+\{device="([^"]+)"\}', text, flags=re.M))


def test_2000_veths_by_default_only_the_physical_and_rdma_interfaces_are_exported(
        tmp_path, expose, promtool):
    proc, sys = _node_tree(tmp_path)
    text = expose(NetdevCollector(proc_root=proc, sysfs_root=sys))
    assert _devices(text) == {"enp65s0f0", "ibp12s0"}
    samples = [ln for ln in text.splitlines() if ln.startswith("laggard_network_")]
    # 16 counters and operstate per interface, two not-exported counts; no carrier_changes files
    assert len(samples) == 2 * 17 + 2
    assert len(text) < 10_000  # 2.0 MB before the filter
    assert 'laggard_network_devices_not_exported{reason="filter"} 2010.0' in text
    assert 'laggard_network_devices_not_exported{reason="limit"} 0.0' in text
    promtool(text)


def test_device_include_is_a_whole_name_match_and_replaces_the_default_rule(tmp_path, expose):
    proc, sys = _node_tree(tmp_path)
    include = DeviceFilter.from_flags(include="veth1|lo|enp.*")
    text = expose(NetdevCollector(proc_root=proc, sysfs_root=sys, device_filter=include))
    assert _devices(text) == {"veth1", "lo", "enp65s0f0"}  # not veth10, veth1f3...
    assert 'laggard_network_devices_not_exported{reason="filter"} 2009.0' in text


def test_device_exclude_keeps_everything_else(tmp_path, expose):
    proc, sys = _node_tree(tmp_path)
    exclude = DeviceFilter.from_flags(exclude="veth.*|lo")
    text = expose(NetdevCollector(proc_root=proc, sysfs_root=sys, device_filter=exclude))
    assert _devices(text) == {"enp65s0f0", "ibp12s0", *_VIRTUAL} - {"lo"}


def test_include_and_exclude_are_mutually_exclusive_and_must_be_regexes():
    with pytest.raises(ValueError, match="mutually exclusive"):
        DeviceFilter.from_flags(include="eth.*", exclude="veth.*")
    with pytest.raises(ValueError, match=r"--collector\.netdev\.device-exclude '\(': not a "):
        DeviceFilter.from_flags(exclude="(")
    with pytest.raises(ValueError, match="max-devices 0"):
        DeviceFilter.from_flags(max_devices=0)
    assert DeviceFilter.from_flags(include="", exclude="") == DeviceFilter()  # "" = not given


def test_past_the_cap_the_rest_is_counted_and_logged_once(tmp_path, expose, caplog):
    proc, sys = _node_tree(tmp_path)
    collector = NetdevCollector(proc_root=proc, sysfs_root=sys,
                                device_filter=DeviceFilter.from_flags(include="veth.*",
                                                                      max_devices=5))
    with caplog.at_level(logging.WARNING, logger="laggard.collectors.netdev"):
        text = expose(collector)
        expose(collector)
    assert len(_devices(text)) == 5
    assert 'laggard_network_devices_not_exported{reason="limit"} 1995.0' in text
    assert 'laggard_network_devices_not_exported{reason="filter"} 12.0' in text
    assert len([r for r in caplog.records if "max-devices" in r.getMessage()]) == 1


def test_under_the_cap_physical_functions_go_before_sriov_virtual_functions(tmp_path, expose):
    proc, sys = _node_tree(tmp_path, veths=())
    net = Path(sys) / "class" / "net"
    dev = Path(proc) / "net" / "dev"
    vfs = [f"enp65s0f0v{i}" for i in range(3)]
    dev.write_text(dev.read_text() + "".join(
        f"{n}: 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16\n" for n in vfs))
    for name in vfs:
        (net / name / "device" / "physfn").mkdir(parents=True)
    collector = NetdevCollector(proc_root=proc, sysfs_root=sys,
                                device_filter=DeviceFilter(max_devices=3))
    assert _devices(expose(collector)) == {"enp65s0f0", "ibp12s0", "enp65s0f0v0"}


def test_without_sysfs_virtual_interfaces_are_told_by_name(tmp_path, expose):
    proc, _ = _node_tree(tmp_path, veths=_VETHS[:50])
    text = expose(NetdevCollector(proc_root=proc, sysfs_root=str(tmp_path / "no-sysfs")))
    assert _devices(text) == {"enp65s0f0", "ibp12s0"}


def test_the_agent_flags_reach_the_collector(tmp_path, expose):
    proc, sys = _node_tree(tmp_path, veths=_VETHS[:20])
    parser = argparse.ArgumentParser()
    daemon.add_arguments(parser)
    args = parser.parse_args(["--path.procfs", proc, "--path.sysfs", sys,
                              "--collector.netdev.device-include", "veth[0-9]|ib.*",
                              "--collector.netdev.max-devices", "4"])
    config = daemon.config_from_args(args)
    collector = collectors.build("netdev", config, object())
    assert _devices(expose(collector)) == {"veth0", "veth1", "veth2", "ibp12s0"}
    with pytest.raises(SystemExit):  # argparse: not allowed with the other
        parser.parse_args(["--collector.netdev.device-include", "a",
                           "--collector.netdev.device-exclude", "b"])
    with pytest.raises(ValueError, match="--collector.netdev.device-include"):
        daemon.config_from_args(parser.parse_args(["--collector.netdev.device-include", "[z"]))
    assert "device-include" in parser.format_help()
    assert "/sys/class/net/IF/device" in " ".join(parser.format_help().split())
