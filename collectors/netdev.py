"""Per-interface network counters from ``/proc/net/dev``, as node_exporter's netdev collector.

Format (Linux ``net/core/net-procfs.c``, ``dev_seq_show``): two header lines, then one line per
interface, ``%6s:`` followed by 8 receive and 8 transmit counters. The column names are read from
the second header line rather than assumed, so a kernel that adds columns still parses.

Which interfaces are exported (:class:`DeviceFilter`): a Kubernetes node with many pods has one
``veth`` per pod, hundreds of them, and exporting each would cost 18 series per pod that say
nothing about the node's network. By default an interface is kept when sysfs says it is backed by
hardware or is RDMA-capable, and dropped otherwise; ``--collector.netdev.device-include`` /
``--collector.netdev.device-exclude`` (node_exporter's names) replace that rule by a regular
expression, and at most ``--collector.netdev.max-devices`` interfaces are exported whatever
``/proc`` holds.
"""

from __future__ import annotations

import glob
import logging
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from laggard.collectors.base import AgentSettings, CollectorSpec, Flag, NoDataError
from laggard.parsers.proc_net_dev import parse_proc_net_dev

log = logging.getLogger(__name__)

#: Most interfaces exported (``--collector.netdev.max-devices``): 18 samples each, so at most
#: ~2 300 samples; a node's NICs, their SR-IOV functions and its InfiniBand ports fit with room.
DEFAULT_MAX_DEVICES = 128

#: Names of virtual interfaces, for an interface sysfs does not show (no sysfs mounted, or a
#: /proc of another network namespace): loopback, container and pod veths, bridges, CNI and
#: overlay devices (Docker, Calico, Flannel, Cilium, Weave, kube-proxy's IPVS dummy), tunnels,
#: the kernel's ifb/dummy/tun/tap devices, bonds, teams and VLANs (``eth0.100``).
VIRTUAL_NAMES = re.compile(
    r"lo|veth.*|docker\d*|br-.*|virbr.*|cni.*|flannel.*|cali.*|vxlan.*|tunl\d*|tun\d*|tap.*"
    r"|genev.*|kube-.*|cilium_.*|lxc.*|weave.*|vethwe.*|datapath|nodelocaldns|dummy\d*|ifb\d*"
    r"|ip6tnl\d*|ip_vti\d*|ip6_vti\d*|sit\d*|gre\d*|gretap\d*|erspan\d*|wg\d*|vnet\d*|nlmon\d*"
    r"|bond\d*|team\d*|.+\.\d+")

#: The rule said in ``--help`` and docs/agent.md.
DEFAULT_RULE = ("interfaces backed by a device (/sys/class/net/IF/device exists: physical "
                "NICs, their SR-IOV functions, IPoIB) or RDMA-capable (listed in "
                "/sys/class/infiniband/*/device/net/); virtual ones (lo, veth, bridges, "
                "docker0, CNI and overlay devices, tunnels, bonds, VLANs) are dropped, judged "
                "by name where sysfs does not show the interface")

# The collector's flags (node_exporter's names); the agent reads them from COLLECTOR below.
DEVICE_INCLUDE = Flag(
    "collector.netdev.device-include", "", metavar="REGEX", exclusive="devices",
    help="export only the network interfaces whose whole name matches (node_exporter's flag; "
         f"anchored: 'eth0|ib.*'). Default: {DEFAULT_RULE}")
DEVICE_EXCLUDE = Flag(
    "collector.netdev.device-exclude", "", metavar="REGEX", exclusive="devices",
    help="export every network interface except those whose whole name matches (instead of "
         "the default rule; not with -include)")
MAX_DEVICES = Flag(
    "collector.netdev.max-devices", DEFAULT_MAX_DEVICES, type=int, metavar="N",
    help="most network interfaces exported whatever /proc holds; the rest are counted in "
         "laggard_network_devices_not_exported (default %(default)s)")

#: HELP of the /proc/net/dev columns, from what the kernel sums into each
#: (``net/core/net-procfs.c``, ``dev_seq_printf_stats``).
COLUMN_HELP = {
    "receive_bytes": "Bytes received by the interface.",
    "receive_packets": "Packets received by the interface.",
    "receive_errs": "Receive errors reported by the driver (rx_errors).",
    "receive_drop": "Received packets dropped: no buffer or queue room, or missed by the NIC "
                    "(rx_dropped + rx_missed_errors).",
    "receive_fifo": "Receive FIFO overruns (rx_fifo_errors).",
    "receive_frame": "Received frames with length, overrun, CRC or alignment errors.",
    "receive_compressed": "Compressed packets received (CSLIP, PPP).",
    "receive_multicast": "Multicast packets received.",
    "transmit_bytes": "Bytes transmitted by the interface.",
    "transmit_packets": "Packets transmitted by the interface.",
    "transmit_errs": "Transmit errors reported by the driver (tx_errors).",
    "transmit_drop": "Packets dropped on transmit (tx_dropped).",
    "transmit_fifo": "Transmit FIFO underruns (tx_fifo_errors).",
    "transmit_colls": "Collisions while transmitting.",
    "transmit_carrier": "Transmit carrier, aborted, window and heartbeat errors.",
    "transmit_compressed": "Compressed packets transmitted (CSLIP, PPP).",
}


