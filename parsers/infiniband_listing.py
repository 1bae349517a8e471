"""Pure parsers for InfiniBand port state and counters copied off a node as text.

Three shapes, all reduced to :class:`IbPort`:

* a listing of ``/sys/class/infiniband`` as ``grep -r .`` (``path:value``), ``head`` (``==> path
  <==`` then the value) or a shell loop (``path value``) print it:
  ``.../<device>/ports/<port>/counters/<name>:N``,
  ``.../state:4: ACTIVE``, ``.../phys_state:5: LinkUp``, ``.../rate:400 Gb/sec (4X NDR)``,
  ``.../link_layer:InfiniBand`` (kernel ``Documentation/ABI/stable/sysfs-class-infiniband``);
* ``ibstat`` (``CA 'mlx5_0'`` / ``Port 1:`` / ``State: Active`` ...);
* ``perfquery`` (``# Port counters: Lid 12 port 1``, ``LinkDownedCounter:......0``), whose
  PortCounters names (IBA spec, PMA attribute 0x0012) map to the sysfs counter names.

For live sysfs trees the agent uses :mod:`laggard.collectors.infiniband`; this module reads text.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ["IbPort", "ERROR_COUNTERS", "parse_ib_listing", "parse_ibstat", "parse_perfquery"]

#: Counters that count faults (sysfs ``counters/`` and mlx5 ``hw_counters/`` names). Data,
#: packet and ``port_xmit_wait`` (congestion) counters are not faults.
ERROR_COUNTERS = (
    "link_downed", "link_error_recovery", "symbol_error", "port_rcv_errors",
    "port_rcv_remote_physical_errors", "port_rcv_switch_relay_errors", "port_xmit_discards",
    "port_xmit_constraint_errors", "port_rcv_constraint_errors", "local_link_integrity_errors",
    "excessive_buffer_overrun_errors", "VL15_dropped",
    # mlx5 hw_counters (Linux drivers/infiniband/hw/mlx5/counters.c)
    "out_of_buffer", "out_of_sequence", "packet_seq_err", "local_ack_timeout_err",
    "rnr_nak_retry_err", "implied_nak_seq_err", "req_cqe_error", "resp_cqe_error",
    "req_remote_access_errors", "req_remote_invalid_request", "resp_local_length_error",
    "resp_remote_access_errors", "rx_icrc_encapsulated",
)

#: perfquery PortCounters field -> sysfs counter name.
_PERFQUERY_NAMES = {
    "SymbolErrorCounter": "symbol_error", "LinkErrorRecoveryCounter": "link_error_recovery",
    "LinkDownedCounter": "link_downed", "PortRcvErrors": "port_rcv_errors",
    "PortRcvRemotePhysicalErrors": "port_rcv_remote_physical_errors",
    "PortRcvSwitchRelayErrors": "port_rcv_switch_relay_errors",
    "PortXmitDiscards": "port_xmit_discards",
    "PortXmitConstraintErrors": "port_xmit_constraint_errors",
    "PortRcvConstraintErrors": "port_rcv_constraint_errors",
    "LocalLinkIntegrityErrors": "local_link_integrity_errors",
    "ExcessiveBufferOverrunErrors": "excessive_buffer_overrun_errors",
    "VL15Dropped": "VL15_dropped", "PortXmitData": "port_xmit_data",
    "PortRcvData": "port_rcv_data", "PortXmitPkts": "port_xmit_packets",
    "PortRcvPkts": "port_rcv_packets", "PortXmitWait": "port_xmit_wait",
}


@dataclass(slots=True)
class IbPort:
    """One HCA port.

    Attributes:
        device: HCA name (``mlx5_0``), or ``lid N`` for perfquery output.
        port: port number.
        state: logical state name (``ACTIVE``, ``DOWN``, ``INIT``...), upper case.
        phys_state: physical state name (``LinkUp``, ``Disabled``, ``Polling``...).
        rate: as printed (``400 Gb/sec (4X NDR)``, or ``400`` from ibstat).
        link_layer: ``InfiniBand`` or ``Ethernet`` (RoCE).
        counters: counter name -> value (``port_rcv_data`` in 4-byte words, as the kernel
            exports it).
    """

    device: str
    port: int
    state: str | None = None
    phys_state: str | None = None
    rate: str | None = None
    link_layer: str | None = None
    counters: dict[str, int] = field(default_factory=dict)

    @property
    def is_up(self) -> bool | None:
        """True when ACTIVE and LinkUp, False when either says otherwise, None if unknown."""
        if self.state is None and self.phys_state is None:
            return None
        return (self.state in (None, "ACTIVE")) and (self.phys_state in (None, "LinkUp"))

    @property
    def errors(self) -> dict[str, int]:
        """Non-zero :data:`ERROR_COUNTERS`."""
        return {n: self.counters[n] for n in ERROR_COUNTERS if self.counters.get(n)}


_SYSFS = re.compile(
    r"(?:^|/)infiniband/(?P<dev>[^/\s]+)/ports/(?P<port>\d{1,6})/(?P<rest>[\w/]+?)(?::|\s)\s*"
    r"(?P<value>.*)$")
_HEAD_BANNER = re.compile(r"^==> (?P<path>\S+) <==$")  # `head` / `tail` of several files


def _is_counter(value: str) -> bool:
    # A 64-bit counter has at most 20 digits; a longer digit string is not one (and int() of
    # thousands of digits raises ValueError in Python 3.11+).
    return value.isdigit() and len(value) <= 20


def _state_name(value: str) -> str:
    # "4: ACTIVE" -> "ACTIVE"; "5: LinkUp" -> "LinkUp"
    return value.split(":", 1)[-1].strip()


def parse_ib_listing(lines: Iterable[str]) -> list[IbPort]:
    """Parse a ``path:value`` listing of ``/sys/class/infiniband``."""
    ports: dict[tuple[str, int], IbPort] = {}
    banner: str | None = None
    for line in lines:
        text = line.strip()
        if b := _HEAD_BANNER.match(text):
            banner = b["path"]
            continue
        if banner is not None and text:
            text, banner = f"{banner}:{text}", None
        m = _SYSFS.search(text)
        if not m:
            continue
        key = (m["dev"], int(m["port"]))
        port = ports.setdefault(key, IbPort(*key))
        rest, value = m["rest"], m["value"].strip()
        if rest == "state":
            port.state = _state_name(value).upper()
        elif rest == "phys_state":
            port.phys_state = _state_name(value)
        elif rest == "rate":
            port.rate = value
        elif rest == "link_layer":
            port.link_layer = value
        elif rest.startswith(("counters/", "hw_counters/")) and _is_counter(value):
            port.counters[rest.split("/", 1)[1]] = int(value)
    return list(ports.values())


_CA = re.compile(r"^CA '(?P<dev>[^']+)'")
_IBSTAT_PORT = re.compile(r"^\s+Port (?P<port>\d{1,6}):\s*$")
_IBSTAT_FIELD = re.compile(r"^\s+(?P<key>[A-Za-z ]+):\s*(?P<value>.*)$")


def parse_ibstat(lines: Iterable[str]) -> list[IbPort]:
    """Parse ``ibstat`` output (state, physical state, rate, link layer per port)."""
    ports: list[IbPort] = []
    device, port = None, None
    for line in lines:
        line = line.rstrip("\r\n")
        if m := _CA.match(line):
            device, port = m["dev"], None
        elif (m := _IBSTAT_PORT.match(line)) and device is not None:
            port = IbPort(device, int(m["port"]))
            ports.append(port)
        elif (m := _IBSTAT_FIELD.match(line)) and port is not None:
            key, value = m["key"].strip().lower(), m["value"].strip()
            if key == "state":
                port.state = value.upper()
            elif key == "physical state":
                port.phys_state = value
            elif key == "rate":
                port.rate = value
            elif key == "link layer":
                port.link_layer = value
    return ports


_PERF_HEADER = re.compile(
    r"#\s*Port (?:extended )?counters:\s*Lid (?P<lid>\d+) port (?P<port>\d{1,6})")
_PERF_FIELD = re.compile(r"^(?P<key>\w+):\.*(?P<value>\d+|0x[0-9a-fA-F]+)\s*$")


def parse_perfquery(lines: Iterable[str]) -> list[IbPort]:
    """Parse ``perfquery`` (``-x`` too) output into ports named ``lid N``."""
    ports: list[IbPort] = []
    port: IbPort | None = None
    for line in lines:
        text = line.strip()
        if m := _PERF_HEADER.search(text):
            port = IbPort(f"lid {m['lid']}", int(m["port"]))
            ports.append(port)
        elif (m := _PERF_FIELD.match(text)) and port is not None:
            name = _PERFQUERY_NAMES.get(m["key"])
            if name is not None and _is_counter(m["value"]):
                port.counters[name] = int(m["value"])
    return ports
