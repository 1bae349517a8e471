"""Communication: what gradient compression and overlap buy, per rank.

Bytes on the wire per step and the compression ratio against an fp32 all-reduce tell what a
DDP communication hook saves; exposed collective time (on the critical path, after backward)
against hidden time (overlapped with backward) tells whether the saving reaches the step time.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard

from laggard.dashboards.panels import (
    NODE,
    RANK,
    RATE,
    RUN,
    Board,
    Query,
    node_variable,
    rank_variable,
    run_variable,
    series_panel,
)

UID = "laggard-communication"
TITLE = "laggard / Communication"

_SEL = f"{NODE}, {RUN}, {RANK}"


def _per_step(metric: str) -> str:
    """Per-rank mean of counter ``metric`` per training step."""
    return (
        f"sum by (run, rank) (rate({metric}{{{_SEL}}}[{RATE}]))"
        f" / sum by (run, rank) (rate(laggard_steps_total{{{_SEL}}}[{RATE}]))"
    )


def build() -> Dashboard:
    """The communication dashboard (uid ``laggard-communication``)."""
    board = Board(
        UID,
        TITLE,
        "Bytes on the wire per step, compression ratio, exposed and hidden collective time.",
        [
            node_variable("laggard_comm_bytes_total"),
            run_variable("laggard_comm_bytes_total"),
            rank_variable("laggard_comm_bytes_total"),
        ],
    )
    board.row("Volume")
    board.add(
        series_panel(
            "Bytes on the wire per step by rank",
            "bytes",
            "Bytes each rank's communication hook put on the wire per step.",
        ),
        Query(_per_step("laggard_comm_bytes_total"), "{{run}} rank {{rank}}"),
    )
    board.add(
        series_panel(
            "Compression ratio",
            "x",
            "Bytes an fp32 all-reduce of the same gradients would send, divided by the bytes "
            "sent (1 = no compression).",
        ),
        Query(
            f"sum by (run, rank) (rate(laggard_comm_uncompressed_bytes_total{{{_SEL}}}[{RATE}]))"
            f" / sum by (run, rank) (rate(laggard_comm_bytes_total{{{_SEL}}}[{RATE}]))",
            "{{run}} rank {{rank}}",
        ),
    )
    board.row("Overlap")
    board.add(
        series_panel(
            "Exposed and hidden collective time per step",
            "s",
            "Exposed: collective time on the critical path (from the end of backward to the "
            "last bucket's completion). Hidden: the rest, overlapped with backward.",
        ),
        Query(_per_step("laggard_comm_exposed_seconds_total"), "{{run}} rank {{rank}} exposed"),
        Query(
            f"({_per_step('laggard_comm_collective_seconds_total')})"
            f" - ({_per_step('laggard_comm_exposed_seconds_total')})",
            "{{run}} rank {{rank}} hidden",
        ),
    )
    board.add(
        series_panel(
            "Hidden fraction of collective time",
            "percentunit",
            "1 - exposed / total collective time: the share overlapped with computation.",
        ).min(0).max(1),
        Query(
            f"1 - sum by (run, rank) "
            f"(rate(laggard_comm_exposed_seconds_total{{{_SEL}}}[{RATE}]))"
            f" / sum by (run, rank) "
            f"(rate(laggard_comm_collective_seconds_total{{{_SEL}}}[{RATE}]))",
            "{{run}} rank {{rank}}",
        ),
    )
    board.row("Collectives")
    board.add(
        series_panel(
            "Collective time by op (median and p99)",
            "s",
            "Launch-to-completion time of each collective call, per op, across the selected "
            "ranks: the median, and the 99th percentile where stalls show.",
        ),
        Query(
            f"histogram_quantile(0.5, sum by (le, op) "
            f"(rate(laggard_collective_seconds_bucket{{{_SEL}}}[{RATE}])))",
            "{{op}} median",
        ),
        Query(
            f"histogram_quantile(0.99, sum by (le, op) "
            f"(rate(laggard_collective_seconds_bucket{{{_SEL}}}[{RATE}])))",
            "{{op}} p99",
        ),
    )
    board.add(
        series_panel(
            "Collective bytes per second by rank and op",
            "Bps",
            "Bytes each rank sends in collectives, per second and op.",
        ),
        Query(
            f"sum by (run, rank, op) (rate(laggard_collective_bytes_total{{{_SEL}}}[{RATE}]))",
            "{{run}} rank {{rank}} {{op}}",
        ),
    )
    return board.build()