@dataclass(frozen=True, slots=True)
class DeviceFilter:
    """Which interfaces the collector exports.

    ``include`` and ``exclude`` are node_exporter's ``--collector.netdev.device-include`` /
    ``-exclude``, matched against the whole name (``eth0|ib.*``, not a substring); giving one
    replaces the default rule (:data:`DEFAULT_RULE`). At most one of them is set.

    Attributes:
        include: keep only the interfaces whose whole name matches; None: not given.
        exclude: keep every interface except those whose whole name matches; None: not given.
        max_devices: most interfaces exported; the rest (in name order, SR-IOV virtual
            functions last) are left out and counted.

    Raises:
        ValueError: both ``include`` and ``exclude`` are given, or ``max_devices`` < 1.
    """

    include: re.Pattern[str] | None = None
    exclude: re.Pattern[str] | None = None
    max_devices: int = DEFAULT_MAX_DEVICES

    def __post_init__(self) -> None:
        if self.include is not None and self.exclude is not None:
            raise ValueError("--collector.netdev.device-include and "
                             "--collector.netdev.device-exclude are mutually exclusive")
        if self.max_devices < 1:
            raise ValueError(f"--collector.netdev.max-devices {self.max_devices}: must be >= 1")

    @classmethod
    def from_flags(cls, include: str = "", exclude: str = "",
                   max_devices: int = DEFAULT_MAX_DEVICES) -> DeviceFilter:
        """From the flags' text (an empty string is a flag not given, as in node_exporter).

        Raises:
            ValueError: a pattern is not a regular expression (the message names its flag), or
                see the class.
        """
        return cls(include=_compile("device-include", include),
                   exclude=_compile("device-exclude", exclude), max_devices=max_devices)

    def wanted(self, name: str, sysfs: SysfsView) -> bool:
        """Whether interface ``name`` passes the filter (before the ``max_devices`` cap)."""
        if self.include is not None:
            return self.include.fullmatch(name) is not None
        if self.exclude is not None:
            return self.exclude.fullmatch(name) is None
        if name in sysfs.rdma_netdevs:
            return True
        if not sysfs.lists(name):  # no sysfs here, or /proc of another namespace: by name
            return VIRTUAL_NAMES.fullmatch(name) is None
        return sysfs.has_device(name)

    def select(self, names: Iterable[str], sysfs: SysfsView) -> tuple[list[str], int, int]:
        """The interfaces to export, in name order.

        Returns:
            (kept names, number dropped by the filter, number left out past ``max_devices``).
        """
        wanted, filtered = [], 0
        for name in sorted(names):
            if self.wanted(name, sysfs):
                wanted.append(name)
            else:
                filtered += 1
        if len(wanted) <= self.max_devices:
            return wanted, filtered, 0
        # Physical functions before SR-IOV virtual functions (these carry a device too).
        ranked = sorted(wanted, key=lambda n: (sysfs.is_virtual_function(n), n))
        kept = sorted(ranked[: self.max_devices])
        return kept, filtered, len(wanted) - len(kept)


def _compile(flag: str, pattern: str) -> re.Pattern[str] | None:
    if not pattern:
        return None
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"--collector.netdev.{flag} {pattern!r}: not a regular expression "
                         f"({exc})") from None


class SysfsView:
    """What sysfs says about network interfaces, read once per round.

    Args:
        sysfs_root: root of sysfs (``/sys``).
    """

    def __init__(self, sysfs_root: str) -> None:
        self.class_net = os.path.join(sysfs_root, "class", "net")
        self._mounted = os.path.isdir(self.class_net)
        # RDMA devices name their network interfaces (RoCE ports, IPoIB) under device/net/.
        self.rdma_netdevs = frozenset(
            os.path.basename(p) for p in
            glob.glob(os.path.join(glob.escape(sysfs_root), "class", "infiniband", "*",
                                   "device", "net", "*")))

    def lists(self, name: str) -> bool:
        """Whether sysfs shows the interface (False: no ``class/net`` there, or /proc is of
        another network namespace than sysfs)."""
        return self._mounted and os.path.lexists(os.path.join(self.class_net, name))

    def has_device(self, name: str) -> bool:
        """Backed by a device (PCI, virtio, USB...): ``class/net/IF/device`` exists."""
        return os.path.lexists(os.path.join(self.class_net, name, "device"))

    def is_virtual_function(self, name: str) -> bool:
        """An SR-IOV virtual function: its device links to its physical function."""
        return os.path.lexists(os.path.join(self.class_net, name, "device", "physfn"))


