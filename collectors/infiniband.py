"""InfiniBand / RoCE port collector (``infiniband``): ``/sys/class/infiniband/<dev>/ports/<n>/``.

Files read (Linux ``Documentation/ABI/stable/sysfs-class-infiniband``):

* ``rate`` (``"400 Gb/sec (4X NDR)"``) -> ``laggard_infiniband_rate_bytes_per_second``
  (Gb/s x 1e9 / 8);
* ``state`` (``"4: ACTIVE"``), ``phys_state`` (``"5: LinkUp"``) -> ``..._state_id``,
  ``..._physical_state_id`` (the numeric part, as node_exporter does);
* ``link_layer`` (``InfiniBand`` or ``Ethernet`` = RoCE), plus the device's ``hca_type`` and
  ``fw_ver`` -> ``laggard_infiniband_info``;
* ``counters/*``: the IBA PortCounters. ``port_rcv_data`` / ``port_xmit_data`` count 4-octet
  words (IBA spec, PortCountersExtended: "divided by 4"), so they are multiplied by 4 into
  ``laggard_infiniband_port_data_{received,transmitted}_bytes_total``; packets, ``link_downed``,
  ``link_error_recovery``, ``symbol_error``, ``port_xmit_wait`` (ticks) get their own counters,
  every other error counter goes to ``laggard_infiniband_port_errors_total{type}``;
* ``hw_counters/*``: vendor (mlx5) counters -> ``laggard_infiniband_hw_events_total{event}``,
  except ``lifespan`` (a cache period in ms, not a count).

No ``/sys/class/infiniband`` (or no device in it) is "no data". A file that is missing or does not
hold a number is left out.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from laggard.collectors.base import AgentSettings, CollectorSpec, NoDataError

#: ``counters/<file>`` -> (metric name without ``_total``, help, multiplier)
PORT_COUNTERS: dict[str, tuple[str, str, int]] = {
    "port_rcv_data": ("laggard_infiniband_port_data_received_bytes",
                      "Data received by the port, in bytes (sysfs 4-octet words x 4).", 4),
    "port_xmit_data": ("laggard_infiniband_port_data_transmitted_bytes",
                       "Data transmitted by the port, in bytes (sysfs 4-octet words "
                       "x 4).", 4),
    "port_rcv_packets": ("laggard_infiniband_port_packets_received", "Packets received.", 1),
    "port_xmit_packets": ("laggard_infiniband_port_packets_transmitted",
                          "Packets transmitted.", 1),
    "unicast_rcv_packets": ("laggard_infiniband_unicast_packets_received",
                            "Unicast packets received.", 1),
    "unicast_xmit_packets": ("laggard_infiniband_unicast_packets_transmitted",
                             "Unicast packets transmitted.", 1),
    "multicast_rcv_packets": ("laggard_infiniband_multicast_packets_received",
                              "Multicast packets received.", 1),
    "multicast_xmit_packets": ("laggard_infiniband_multicast_packets_transmitted",
                               "Multicast packets transmitted.", 1),
    "link_downed": ("laggard_infiniband_link_downed",
                    "Times the link error recovery process failed and the link went down.",
                    1),
    "link_error_recovery": ("laggard_infiniband_link_error_recovery",
                            "Successful link error recoveries.", 1),
    "symbol_error": ("laggard_infiniband_symbol_errors", "Minor link errors on any lane.",
                      1),
    "port_xmit_wait": ("laggard_infiniband_port_transmit_wait",
                       "Ticks with data to send but no flow-control credits.", 1),
}
#: hw_counters that are not counts
_NOT_COUNTERS = frozenset({"lifespan"})
_RATE = re.compile(r"^\s*([\d.]+)\s*([GMT]?)b/sec", re.IGNORECASE)
_RATE_UNIT = {"": 1.0, "m": 1e6, "g": 1e9, "t": 1e12}


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return None


def _integer(path: str) -> int | None:
    text = _read(path)
    if text is None:
        return None
    try:
        return int(text, 0)
    except ValueError:
        return None


def _state_id(text: str | None) -> int | None:
    if text is None:
        return None
    number, _, _ = text.partition(":")
    return int(number) if number.strip().isdigit() else None


def parse_rate(text: str) -> float | None:
    """``"400 Gb/sec (4X NDR)"`` -> 5e10 bytes per second; None when unreadable."""
    m = _RATE.match(text)
    if not m:
        return None
    return float(m.group(1)) * _RATE_UNIT[m.group(2).lower()] / 8


class InfinibandCollector:
    """Per device and port counters of InfiniBand and RoCE adapters.

    Args:
        sysfs_root: sysfs mount point (``/sys``; tests pass a fixture tree).
    """

    name = "infiniband"

    def __init__(self, sysfs_root: str = "/sys") -> None:
        self.class_dir = os.path.join(sysfs_root, "class", "infiniband")

    def collect(self) -> Iterable[Metric]:
        """Read every port once.

        Raises:
            NoDataError: no ``class/infiniband`` directory or no device in it.
        """
        try:
            devices = sorted(os.listdir(self.class_dir))
        except OSError:
            raise NoDataError(f"{self.class_dir} not found: no InfiniBand/RoCE device") from None
        if not devices:
            raise NoDataError(f"no device in {self.class_dir}")
        labels = ["device", "port"]
        info = GaugeMetricFamily("laggard_infiniband_info", "InfiniBand port identity (value 1).",
                                 labels=[*labels, "link_layer", "hca_type", "firmware_version"])
        rate = GaugeMetricFamily("laggard_infiniband_rate_bytes_per_second",
                                 "Link rate, in bytes per second (sysfs rate: Gb/s / 8).",
                                 labels=labels)
        state = GaugeMetricFamily("laggard_infiniband_state_id",
                                  "Port state, numeric (4 = ACTIVE).", labels=labels)
        phys = GaugeMetricFamily("laggard_infiniband_physical_state_id",
                                 "Physical port state, numeric (5 = LinkUp).", labels=labels)
        counters = {file: CounterMetricFamily(name, doc, labels=labels)
                    for file, (name, doc, _) in PORT_COUNTERS.items()}
        errors = CounterMetricFamily("laggard_infiniband_port_errors",
                                     "Other port error counters, by type (sysfs counters/*).",
                                     labels=[*labels, "type"])
        hw = CounterMetricFamily("laggard_infiniband_hw_events",
                                 "Vendor hardware counters, by event (sysfs hw_counters/*).",
                                 labels=[*labels, "event"])
        for device in devices:
            device_dir = os.path.join(self.class_dir, device)
            hca, firmware = _read(os.path.join(device_dir, "hca_type")), _read(
                os.path.join(device_dir, "fw_ver"))
            try:
                ports = sorted(os.listdir(os.path.join(device_dir, "ports")), key=_port_order)
            except OSError:
                continue
            for port in ports:
                port_dir = os.path.join(device_dir, "ports", port)
                key = [device, port]
                info.add_metric([*key, _read(os.path.join(port_dir, "link_layer")) or "",
                                 hca or "", firmware or ""], 1)
                text = _read(os.path.join(port_dir, "rate"))
                if text is not None and (value := parse_rate(text)) is not None:
                    rate.add_metric(key, value)
                for family, file in ((state, "state"), (phys, "phys_state")):
                    if (number := _state_id(_read(os.path.join(port_dir, file)))) is not None:
                        family.add_metric(key, number)
                self._counters(port_dir, key, counters, errors, hw)
        return [info, rate, state, phys, *counters.values(), errors, hw]

    @staticmethod
    def _counters(port_dir: str, key: list[str], counters: dict[str, CounterMetricFamily],
                  errors: CounterMetricFamily, hw: CounterMetricFamily) -> None:
        for sub, family in (("counters", None), ("hw_counters", hw)):
            try:
                files = sorted(os.listdir(os.path.join(port_dir, sub)))
            except OSError:
                continue
            for file in files:
                value = _integer(os.path.join(port_dir, sub, file))
                if value is None or file in _NOT_COUNTERS:
                    continue
                if family is hw:
                    hw.add_metric([*key, file], value)
                elif file in PORT_COUNTERS:
                    counters[file].add_metric(key, value * PORT_COUNTERS[file][2])
                else:
                    errors.add_metric([*key, file], value)


def _port_order(name: str) -> tuple[int, str]:
    return (int(name), "") if name.isdigit() else (1 << 30, name)


def from_config(settings: AgentSettings, context: object) -> InfinibandCollector:
    """Registry factory."""
    return InfinibandCollector(settings.sysfs_root)


COLLECTOR = CollectorSpec(name="infiniband", build=from_config, default=True,
                          help="InfiniBand/RoCE port counters from /sys/class/infiniband")
