"""Network: per-interface (``/proc/net/dev``) and InfiniBand port throughput and errors."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard
from grafana_foundation_sdk.models.common import GraphDrawStyle
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
            "Receive errors and symbol errors per port in each interval.",
        ),
        Query(
            f"increase(laggard_infiniband_port_receive_errors_total{{{_IB}}}[{RATE}])",
            _PORT + " receive errors",
        ),
        Query(
            f"increase(laggard_infiniband_symbol_error_total{{{_IB}}}[{RATE}])",
            _PORT + " symbol errors",
        ),
    )
    board.add(
        series_panel(
            "InfiniBand link down events",
            "short",
            "Times a port's link went down in each interval (link_downed): a flapping cable "
            "or switch port.",
        ).draw_style(GraphDrawStyle.BARS),
        Query(f"increase(laggard_infiniband_link_downed_total{{{_IB}}}[{RATE}])", _PORT),
        width=24,
    )
    return board.build()
