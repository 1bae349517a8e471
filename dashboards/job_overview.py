"""Job overview: which rank is the job waiting for, and since when.

In synchronous data parallelism every rank's step wall time is the same (all wait for the
slowest in the gradient all-reduce), so the panels that name the straggler are the per-rank
compute time (the work before the synchronisation point) and the collective wait, which is
*shortest* on the straggler (it arrives last and waits least).
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import heatmap
from grafana_foundation_sdk.builders.dashboard import Dashboard
from grafana_foundation_sdk.models.common import HeatmapCellLayout

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
    table_panel,
)

UID = "laggard-job-overview"
TITLE = "laggard / Job overview"

_SEL = f"{NODE}, {RUN}, {RANK}"
#: Legend of a per-rank line: the run and the rank (two runs' rank 0 are two lines).
_LEGEND = "{{run}} rank {{rank}}"


def _mean_phase_seconds(phases: str) -> str:
    """Mean seconds per step spent in ``phases`` (a regex), per run and rank: sum of per-phase
    means."""
    sel = f'{_SEL}, phase=~"{phases}"'
    return (
        f"sum by (run, rank) (rate(laggard_step_phase_seconds_sum{{{sel}}}[{RATE}])"
        f" / rate(laggard_step_phase_seconds_count{{{sel}}}[{RATE}]))"
    )


def build() -> Dashboard:
    """The job overview dashboard (uid ``laggard-job-overview``)."""
    board = Board(
        UID,
        TITLE,
        "Straggler score, findings and per-rank step timing of the training runs.",
        [
            node_variable("laggard_step_phase_seconds_count"),
            run_variable("laggard_step_phase_seconds_count"),
            rank_variable("laggard_step_phase_seconds_count"),
        ],
    )
    board.row("Stragglers")
    board.add(
        heatmap.Panel()
        .title("Straggler score by rank")
        .description(
            "The in-job detector's score per rank, one row per rank: by how much the rank "
            "stretches each step, as a fraction of the median rank's work (0 = typical, 0.05 = "
            "the job runs about 5 % slower because of it). A rank that stays hot is the one "
            "the job waits for."
        )
        .calculate(False)
        .rows_frame(heatmap.RowsHeatmapOptions().layout(HeatmapCellLayout.UNKNOWN).value("score"))
        .cell_values(heatmap.CellValues().unit("percentunit"))
        .color(heatmap.HeatmapColorOptions().scheme("Oranges").steps(64))
        .show_value("never"),
        Query(f"max by (run, rank) (laggard_straggler_score{{{_SEL}}})", _LEGEND),
        width=16,
    )
    board.add(
        table_panel(
            "Findings in the time range",
            "Findings raised by laggard's detectors, counted by detector and kind.",
        ),
        Query(
            # A counter series appears with its first finding, where increase() sees no rise:
            # a series born within the range counts whole, an older one by its increase.
            f"sum by (detector, kind, severity) ((laggard_findings_total{{{NODE}}} unless "
            f"laggard_findings_total{{{NODE}}} offset $__range) or "
            f"increase(laggard_findings_total{{{NODE}}}[$__range])) > 0",
            table=True,
        ),
        width=8,
    )
    board.add(
        table_panel(
            "Ranks and where they run",
            "Each rank's run, node, local rank, world size and GPU (NVML index, UUID, PCI bus "
            "id): join laggard_rank_info on (instance, gpu) with the node's laggard_gpu_* "
            "series to see the state of a rank's GPU.",
        ),
        Query(
            f"max by (run, rank, node, local_rank, world_size, gpu, uuid, pci_bus_id) "
            f"(laggard_rank_info{{{_SEL}}})",
            table=True,
        ),
    )
    board.add(
        series_panel(
            "Seconds since each rank's last step record",
            "s",
            "A rank whose line climbs stopped reporting: hung, crashed, or the job ended. In "
            "synchronous training a hung rank soon stalls the others too.",
        ),
        Query(
            f"time() - max by (run, rank) (laggard_rank_last_seen_timestamp_seconds{{{_SEL}}})",
            _LEGEND,
        ),
    )
    board.add(
        series_panel(
            "Seconds each rank has been stalled",
            "s",
            "Seconds since the rank last made progress (a step, a collective completed), once "
            "past its stall threshold; 0 while it trains. A stalled rank stays while its "
            "heartbeats come or its process lives; LaggardJobHung names the ranks the others "
            "wait for (missing, stuck on the device, or silent).",
        ),
        Query(f"max by (run, rank) (laggard_rank_stalled_seconds{{{_SEL}}})", _LEGEND),
    )
    board.row("Step timing by rank")
    board.add(
        series_panel(
            "Compute time per step by rank",
            "s",
            "Mean forward + backward seconds per step. The straggler is the rank above the "
            "others: the work before the gradient all-reduce is where a slow GPU shows.",
        ),
        Query(_mean_phase_seconds("forward|backward|forward_backward"), _LEGEND),
    )
    board.add(
        series_panel(
            "Collective wait per step by rank",
            "s",
            "Mean seconds per step waiting in collectives after the rank's own work. The "
            "straggler waits least: the others wait for it.",
        ),
        Query(_mean_phase_seconds("collective_wait"), _LEGEND),
    )
    board.add(
        series_panel(
            "Step time by rank",
            "s",
            "Mean wall time per step. In synchronous training it is the same on every rank: "
            "it tells how slow the job is, not who makes it slow.",
        ),
        Query(
            f"sum by (run, rank) (rate(laggard_step_seconds_sum{{{_SEL}}}[{RATE}]))"
            f" / sum by (run, rank) (rate(laggard_step_seconds_count{{{_SEL}}}[{RATE}]))",
            _LEGEND,
        ),
    )
    board.add(
        series_panel(
            "Steps per second",
            "ops",
            "Training steps completed per second, per rank (equal in synchronous training).",
        ),
        Query(f"sum by (run, rank) (rate(laggard_steps_total{{{_SEL}}}[{RATE}]))", _LEGEND),
    )
    board.add(
        series_panel(
            "Data loading time per step by rank",
            "s",
            "Mean seconds per step waiting for the input pipeline; a rank with a slow loader "
            "stands out here rather than in compute.",
        ),
        Query(_mean_phase_seconds("data"), _LEGEND),
    )
    board.add(
        series_panel(
            "Optimizer time per step by rank",
            "s",
            "Mean seconds per step in the optimizer step, after the gradients are reduced.",
        ),
        Query(_mean_phase_seconds("optimizer"), _LEGEND),
    )
    return board.build()
