"""The run table rendered as metric families: the intake's counters and budget, each rank's
identity, window medians and liveness, each run's histograms and straggler verdicts.

A prometheus_client custom collector (client_python's pattern: ``process_collector.py`` reads
state, the collector builds fresh families on every scrape): :class:`RunMetrics` reads a
:class:`laggard.agent.run_table.RankTable` under its lock (:meth:`RankTable.reading`) and
yields ``laggard_intake_*``, ``laggard_rank_*``, ``laggard_run_*``, ``laggard_straggler_*``
and ``laggard_job_slowdown_active``; with ``--intake.rank-histograms`` also each rank's
``laggard_step*``, ``laggard_collective_*`` and ``laggard_comm_*``. No I/O.

The series budget (issue 34): by default a rank has at most 12 series (its identity, the
window medians of compute, data, collective wait and step time, its straggler score and
active finding, its heartbeat age and stall; while it is stalled its process state, current
phase and group progress, the hang rules' evidence), and the phase and collective histograms
are one per phase (op) per run for the node's ranks together. Counters by reason appear with
their first count.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.metrics_core import Metric

from laggard.agent.run_state import TableReading
from laggard.agent.run_table import RankTable

__all__ = ["DROP_WHATS", "FORGET_REASONS", "GPU_UNRESOLVED_REASONS", "GROUP_RESET_REASONS",
           "REJECT_REASONS", "RUN_FORGET_REASONS", "RunMetrics"]

#: What the intake counts in ``laggard_intake_rejected_total{reason}`` (whole datagrams).
REJECT_REASONS = ("oversized", "too_deep", "not_json", "version", "schema", "range",
                  "run_length", "run_charset", "decoder_error", "rank_limit", "run_limit",
                  "series_limit", "internal_error", "sender_not_allowed", "heartbeat_conflict",
                  "foreign_sender")
#: What ``laggard_intake_dropped_total{what}`` counts: parts of accepted datagrams not exported
#: (``group``: a heartbeat's group or P2P pair past the per-rank cap or the budget).
DROP_WHATS = ("phase", "op", "score", "flag", "finding_label", "group", "comm")
#: Why a rank was forgotten (``laggard_intake_ranks_forgotten_total{reason}``): no record for the
#: TTL (and no live process), its process exited without a goodbye heartbeat and nothing came
#: for the TTL, a restart of its run, its sender now reports for another run or rank, or its
#: run was over its fair share of the series budget when another run needed room.
FORGET_REASONS = ("stale", "exited", "restart", "moved", "budget")
#: Why a rank's group progress started afresh (``laggard_intake_group_resets_total{reason}``):
#: a group's sequence numbers went backwards (a restarted process group), or another process
#: took the rank over (every group of the old one is dropped).
GROUP_RESET_REASONS = ("backwards", "new_process")
#: Why a run was forgotten (``laggard_intake_runs_forgotten_total{reason}``): nothing heard for
#: the TTL, or its last rank moved to another run.
RUN_FORGET_REASONS = ("stale", "empty")
#: Why a rank's GPU could not be named (``laggard_intake_gpu_unresolved_total{reason}``): no
#: NVML on this agent, or a UUID / PCI bus id NVML does not list.
GPU_UNRESOLVED_REASONS = ("no_nvml", "unknown_device")
#: ``StepRecord.comm`` key (:data:`laggard.agent.run_state.COMM_KEYS`) -> exported counter
#: (seconds or bytes summed over steps).
_COMM_COUNTERS = {
    "total_seconds": ("laggard_comm_collective_seconds_total",
                      "Collective time summed over steps, launch to completion of each bucket, in "
                      "seconds."),
    "exposed_seconds": ("laggard_comm_exposed_seconds_total",
                        "Collective time not hidden under backward (on the critical path), in "
                        "seconds."),
    "bytes": ("laggard_comm_bytes_total", "Bytes this rank put on the wire for gradients."),
    "raw_bytes": ("laggard_comm_uncompressed_bytes_total",
                  "Bytes an uncompressed fp32 ring all-reduce would have sent for the same "
                  "gradients (this over laggard_comm_bytes_total is the compression ratio)."),
}

#: The same sums over this node's ranks of a run (the default set).
_RUN_COMM_COUNTERS = {
    "total_seconds": ("laggard_run_comm_collective_seconds_total",
                      "Collective time of this node's ranks of the run summed over steps, launch "
                      "to completion of each bucket, in seconds."),
    "exposed_seconds": ("laggard_run_comm_exposed_seconds_total",
                        "Collective time of this node's ranks of the run not hidden under "
                        "backward (on the critical path), in seconds."),
    "bytes": ("laggard_run_comm_bytes_total",
              "Bytes this node's ranks of the run put on the wire for gradients."),
    "raw_bytes": ("laggard_run_comm_uncompressed_bytes_total",
                  "Bytes an uncompressed fp32 ring all-reduce would have sent for the same "
                  "gradients of this node's ranks of the run (this over "
                  "laggard_run_comm_bytes_total is the compression ratio)."),
}


class RunMetrics:
    """Yields a :class:`RankTable`'s metric families on every scrape (fast, no I/O).

    Register it (or call :meth:`collect` from the agent's exporter); the families come in a
    fixed order: the intake's own, the ranks', their progress, the runs' verdicts.

    Args:
        table: the run table to read.
    """

    def __init__(self, table: RankTable) -> None:
        self._table = table

    def collect(self) -> Iterator[Metric]:
        """Build the table's families (stale state expired first), then yield them."""
        table = self._table
        with table.reading() as reading:
            families = [*self._intake_families(table, reading), *self._rank_families(reading),
                        *self._run_families(reading), *self._progress_families(table, reading),
                        *self._job_families(reading)]
            if reading.rank_histograms:
                families.extend(self._rank_detail_families(table, reading))
        yield from families

    def _intake_families(self, table: RankTable, reading: TableReading) -> Iterator[Metric]:
        """The intake's own counters: accepted, rejected, dropped, forgotten, the budget."""
        accepted = CounterMetricFamily("laggard_intake_datagrams_total",
                                       "Datagrams accepted by the intake.")
        accepted.add_metric([], table.accepted)
        yield accepted
        yield _counter_by("laggard_intake_rejected_total",
                          "Datagrams dropped by the intake, by reason.",
                          "reason", REJECT_REASONS, table.rejected)
        admin = CounterMetricFamily(
            "laggard_intake_admin_records_total",
            "Records root (uid 0, the node's admin) wrote into a run another uid owns "
            "(accepted; another uid's are refused as foreign_sender).")
        admin.add_metric([], table.admin_records)
        yield admin
        yield _counter_by(
            "laggard_intake_dropped_total",
            "Parts of accepted datagrams not exported as series of their own: phase and op "
            "names past the per-rank (per-run) cap or the series budget, scores, straggler "
            "flags and a run's comm counters past the budget (dropped), findings labelled "
            "outside the known vocabulary (exported as other).", "what", DROP_WHATS, table.dropped)
        yield _counter_by(
            "laggard_intake_ranks_forgotten_total",
            "Ranks forgotten with all their series, score and flags: stale (no record nor "
            "heartbeat for the rank TTL, no live process), exited (its process exited without "
            "a goodbye heartbeat, and the TTL passed), restart (new world size, or the step "
            "went back, in the same run), moved (its sender now reports for another run or "
            "rank), budget (its run was over its fair share of the series budget when another "
            "run needed room).",
            "reason", FORGET_REASONS, table.forgotten)
        yield _counter_by(
            "laggard_intake_group_resets_total",
            "Group progress entries of ranks started afresh: backwards (a heartbeat's issued "
            "or completed sequence number went back: a restarted process group), new_process "
            "(another process took the rank over; its old groups dropped).",
            "reason", GROUP_RESET_REASONS, table.group_resets)
        yield _counter_by(
            "laggard_intake_job_resets_total",
            "Times a run's state from WindowReports (scores, flags) was dropped: stale (no "
            "report for the rank TTL), restart (new world size, or the step went back), budget, "
            "ended (its monitor closed and said so).",
            "reason", ("stale", "restart", "budget", "ended"), table.job_resets)
        yield _counter_by(
            "laggard_intake_runs_forgotten_total",
            "Runs forgotten: stale (no record for the rank TTL), empty (their last rank moved "
            "or was reclaimed).", "reason", RUN_FORGET_REASONS, table.runs_forgotten)
        yield _counter_by(
            "laggard_intake_gpu_unresolved_total",
            "Rank device identities (UUID, PCI bus id) this agent could not map to a GPU "
            "index: no_nvml (NVML not available), unknown_device (not a GPU NVML lists); the "
            "rank's gpu label is then empty.", "reason", GPU_UNRESOLVED_REASONS,
            table.gpu_unresolved)
        yield GaugeMetricFamily("laggard_intake_ranks", "Ranks tracked by the intake.",
                                value=reading.rank_count)
        yield GaugeMetricFamily("laggard_intake_runs", "Training runs tracked by the intake.",
                                value=len(reading.runs))
        yield GaugeMetricFamily("laggard_intake_runs_limit",
                                "Most training runs the intake tracks (--intake.max-runs).",
                                value=table.max_runs)
        yield GaugeMetricFamily(
            "laggard_intake_series",
            "Exposition samples the intake's per-rank families hold, against the budget "
            "laggard_intake_series_limit.", value=reading.series)
        yield GaugeMetricFamily("laggard_intake_series_limit",
                                "Most exposition samples the intake's families may hold "
                                "(--intake.max-series).", value=table.max_series)
        run_series = GaugeMetricFamily(
            "laggard_intake_run_series",
            "Exposition samples one run's series hold; each run may hold at most "
            "laggard_intake_series_limit / laggard_intake_runs.", labels=["run"])
        for name, run in sorted(reading.runs.items()):
            run_series.add_metric([name], run.series)
        yield run_series

    def _rank_families(self, reading: TableReading) -> Iterator[Metric]:
        """The default per-rank series from StepRecords: identity and window medians."""
        info = GaugeMetricFamily(
            "laggard_rank_info",
            "Identity of a training rank and its GPU (value 1): join on (run, rank) to the "
            "rank's series and on (instance, gpu) to its GPU's; the sender's workload labels "
            "(pod_uid, container_id, slurm_job_id...) appear here only.",
            labels=list(_RANK_INFO_LABELS))
        phase = GaugeMetricFamily(
            "laggard_rank_phase_median_seconds",
            "Median seconds per step the rank spent in phase over its last 16 step records: "
            "compute (every timed phase but data and optimizer), data, collective_wait (time "
            "waiting for collectives after the rank's own work); absent before 8 records.",
            labels=["run", "rank", "phase"])
        step = GaugeMetricFamily(
            "laggard_rank_step_median_seconds",
            "Median wall time of the rank's last 16 training steps, in seconds; absent before 8.",
            labels=["run", "rank"])
        for name, run in sorted(reading.runs.items()):
            for rank, s in sorted(run.ranks.items()):
                r = str(rank)
                labels = {"run": name, "rank": r, "node": s.node,
                          "local_rank": "" if s.local_rank is None else str(s.local_rank),
                          "world_size": str(s.world_size), "gpu": s.gpu, "uuid": s.uuid,
                          "pci_bus_id": s.pci_bus_id}
                # Workload labels vary by sender (Kubernetes, Slurm, none): added per sample.
                info.add_sample("laggard_rank_info", {**s.labels, **labels}, 1)
                for phase_name, median in s.window.phase_medians().items():
                    phase.add_metric([name, r, phase_name], median)
                step_median = s.window.step_median()
                if step_median is not None:
                    step.add_metric([name, r], step_median)
        yield from (info, phase, step)

    def _run_families(self, reading: TableReading) -> Iterator[Metric]:
        """Per-run histograms and counters of the node's ranks together (the default set's
        replacement for each rank's)."""
        labels = ["run"]
        phase = HistogramMetricFamily(
            "laggard_run_step_phase_seconds",
            "Duration of each phase of a training step over this node's ranks of the run "
            "together, in seconds (one observation per rank and step; collective_wait: time "
            "waiting for collectives after the rank's own work).", labels=[*labels, "phase"])
        coll = HistogramMetricFamily(
            "laggard_run_collective_seconds",
            "Collective time from launch to completion over this node's ranks of the run "
            "together, in seconds.", labels=[*labels, "op"])
        coll_bytes = CounterMetricFamily(
            "laggard_run_collective_bytes_total",
            "Bytes this node's ranks of the run sent in collectives.", labels=[*labels, "op"])
        comm = {key: CounterMetricFamily(name, help_, labels=labels)
                for key, (name, help_) in _RUN_COMM_COUNTERS.items()}
        for name, run in sorted(reading.runs.items()):
            for phase_name, h in sorted(run.phases.items()):
                phase.add_metric([name, phase_name], h.cumulative_buckets(), h.sum)
            for op, h in sorted(run.collective_seconds.items()):
                coll.add_metric([name, op], h.cumulative_buckets(), h.sum)
                coll_bytes.add_metric([name, op], run.collective_bytes[op])
            for key, value in run.comm.items():
                comm[key].add_metric([name], value)
        yield from (phase, coll, coll_bytes)
        yield from comm.values()

    def _rank_detail_families(self, table: RankTable, reading: TableReading
                              ) -> Iterator[Metric]:
        """``--intake.rank-histograms``: each rank's counters, histograms and stall threshold."""
        steps = CounterMetricFamily("laggard_steps_total", "Training steps reported by a rank.",
                                    labels=["run", "rank"])
        last_step = GaugeMetricFamily("laggard_rank_last_step", "Last step a rank reported.",
                                      labels=["run", "rank"])
        last_seen = GaugeMetricFamily("laggard_rank_last_seen_timestamp_seconds",
                                      "Unix time of the last record from a rank, in seconds.",
                                      labels=["run", "rank"])
        phase = HistogramMetricFamily(
            "laggard_step_phase_seconds",
            "Duration of each phase of a training step, in seconds (collective_wait: time "
            "waiting for collectives after the rank's own work).", labels=["run", "rank", "phase"])
        step_seconds = HistogramMetricFamily("laggard_step_seconds",
                                             "Wall time of a whole training step, in seconds.",
                                             labels=["run", "rank"])
        coll = HistogramMetricFamily("laggard_collective_seconds",
                                     "Collective time from launch to completion, in seconds.",
                                     labels=["run", "rank", "op"])
        coll_bytes = CounterMetricFamily("laggard_collective_bytes_total",
                                         "Bytes this rank sent in collectives.",
                                         labels=["run", "rank", "op"])
        comm = {key: CounterMetricFamily(name, help_, labels=["run", "rank"])
                for key, (name, help_) in _COMM_COUNTERS.items()}
        threshold = GaugeMetricFamily(
            "laggard_rank_stall_threshold_seconds",
            "Seconds without progress after which the rank counts as stalled: "
            "max(--intake.stall-seconds, --intake.stall-step-factor x its median step time).",
            labels=["run", "rank"])
        minimum, factor = table.stall_seconds, table.stall_step_factor
        for name, run in sorted(reading.runs.items()):
            for rank, s in sorted(run.ranks.items()):
                r = str(rank)
                steps.add_metric([name, r], s.steps)
                last_step.add_metric([name, r], s.last_step)
                if s.steps:  # a rank known from heartbeats alone has sent no step record
                    last_seen.add_metric([name, r], s.last_seen)
                for phase_name, h in sorted(s.phases.items()):
                    phase.add_metric([name, r, phase_name], h.cumulative_buckets(), h.sum)
                if s.step_seconds.count:
                    step_seconds.add_metric([name, r], s.step_seconds.cumulative_buckets(),
                                            s.step_seconds.sum)
                for op, h in sorted(s.collective_seconds.items()):
                    coll.add_metric([name, r, op], h.cumulative_buckets(), h.sum)
                    coll_bytes.add_metric([name, r, op], s.collective_bytes[op])
                for key, value in s.comm.items():
                    comm[key].add_metric([name, r], value)
                threshold.add_metric([name, r], s.progress.stall_threshold(minimum, factor))
        yield from (steps, last_step, last_seen, phase, step_seconds, coll, coll_bytes)
        yield from comm.values()
        yield threshold

    def _progress_families(self, table: RankTable, reading: TableReading
                           ) -> Iterator[Metric]:
        """Per-rank liveness and collective progress from steps and heartbeats (issue 24)."""
        now = table.clock()
        rank_labels = ["run", "rank"]
        stalled = GaugeMetricFamily(
            "laggard_rank_stalled_seconds",
            "Seconds since the rank last made progress (a step, a heartbeat's step moving on, a "
            "collective completed), once past its stall threshold; 0 while it progresses, "
            "after a goodbye heartbeat, or once its process exited.", labels=rank_labels)
        process = GaugeMetricFamily(
            "laggard_rank_process_state",
            "The rank's process as the agent sees it (value 1, one series per rank, while it is "
            "stalled or once its process exited): "
            "alive (its pid exists with the start time it had when first seen), exited (gone, "
            "or its pid reused), unknown (no pid, or no procfs).", labels=[*rank_labels, "state"])
        age = GaugeMetricFamily(
            "laggard_rank_heartbeat_age_seconds",
            "Seconds since the rank's last heartbeat reached the agent (ranks that sent one).",
            labels=rank_labels)
        phase = GaugeMetricFamily(
            "laggard_rank_current_phase_seconds",
            "Seconds the stalled rank's training thread has been in its current phase (label "
            "phase), as its last heartbeat said, plus the time since that heartbeat.",
            labels=[*rank_labels, "phase"])
        group_labels = [*rank_labels, "group"]
        issued = GaugeMetricFamily(
            "laggard_rank_collective_issued",
            "Sequence number of the last collective the rank issued in the process group "
            "(from its heartbeats; equal on every member that issued the same collectives).",
            labels=group_labels)
        completed = GaugeMetricFamily(
            "laggard_rank_collective_completed",
            "Collectives of the process group completed on the rank, in issue order (the "
            "highest n such that 1..n completed), from its heartbeats.", labels=group_labels)
        inflight = GaugeMetricFamily(
            "laggard_rank_collective_inflight_seconds",
            "Seconds since the rank issued its last collective (label op) in the group, while "
            "some of the group's collectives are in flight on it (issued, not completed).",
            labels=[*group_labels, "op"])
        pair_labels = [*group_labels, "peer"]
        p2p_issued = GaugeMetricFamily(
            "laggard_rank_p2p_issued",
            "Sequence number of the last point-to-point op (send, recv) the rank issued with "
            "rank peer in the group: counted per pair, never comparable across the group.",
            labels=pair_labels)
        p2p_completed = GaugeMetricFamily(
            "laggard_rank_p2p_completed",
            "Point-to-point ops with rank peer in the group completed on the rank, in issue "
            "order (the highest n such that 1..n completed).", labels=pair_labels)
        p2p_inflight = GaugeMetricFamily(
            "laggard_rank_p2p_inflight_seconds",
            "Seconds since the rank issued its last point-to-point op (label op) with rank peer, "
            "while some of the pair's ops are in flight on it.", labels=[*pair_labels, "op"])
        minimum, factor = table.stall_seconds, table.stall_step_factor
        for name, run in sorted(reading.runs.items()):
            for rank, s in sorted(run.ranks.items()):
                r, p = str(rank), s.progress
                stalled_seconds = p.stalled_seconds(now, minimum, factor)
                stalled.add_metric([name, r], stalled_seconds)
                heartbeat_age = p.heartbeat_age(now)
                if heartbeat_age is not None:
                    age.add_metric([name, r], heartbeat_age)
                # The hang rules' evidence (dashboards/rules, laggard-hang) matters while the
                # rank is stalled: every rank they name, and every rank they compare it with,
                # is. While it trains it costs series and answers nothing (issue 34).
                if not (stalled_seconds > 0 or p.process == "exited" or reading.rank_histograms):
                    continue
                process.add_metric([name, r, p.process], 1)
                phase_seconds = p.current_phase_seconds(now)
                if phase_seconds is not None and p.phase is not None:
                    phase.add_metric([name, r, p.phase], phase_seconds)
                for (group, peer), seen in sorted(
                        p.groups.items(),
                        key=lambda kv: (kv[0][0], -1 if kv[0][1] is None else kv[0][1])):
                    seconds = seen.inflight_seconds(now)
                    op = seen.op or ""
                    if peer is None:
                        issued.add_metric([name, r, group], seen.issued)
                        completed.add_metric([name, r, group], seen.completed)
                        if seconds is not None:
                            inflight.add_metric([name, r, group, op], seconds)
                    else:
                        labels = [name, r, group, str(peer)]
                        p2p_issued.add_metric(labels, seen.issued)
                        p2p_completed.add_metric(labels, seen.completed)
                        if seconds is not None:
                            p2p_inflight.add_metric([*labels, op], seconds)
        yield from (stalled, process, age, phase, issued, completed, inflight,
                    p2p_issued, p2p_completed, p2p_inflight)

    def _job_families(self, reading: TableReading) -> Iterator[Metric]:
        """The in-job detector's verdicts from each run's WindowReports: scores, flags,
        slowdown."""
        score = GaugeMetricFamily(
            "laggard_straggler_score",
            "Straggler score per rank from the in-job detector (0 typical, larger slower).",
            labels=["run", "rank"])
        flagged = GaugeMetricFamily(
            "laggard_straggler_active",
            "1 while the in-job detector flags a rank as a straggler, by cause.",
            labels=["run", "rank", "kind"])
        report = GaugeMetricFamily(
            "laggard_straggler_report_timestamp_seconds",
            "Unix time, in seconds, of the last WindowReport from the run's in-job detector "
            "(alert rules ignore flags older than a few windows).", labels=["run"])
        inputs = CounterMetricFamily(
            "laggard_straggler_detector_inputs_total",
            "The in-job detector's windows and the bad input it counted and skipped "
            "(missing_rank_reports, invalid_durations, world_size_changes...), by kind.",
            labels=["run", "kind"])
        slowdown = GaugeMetricFamily(
            "laggard_job_slowdown_active",
            "1 while the in-job detector finds the whole run slower than its best (no single "
            "rank to blame: shared storage, the fabric, a job-wide change).", labels=["run"])
        any_report = any_stats = any_slowdown = False
        for name, run in sorted(reading.runs.items()):
            job = run.job
            if job is None:
                continue
            for rank, score_value in sorted(job.scores.items()):
                score.add_metric([name, str(rank)], score_value)
            for (rank, kind), flag in sorted(job.flagged.items()):
                flagged.add_metric([name, str(rank), kind], flag)
            report.add_metric([name], job.last_report)
            any_report = True
            for kind, count in sorted(job.detector_stats.items()):
                if count:  # a kind's series appears with its first count (the budget)
                    inputs.add_metric([name, kind], count)
                    any_stats = True
            if job.job_slowdown is not None:
                slowdown.add_metric([name], job.job_slowdown)
                any_slowdown = True
        yield score
        yield flagged
        # Families without a sample stay out, as before runs (the metric reference lists
        # them from an agent that has had reports).
        if any_report:
            yield report
        if any_stats:
            yield inputs
        if any_slowdown:
            yield slowdown


#: Labels every ``laggard_rank_info`` sample has (workload labels come on top, per sender).
_RANK_INFO_LABELS = ("run", "rank", "local_rank", "node", "gpu", "uuid", "pci_bus_id",
                     "world_size")


def _counter_by(name: str, documentation: str, label: str, values: tuple[str, ...],
                counts: Counter[str]) -> CounterMetricFamily:
    """A counter family with one series per value of ``label`` counted so far.

    A value's series appears with its first count, not as a 0 from the start: the intake's
    reasons and kinds are ~40 series a node that stay 0 on a healthy one (issue 34's budget).
    ``increase()`` misses that first count; rules that must see it add
    ``(x unless x offset 5m)``, as laggard-recording.yml does for XIDs.
    """
    family = CounterMetricFamily(name, documentation, labels=[label])
    for value in values:
        if counts.get(value, 0):
            family.add_metric([value], counts[value])
    return family
