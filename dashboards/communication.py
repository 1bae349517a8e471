"""Communication: what gradient compression and overlap buy, per run.

Bytes on the wire per step and the compression ratio against an fp32 all-reduce tell what a
DDP communication hook saves; exposed collective time (on the critical path, after backward)
against hidden time (overlapped with backward) tells whether the saving reaches the step time.

Every panel reads the agent's default set (issue 34's series budget): each node's sums over
its ranks of a run (``laggard_run_comm_*``, ``laggard_run_collective_*``), added up over the
selected nodes; steps are counted by the run's phase histogram (one ``collective_wait``
observation per rank and step). Each rank's own (``laggard_comm_*{rank}``) are behind
``--intake.rank-histograms``.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard

from laggard.dashboards.panels import (
    NODE,
    RATE,
    RUN,
    Board,
    Query,
    node_variable,
    run_variable,
    series_panel,
)

UID = "laggard-communication"
TITLE = "laggard / Communication"

_SEL = f"{NODE}, {RUN}"
#: Legend of a per-run line.
_LEGEND = "{{run}}"


def _rate(metric: str, by: str = "run") -> str:
    """Per-second rate of counter ``metric`` over the selected nodes, by ``by``."""
    return f"sum by ({by}) (rate({metric}{{{_SEL}}}[{RATE}]))"


def _per_step(metric: str) -> str:
    """Mean of counter ``metric`` per rank and training step, per run: the rate over the rate
    of rank-steps (the collective wait is observed once per rank and step)."""
    steps = f'laggard_run_step_phase_seconds_count{{{_SEL}, phase="collective_wait"}}'
    return f"{_rate(metric)} / sum by (run) (rate({steps}[{RATE}]))"


def build() -> Dashboard:
    """The communication dashboard (uid ``laggard-communication``)."""
    board = Board(
        UID,
        TITLE,
        "Bytes on the wire per step, compression ratio, exposed and hidden collective time.",
        [
            node_variable("laggard_run_comm_bytes_total"),
            run_variable("laggard_run_comm_bytes_total"),
        ],
    )
    board.row("Volume")
    board.add(
        series_panel(
            "Bytes on the wire per step and rank",
            "bytes",
            "Bytes a rank's communication hook put on the wire per step, the run's ranks on "
            "the selected nodes together.",
        ),
        Query(_per_step("laggard_run_comm_bytes_total"), _LEGEND),
    )
    board.add(
        series_panel(
            "Compression ratio",
            "x",
            "Bytes an fp32 all-reduce of the same gradients would send, divided by the bytes "
            "sent (1 = no compression).",
        ),
        Query(
            f"{_rate('laggard_run_comm_uncompressed_bytes_total')}"
            f" / {_rate('laggard_run_comm_bytes_total')}",
            _LEGEND,
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
        Query(_per_step("laggard_run_comm_exposed_seconds_total"), "{{run}} exposed"),
        Query(
            f"({_per_step('laggard_run_comm_collective_seconds_total')})"
            f" - ({_per_step('laggard_run_comm_exposed_seconds_total')})",
            "{{run}} hidden",
        ),
    )
    board.add(
        series_panel(
            "Hidden fraction of collective time",
            "percentunit",
            "1 - exposed / total collective time: the share overlapped with computation.",
        ).min(0).max(1),
        Query(
            f"1 - {_rate('laggard_run_comm_exposed_seconds_total')}"
            f" / {_rate('laggard_run_comm_collective_seconds_total')}",
            _LEGEND,
        ),
    )
    board.row("Collectives")
    board.add(
        series_panel(
            "Collective time by op (median and p99)",
            "s",
            "Launch-to-completion time of each collective call, per op, across the selected "
            "nodes' ranks: the median, and the 99th percentile where stalls show (decade "
            "buckets: 10 ms to 10 s).",
        ),
        Query(
            f"histogram_quantile(0.5, sum by (le, op) "
            f"(rate(laggard_run_collective_seconds_bucket{{{_SEL}}}[{RATE}])))",
            "{{op}} median",
        ),
        Query(
            f"histogram_quantile(0.99, sum by (le, op) "
            f"(rate(laggard_run_collective_seconds_bucket{{{_SEL}}}[{RATE}])))",
            "{{op}} p99",
        ),
    )
    board.add(
        series_panel(
            "Collective bytes per second by run and op",
            "Bps",
            "Bytes the selected nodes' ranks of each run send in collectives, per second and op.",
        ),
        Query(_rate("laggard_run_collective_bytes_total", "run, op"), "{{run}} {{op}}"),
    )
    return board.build()