class NetdevCollector:
    """Byte, packet, error and drop counters per interface: ``laggard_network_*_total{device}``.

    From sysfs, where present (``Documentation/ABI/testing/sysfs-class-net``):
    ``laggard_network_carrier_changes_total{device}`` (link up/down transitions: a flapping
    cable or port) and ``laggard_network_up{device}`` (1 when ``operstate`` is ``up``).
    ``laggard_network_devices_not_exported{reason}`` counts the interfaces of the round left
    out by the filter (``filter``) or past the cap (``limit``).

    Args:
        proc_root: root of procfs (``/proc``; tests pass a fixture tree).
        sysfs_root: root of sysfs (``/sys``).
        device_filter: which interfaces to export (default: hardware-backed and RDMA ones).
    """

    name = "netdev"

    def __init__(self, proc_root: str = "/proc", sysfs_root: str = "/sys",
                 device_filter: DeviceFilter | None = None) -> None:
        self._path = os.path.join(proc_root, "net", "dev")
        self._sysfs_root = sysfs_root
        self._class_net = os.path.join(sysfs_root, "class", "net")
        self.device_filter = device_filter or DeviceFilter()
        self._over_limit = False

    def collect(self) -> Iterator[Metric]:
        """Read ``/proc/net/dev`` once.

        Raises:
            NoDataError: the file does not exist (no procfs).
        """
        try:
            with open(self._path, encoding="ascii", errors="replace") as f:
                devices = parse_proc_net_dev(f.read())
        except FileNotFoundError:
            raise NoDataError(f"{self._path} not found") from None
        kept, filtered, over = self.device_filter.select(devices, SysfsView(self._sysfs_root))
        self._log_limit(over, len(kept) + over)
        families: dict[str, CounterMetricFamily] = {}
        for device in kept:
            for column, value in devices[device].items():
                family = families.get(column)
                if family is None:
                    family = families[column] = CounterMetricFamily(
                        f"laggard_network_{column}", _column_help(column), labels=["device"])
                family.add_metric([device], value)
        yield from families.values()
        yield from self._link_state(kept)
        left_out = GaugeMetricFamily(
            "laggard_network_devices_not_exported",
            "Interfaces in /proc/net/dev not exported in the last round, by reason: filter "
            "(virtual, or outside --collector.netdev.device-include/-exclude), limit (past "
            "--collector.netdev.max-devices).", labels=["reason"])
        left_out.add_metric(["filter"], filtered)
        left_out.add_metric(["limit"], over)
        yield left_out

    def _log_limit(self, over: int, wanted: int) -> None:
        # Once when the cap starts to bite, once when it stops: not every round.
        if over and not self._over_limit:
            log.warning("netdev: %d interfaces pass the device filter, only the first %d are "
                        "exported (--collector.netdev.max-devices; narrow them with "
                        "--collector.netdev.device-include)", wanted,
                        self.device_filter.max_devices)
        elif not over and self._over_limit:
            log.info("netdev: every interface that passes the device filter is exported again")
        self._over_limit = bool(over)

    def _link_state(self, devices: list[str]) -> Iterator[Metric]:
        carrier = CounterMetricFamily(
            "laggard_network_carrier_changes_total",
            "Link carrier up/down transitions of the interface, from sysfs.", labels=["device"])
        up = GaugeMetricFamily("laggard_network_up",
                               "1 if the interface's operstate is up, 0 otherwise, from sysfs.",
                               labels=["device"])
        for device in devices:
            changes = _read_sysfs(os.path.join(self._class_net, device, "carrier_changes"))
            if changes is not None and changes.isdigit():
                carrier.add_metric([device], int(changes))
            state = _read_sysfs(os.path.join(self._class_net, device, "operstate"))
            if state is not None:
                up.add_metric([device], 1 if state == "up" else 0)
        yield carrier
        yield up


def _column_help(column: str) -> str:
    known = COLUMN_HELP.get(column)
    if known is not None:
        return f"{known[:-1]}, from /proc/net/dev."
    direction, _, what = column.partition("_")  # a column a newer kernel added
    return f"Interface counter {what} ({direction}), from /proc/net/dev."


def _read_sysfs(path: str) -> str | None:
    # A device can vanish between /proc/net/dev and sysfs, and a virtual device may lack the
    # attribute: either way the field is left out, never exported as 0.
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return None


def device_filter(settings: AgentSettings) -> DeviceFilter:
    """The :class:`DeviceFilter` the netdev flags ask for.

    Raises:
        ValueError: the device flags are invalid (see :meth:`DeviceFilter.from_flags`).
    """
    return DeviceFilter.from_flags(settings.flag(DEVICE_INCLUDE), settings.flag(DEVICE_EXCLUDE),
                                   settings.flag(MAX_DEVICES))


def from_config(settings: AgentSettings, context: object) -> NetdevCollector:
    """Registry factory.

    Raises:
        ValueError: the device flags are invalid (see :meth:`DeviceFilter.from_flags`).
    """
    return NetdevCollector(proc_root=settings.proc_root, sysfs_root=settings.sysfs_root,
                           device_filter=device_filter(settings))


COLLECTOR = CollectorSpec(
    name="netdev", build=from_config, default=True,
    help="per-interface counters from /proc/net/dev, physical and RDMA interfaces unless "
         "--collector.netdev.device-include/-exclude",
    flags=(DEVICE_INCLUDE, DEVICE_EXCLUDE, MAX_DEVICES), check=device_filter)
