"""Network: per-interface (``/proc/net/dev``) and InfiniBand port throughput and errors."""

from __future__ import annotations

from grafana_foundation_sdk.builders import statetimeline
from grafana_foundation_sdk.builders.dashboard import Dashboard
from grafana_foundation_sdk.models.common import GraphDrawStyle
from grafana_foundation_sdk.models.dashboard import ValueMap, ValueMappingResult

from laggard.dashboards.panels import (
    NODE,
    RATE,
    Board,
    Query,
    label_variable,
    node_variable,
    series_panel,
)

UID = "laggard-network"
TITLE = "laggard / Network"

_NET = f'{NODE}, device=~"$device"'
_IB = NODE
_IFACE = "{{instance}} {{device}}"
_PORT = "{{instance}} {{device}} port {{port}}"
#: Logical port states (Linux ``enum ib_port_state``, include/rdma/ib_verbs.h) and colours.
_PORT_STATES = {
    "1": ("DOWN", "red"),
    "2": ("INIT", "orange"),
    "3": ("ARMED", "yellow"),
    "4": ("ACTIVE", "green"),
    "5": ("ACTIVE_DEFER", "yellow"),
}


def _rate(metric: str, selector: str) -> str:
    return f"rate({metric}{{{selector}}}[{RATE}])"


def build() -> Dashboard:
    """The network dashboard (uid ``laggard-network``)."""
    board = Board(
        UID,
        TITLE,
        "Throughput, errors and drops per network interface and InfiniBand port.",
        [
            node_variable("laggard_network_receive_bytes_total"),
            label_variable(
                "device", "device", "Interface",
                f"laggard_network_receive_bytes_total{{{NODE}}}",
            ),
        ],
    )
    board.row("Interfaces")
    board.add(
        series_panel("Interface throughput", "Bps", "Bytes per second received and sent."),
        Query(_rate("laggard_network_receive_bytes_total", _NET), _IFACE + " receive"),
        Query(_rate("laggard_network_transmit_bytes_total", _NET), _IFACE + " transmit"),
    )
    board.add(
        series_panel(
            "Interface errors and drops",
            "pps",
            "Packets per second in error or dropped, as counted by the kernel.",
        ),
        Query(_rate("laggard_network_receive_errs_total", _NET), _IFACE + " receive errors"),
        Query(_rate("laggard_network_transmit_errs_total", _NET), _IFACE + " transmit errors"),
        Query(_rate("laggard_network_receive_drop_total", _NET), _IFACE + " receive drops"),
        Query(_rate("laggard_network_transmit_drop_total", _NET), _IFACE + " transmit drops"),
    )
    board.row("InfiniBand")
    board.add(
        series_panel(
            "InfiniBand port throughput",
            "Bps",
            "Bytes per second per port (the port counters count 4-octet words; the agent "
            "converts them to bytes).",
        ),
        Query(
            _rate("laggard_infiniband_port_data_received_bytes_total", _IB), _PORT + " receive"
        ),
        Query(
            _rate("laggard_infiniband_port_data_transmitted_bytes_total", _IB),
            _PORT + " transmit",
        ),
    )
    board.add(
        series_panel(
            "InfiniBand port errors",
            "short",
            "Error counters per port in each interval: receive errors, discards, buffer "
            "overruns, symbol errors (bit errors on the wire) and link error recoveries.",
        ),
        Query(
            f"sum by (instance, device, port, type) "
            f"(increase(laggard_infiniband_port_errors_total{{{_IB}}}[{RATE}]))",
            _PORT + " {{type}}",
        ),
        Query(
            f"increase(laggard_infiniband_symbol_errors_total{{{_IB}}}[{RATE}])",
            _PORT + " symbol errors",
        ),
        Query(
            f"increase(laggard_infiniband_link_error_recovery_total{{{_IB}}}[{RATE}])",
            _PORT + " link error recoveries",
        ),
    )
    board.add(
        series_panel(
            "InfiniBand link down events",
            "short",
            "Times a port's link went down in each interval (link_downed): a flapping cable, "
            "transceiver or switch port.",
        ).draw_style(GraphDrawStyle.BARS),
        Query(f"increase(laggard_infiniband_link_downed_total{{{_IB}}}[{RATE}])", _PORT),
    )
    board.add(
        statetimeline.Panel()
        .title("InfiniBand port state")
        .description("Logical port state from sysfs (ib_port_state): ACTIVE is the only one "
                     "that carries traffic.")
        .mappings([ValueMap({
            code: ValueMappingResult(text=name, color=color)
            for code, (name, color) in _PORT_STATES.items()
        })]),
        Query(f"laggard_infiniband_state_id{{{_IB}}}", _PORT),
    )
    board.add(
        series_panel(
            "InfiniBand transmit wait",
            "short",
            "Ticks per second a port had data to send but no credits from its peer "
            "(port_xmit_wait): congestion downstream.",
        ),
        Query(_rate("laggard_infiniband_port_transmit_wait_total", _IB), _PORT),
    )
    return board.build()
