"""Job overview: which rank is the job waiting for, and since when.

In synchronous data parallelism every rank's step wall time is the same (all wait for the
slowest in the gradient all-reduce), so the panels that name the straggler are the per-rank
compute time (the work before the synchronisation point) and the collective wait, which is
*shortest* on the straggler (it arrives last and waits least).

Every panel reads the agent's default set (issue 34's series budget): each rank's window
medians (``laggard_rank_phase_median_seconds``, ``laggard_rank_step_median_seconds``), and
the per-run phase histogram of each node's ranks together (``laggard_run_step_phase_seconds``);
the per-rank histograms of ``--intake.rank-histograms`` are not needed.
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


def _median_phase_seconds(phase: str) -> str:
    """Median seconds per step of ``phase`` (compute, data, collective_wait) over each rank's
    last 16 steps, per run and rank."""
    return f'max by (run, rank) (laggard_rank_phase_median_seconds{{{_SEL}, phase="{phase}"}})'


def _run_mean_phase_seconds(phase: str) -> str:
    """Mean seconds per step of ``phase`` per run, over the selected nodes' ranks together."""
    sel = f'{NODE}, {RUN}, phase="{phase}"'
    return (
        f"sum by (run) (rate(laggard_run_step_phase_seconds_sum{{{sel}}}[{RATE}]))"
        f" / sum by (run) (rate(laggard_run_step_phase_seconds_count{{{sel}}}[{RATE}]))"
    )


def build() -> Dashboard:
    """The job overview dashboard (uid ``laggard-job-overview``)."""
    board = Board(
        UID,
        TITLE,
        "Straggler score, findings and per-rank step timing of the training runs.",
        [
            node_variable("laggard_rank_info"),
            run_variable("laggard_rank_info"),
            rank_variable("laggard_rank_info"),
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
            "Seconds since each rank's last heartbeat",
            "s",
            "A rank whose line climbs stopped sending heartbeats: its training process hangs "
            "with the GIL held, crashed, or the job ended (ranks of monitors without "
            "heartbeats have no line).",
        ),
        Query(
            f"max by (run, rank) (laggard_rank_heartbeat_age_seconds{{{_SEL}}})",
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
            "Median forward + backward seconds per step over the rank's last 16 steps (every "
            "timed phase but data and optimizer). The straggler is the rank above the others: "
            "the work before the gradient all-reduce is where a slow GPU shows.",
        ),
        Query(_median_phase_seconds("compute"), _LEGEND),
    )
    board.add(
        series_panel(
            "Collective wait per step by rank",
            "s",
            "Median seconds per step waiting in collectives after the rank's own work, over its "
            "last 16 steps. The straggler waits least: the others wait for it.",
        ),
        Query(_median_phase_seconds("collective_wait"), _LEGEND),
    )
    board.add(
        series_panel(
            "Step time by rank",
            "s",
            "Median wall time of the rank's last 16 steps. In synchronous training it is the "
            "same on every rank: it tells how slow the job is, not who makes it slow.",
        ),
        Query(f"max by (run, rank) (laggard_rank_step_median_seconds{{{_SEL}}})", _LEGEND),
    )
    board.add(
        series_panel(
            "Steps per second",
            "ops",
            "Training steps per second, per rank: one over its median step time (equal in "
            "synchronous training).",
        ),
        Query(f"1 / max by (run, rank) (laggard_rank_step_median_seconds{{{_SEL}}})", _LEGEND),
    )
    board.add(
        series_panel(
            "Data loading time per step by rank",
            "s",
            "Median seconds per step waiting for the input pipeline, over the rank's last 16 "
            "steps; a rank with a slow loader stands out here rather than in compute.",
        ),
        Query(_median_phase_seconds("data"), _LEGEND),
    )
    board.add(
        series_panel(
            "Optimizer time per step by run",
            "s",
            "Mean seconds per step in the optimizer step, after the gradients are reduced, "
            "over the selected nodes' ranks of each run together (alike on every rank).",
        ),
        Query(_run_mean_phase_seconds("optimizer"), "{{run}}"),
    )
    return board.build()
