"""Per-interface network counters from ``/proc/net/dev``, as node_exporter's netdev collector.

Format (Linux ``net/core/net-procfs.c``, ``dev_seq_show``): two header lines, then one line per
interface, ``%6s:`` followed by 8 receive and 8 transmit counters. The column names are read from
the second header line rather than assumed, so a kernel that adds columns still parses.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from laggard.collectors.base import NoDataError
from laggard.parsers.proc_net_dev import parse_proc_net_dev


class NetdevCollector:
    """Byte, packet, error and drop counters per interface: ``laggard_network_*_total{device}``.

    From sysfs, where present (``Documentation/ABI/testing/sysfs-class-net``):
    ``laggard_network_carrier_changes_total{device}`` (link up/down transitions: a flapping
    cable or port) and ``laggard_network_up{device}`` (1 when ``operstate`` is ``up``).

    Args:
        proc_root: root of procfs (``/proc``; tests pass a fixture tree).
        sysfs_root: root of sysfs (``/sys``).
    """

    name = "netdev"

    def __init__(self, proc_root: str = "/proc", sysfs_root: str = "/sys") -> None:
        self._path = os.path.join(proc_root, "net", "dev")
        self._class_net = os.path.join(sysfs_root, "class", "net")

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
        families: dict[str, CounterMetricFamily] = {}
        for device, counters in sorted(devices.items()):
            for column, value in counters.items():
                family = families.get(column)
                if family is None:
                    direction, _, what = column.partition("_")
                    family = families[column] = CounterMetricFamily(
                        f"laggard_network_{column}",
                        f"Network device statistic {what} ({direction}), from /proc/net/dev.",
                        labels=["device"],
                    )
                family.add_metric([device], value)
        yield from families.values()
        yield from self._link_state(sorted(devices))

    def _link_state(self, devices: list[str]) -> Iterator[Metric]:
        carrier = CounterMetricFamily(
            "laggard_network_carrier_changes_total",
            "Link carrier up/down transitions of the device, from sysfs.", labels=["device"])
        up = GaugeMetricFamily("laggard_network_up",
                               "1 if the device's operstate is up, from sysfs.",
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


def _read_sysfs(path: str) -> str | None:
    # A device can vanish between /proc/net/dev and sysfs, and a virtual device may lack the
    # attribute: either way the field is left out, never exported as 0.
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return None


def from_config(config: Any, context: object) -> NetdevCollector:
    """Registry factory."""
    return NetdevCollector(proc_root=config.proc_root, sysfs_root=config.sysfs_root)
