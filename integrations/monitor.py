"""TrainingMonitor: times each training step's phases, reports them to the node agent, and names
the straggler rank from inside the job.

Per step, one :class:`~laggard.wire.StepRecord` datagram goes to the node agent through the
agent's socket (a Unix datagram socket; UDP on loopback is the fallback): fire and forget on a
non-blocking socket, so a missing, slow or crashed agent costs the job nothing but a counted
drop. Every ``window_steps`` steps all ranks exchange one window record with one
``all_gather`` (:mod:`laggard.detectors.window`: the medians of the step columns over the window,
one float64 each per rank whatever K, then the participants' columns), each participant turns the
gathered record into findings (:mod:`laggard.integrations.participants`), and rank 0 logs each
finding once when it is raised and once when it clears and sends a
:class:`~laggard.wire.WindowReport` to its agent. On rank 0 the analysis and the report run on
a thread of their own behind a one-slot queue (:mod:`laggard.integrations.window_analysis`):
the training thread takes part in the gather and hands the window over, and a window's
findings come at most one window later.

Usage, with DDP and the timing communication hook::

    timer = CommTimer()
    ddp.register_comm_hook(timer, allreduce_timing_hook)
    monitor = TrainingMonitor(TrainingMonitor.Config(window_steps=20), comm_timer=timer)
    for batch in loader:
        with monitor.step():
            with monitor.phase("data"):
                x, y = next(batches)
            with monitor.phase("forward"):
                loss = loss_fn(ddp(x), y)
            with monitor.phase("backward"):
                loss.backward()
            with monitor.phase("optimizer"):
                opt.step(); opt.zero_grad()
    monitor.close()

Nothing the monitor does raises into the training loop: its own failures are counted in
:attr:`TrainingMonitor.stats` and logged once. Exceptions of the training code inside ``with``
blocks pass through untouched.

The monitor is a host: it wires rooms that each hold one job.

- :mod:`~laggard.integrations.monitor_config`: ``Config`` (:class:`MonitorConfig`) and
  :class:`MonitorStats`;
- :mod:`~laggard.integrations.device_discovery`: rank, world size, the rank's device and the
  phase clock (:mod:`laggard.integrations.device_clock` for ``phase_clock="device"``, the
  default ``"auto"`` on a CUDA job; docs/gpu.md says what each clock measures on a GPU);
- :mod:`~laggard.integrations.step_context` and :mod:`~laggard.integrations.phases`: the
  phase timers and their arithmetic; :mod:`~laggard.integrations.step_table`: the per-step
  table of the window;
- :mod:`~laggard.integrations.window_gather`: the gather and the participants' analysis;
  :mod:`~laggard.integrations.window_analysis`: rank 0's analysis thread;
  :mod:`~laggard.integrations.window_history`: the kept windows, full and summarised;
- the outputs: :mod:`~laggard.integrations.finding_log` (rank 0's log lines),
  :mod:`~laggard.integrations.windows_file` (``Config.windows_path``) and
  :mod:`~laggard.integrations.agent_reports` (the datagrams to the agent);
- :mod:`~laggard.integrations.run_identity` (the run id every rank agrees on) and
  :mod:`~laggard.integrations.heartbeat` (the heartbeat and hang threads).
"""

from __future__ import annotations

import logging
import os
import socket
import time
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from laggard.detectors.blame import BLAME_COLUMNS
from laggard.detectors.finding import Finding
from laggard.detectors.peer_groups import PeerGroups
from laggard.detectors.window import STEP_COLUMNS, WindowLayout, WindowRecord
from laggard.integrations import device_discovery
from laggard.integrations.agent_reports import AgentReports
from laggard.integrations.device_discovery import PHASE_CLOCKS, job_position, rank_device
from laggard.integrations.finding_log import FindingLog
from laggard.integrations.gc_timing import OUTSIDE, GcTimer
from laggard.integrations.monitor_config import MonitorConfig, MonitorStats
from laggard.integrations.participants import (
    MonitorContext,
    Participant,
    StragglerParticipant,
    WindowOutcome,
)
from laggard.integrations.phases import step_times
from laggard.integrations.run_identity import job_run
from laggard.integrations.step_context import DevicePhaseContext, PhaseContext, StepContext
from laggard.integrations.step_table import WORK_NOTES, StepTable
from laggard.integrations.window_analysis import (
    CLOSE_SECONDS,
    PendingWindow,
    WindowAnalysis,
    merge_outcomes,
)
from laggard.integrations.window_gather import WindowGather, analyse_window, bad_rows
from laggard.integrations.window_history import WindowHistory, WindowSummary
from laggard.integrations.windows_file import WindowsFile
from laggard.log_once import LogOnce

if TYPE_CHECKING:
    import torch.distributed as dist

    from laggard.integrations.comm_timing import CommTimer
    from laggard.integrations.tracer import CollectiveTracer

log = logging.getLogger(__name__)


class TrainingMonitor:
    """Phase timers per step, StepRecords to the node agent, in-job straggler detection: the host
    that wires the rooms the module docstring lists.

    Args:
        config: see :class:`TrainingMonitor.Config`
            (:class:`~laggard.integrations.monitor_config.MonitorConfig`); defaults when None.
        comm_timer: the CommTimer of the job's DDP communication hook; gives each step's
            collective timings and exposed wait. Without it, collective wait is the time spent in
            a phase named ``"collective_wait"``, if any.
        tracer: a :class:`~laggard.integrations.tracer.CollectiveTracer`: every collective of
            its groups (FSDP2, DDP through ``CommTimer(tracer=...)``, async ``Work``); without
            a comm_timer it gives the step's collective timings, and its per-group times ride
            in the window gather so rank 0 can tell who waited for whom and name a slow link.
        group: process group for the window ``all_gather``; None uses the default group when
            its backend is gloo and otherwise creates a gloo group (the statistics are CPU
            tensors). Every rank must construct its monitor at the same point, as for any
            collective, after ``init_process_group``: a monitor built before it (or in a
            one-rank job) sends step records but gathers no windows.
        rank: global rank; default from ``torch.distributed`` or ``$RANK`` (else 0).
        world_size: default from ``torch.distributed`` or ``$WORLD_SIZE`` (else 1).
        local_rank: default from ``$LOCAL_RANK``.
        participants: participants of your own (:class:`~laggard.integrations.participants.
            Participant`), after the built-in ones (straggler, host context, link probe, trace,
            integrity); every rank must give the same ones in the same order.
        device: the ``torch.cuda``-like module the device clock records on (``Event(
            enable_timing=True)`` with ``record``/``query``/``elapsed_time``,
            ``current_stream()``, whose results compare equal (``==``) for the same stream, as
            torch's do; an event may be re-recorded, the latest record counting; ``Stream`` and
            ``stream(...)`` are not needed): a fake in tests, an emulated device in the demo.
            None: ``torch.cuda`` when ``phase_clock`` resolves to ``"device"``.
        model: the job's model (a module, or a sequence of them), for ``phase_clock="auto"``
            (device when its parameters are on one CUDA device) and to refuse the device
            clock for a model spread over several devices (counted, logged once, wall clock).
        mesh: the job's ``DeviceMesh`` (the whole mesh, with ``mesh_dim_names``): ranks
            sharing every coordinate but the data-parallel ones are compared only with each
            other (:meth:`~laggard.detectors.peer_groups.PeerGroups.from_mesh`); the ``pp``
            coordinate is the group's pipeline stage. None: ``Config.peer_groups``, else all
            ranks in one group.

    Raises:
        ValueError: an invalid configuration, two participants declaring one column, a mesh
            or peer groups that do not map to this job's ranks, or both ``mesh`` and
            ``Config.peer_groups`` given (raised here, before training starts).

    Attributes:
        stats: :class:`~laggard.integrations.monitor_config.MonitorStats`.
        findings: on rank 0, every finding raised so far (oldest first, at most 256).
        cleared: on rank 0, the findings that have cleared since (``Finding.cleared``).
        save_error: on rank 0, the first error that kept a window out of
            ``Config.windows_path`` (``"[Errno 28] No space left on device"``), "" if none;
            ``stats.save_errors`` counts them.
        windows: on rank 0, the latest analysed
            :class:`~laggard.detectors.window.WindowRecord` s (their width-1 columns), oldest
            first: at most ``history_windows``, together at most ``history_full_bytes``
            (the latest always kept).
        window_summaries: on rank 0, a
            :class:`~laggard.integrations.window_history.WindowSummary` of each of the last
            ``history_windows`` analysed windows (C x 5 quantiles, whatever the world size).
        participants: the hosted participants, in gather order.
        phase_clock: the clock the phases are timed on: ``"wall"``, ``"thread_cpu"`` or
            ``"device"`` (``"auto"`` resolved; ``"device"`` refused falls back to ``"wall"``).
        device_clock: the :class:`~laggard.integrations.device_clock.DeviceClock` on the
            device clock (its ``stats``), else None.
        peer_groups: the resolved :class:`~laggard.detectors.peer_groups.PeerGroups` (from
            ``mesh``, ``Config.peer_groups``, or every rank: ``source == "all"``).
    """

    #: ``TrainingMonitor.Config(...)``: the configuration, kept in ``monitor_config.py``.
    Config = MonitorConfig

    def __init__(
        self,
        config: MonitorConfig | None = None,
        *,
        comm_timer: CommTimer | None = None,
        tracer: CollectiveTracer | None = None,
        group: dist.ProcessGroup | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        local_rank: int | None = None,
        participants: Sequence[Participant] = (),
        device: Any = None,
        model: Any = None,
        mesh: Any = None,
    ) -> None:
        cfg = self.config = config if config is not None else MonitorConfig()
        if mesh is not None and cfg.peer_groups is not None:
            raise ValueError("give the peer groups once: TrainingMonitor(mesh=...) or "
                             "Config(peer_groups=...), not both")
        self.comm_timer = comm_timer
        self.tracer = tracer
        self.stats = MonitorStats()
        self._log_once = LogOnce(log)
        self._finding_log = FindingLog(log)
        self.findings: list[Finding] = self._finding_log.findings
        self.cleared: list[Finding] = self._finding_log.cleared
        self._history = WindowHistory(cfg.history_windows, cfg.history_full_bytes)
        self.windows = self._history.windows
        self.window_summaries: Sequence[WindowSummary] = self._history.summaries
        dist_mod = device_discovery.initialized_dist()
        self.rank, self.world_size, self.local_rank = job_position(
            rank, world_size, local_rank, dist_mod)
        self.node = cfg.node or socket.gethostname()
        self.peer_groups = (
            PeerGroups.from_mesh(mesh, self.world_size) if mesh is not None
            else PeerGroups.from_lists(cfg.peer_groups, self.world_size)
            if cfg.peer_groups is not None else PeerGroups.all(max(self.world_size, 1)))
        self.step_index = 0
        self._table = StepTable(cfg.window_steps)
        self._analysis_cpu_sent = 0.0  # analysis CPU seconds already sent (rank 0)
        self._intervals: list[tuple[str, float, float]] = []
        #: Where the training thread is: (phase, perf_counter at entry), replaced whole by
        #: one assignment (the heartbeat thread reads it without a lock).
        self.where: tuple[str, float] = ("outside", time.perf_counter())
        self._heartbeat: Any = None
        self._gc: GcTimer | None = None
        self._step_start = 0.0
        self._step_ctx = StepContext(self)
        self._detect = cfg.detect and dist_mod is not None and self.world_size > 1
        self._group = group
        self._gather = None if dist_mod is None else WindowGather(
            dist_mod, group, world_size=self.world_size, node=self.node,
            local_rank=self.local_rank, make_gloo_group=self._detect, rank=self.rank)
        self.run = job_run(cfg.run, os.environ, dist_mod, self._gather_group(),
                           agree=self._detect, count_error=self._internal_error)
        clock = device_discovery.resolve_phase_clock(
            cfg.phase_clock, device=device, model=model, dist_mod=dist_mod,
            comm_timer=comm_timer, window_steps=cfg.window_steps,
            pool_events=cfg.device_pool_events, log_once=self._log_once)
        self.stats.device_fallbacks += bool(clock.refused)
        self.phase_clock: str = clock.name
        self.device_clock: Any = clock.device_clock
        self._fsdp_markers: Any = clock.fsdp_markers
        self._clock = PHASE_CLOCKS[self.phase_clock]
        self._device_id = rank_device(model)  # None: a CPU-only job
        self._agent = AgentReports(
            cfg.agent_address, stats=self.stats, log_once=self._log_once, rank=self.rank,
            world_size=self.world_size, local_rank=self.local_rank, node=self.node,
            run=self.run, device_id=self._device_id, udp_fallback=cfg.udp_fallback,
            batch_seconds=cfg.agent_batch_seconds)
        self._windows_file = (WindowsFile(cfg.windows_path, log_once=self._log_once)
                              if cfg.windows_path and self.rank == 0 else None)
        if cfg.gc_timing:
            self._gc = _gc_timer(self, thread_cpu=self.phase_clock == "thread_cpu")
            self.stats.gc = self._gc.stats
        self.participants = tuple(self._builtin_participants()) + tuple(participants)
        context = MonitorContext(
            rank=self.rank, world_size=self.world_size, node=self.node,
            local_rank=self.local_rank, window_steps=cfg.window_steps,
            group=self._gather_group, log_once=self._log_once,
            count_error=self._internal_error)
        for participant in self.participants:
            participant.attach(context)
        # on_window on the training thread of every rank, or on rank 0's analysis thread
        # (participants.py, "Where on_window runs")
        self._inline = tuple(p for p in self.participants if getattr(p, "inline", False))
        self._deferred = tuple(p for p in self.participants
                               if not getattr(p, "inline", False))
        self._analysis = WindowAnalysis(self._analyse_pending, stats=self.stats,
                                        count_error=self._internal_error)
        if self._gather is not None:  # only an inline participant needs every rank's record
            self._gather.everywhere = bool(self._inline)
        self.layout = WindowLayout(
            STEP_COLUMNS + BLAME_COLUMNS + tuple(c for p in self.participants for c in p.columns))
        self._trace = self.participant("trace")
        self._start_heartbeat(dist_mod)

    def _gather_group(self) -> Any:
        """The gather's process group (None: the default group)."""
        return self._gather.group if self._gather is not None else self._group

    def _start_heartbeat(self, dist_mod: Any) -> None:
        """Start the heartbeat threads (:mod:`laggard.integrations.heartbeat`); never
        raises."""
        cfg = self.config
        if cfg.heartbeat_seconds <= 0 and cfg.hang_store_seconds <= 0:
            return
        try:
            from laggard.integrations.heartbeat import HeartbeatThreads

            sock = self._agent.sock
            self._heartbeat = HeartbeatThreads(
                self, rank=self.rank, world_size=self.world_size, run=self.run,
                node=self.node, send=sock.send if sock is not None else None,
                heartbeat_seconds=cfg.heartbeat_seconds,
                store_seconds=cfg.hang_store_seconds if dist_mod is not None else 0.0,
                writes_per_second=cfg.hang_store_writes_per_second,
                hang_seconds=cfg.hang_seconds, on_hang=cfg.on_hang,
                local_rank=self.local_rank).start()
            self.stats.heartbeat = self._heartbeat.stats
        except Exception as exc:  # noqa: BLE001 - no heartbeat, the job goes on
            self._internal_error("heartbeat", exc)

    def _builtin_participants(self) -> list[Participant]:
        """Straggler detector; the host context (``Config.host_context``); with a tracer, the
        link probe and the tracer's block (whose link detector reads the probe's column); the
        integrity check when configured."""
        out: list[Participant] = [StragglerParticipant(
            self.config.straggler, peer_groups=self.peer_groups,
            cpu_only=self._device_id is None)]
        if self.config.host_context:
            from laggard.integrations.host_context import HostContextParticipant

            out.append(HostContextParticipant())
        if self.tracer is not None:
            from laggard.integrations.link_probe import DEFAULT_PROBE_BYTES, LinkProbeParticipant
            from laggard.integrations.trace_window import TraceParticipant

            nbytes = self.config.link_probe_bytes
            out.append(LinkProbeParticipant(DEFAULT_PROBE_BYTES if nbytes is None else nbytes))
            out.append(TraceParticipant(self.tracer, self.config.link))
        if self.config.integrity is not None:
            from laggard.integrations.integrity import IntegrityParticipant

            out.append(IntegrityParticipant(self.config.integrity))
        return out

    def participant(self, name: str) -> Any:
        """The hosted participant called ``name`` (``"straggler"``, ``"trace"``,
        ``"link_probe"``, ``"integrity"``, or one of yours), or None."""
        return next((p for p in self.participants if p.name == name), None)

    @property
    def save_error(self) -> str:
        """On rank 0, the first error that kept a window out of ``Config.windows_path``
        (``"[Errno 28] No space left on device"``), "" if none."""
        return self._windows_file.first_error if self._windows_file is not None else ""

    def wait_analysed(self, timeout: float = CLOSE_SECONDS) -> bool:
        """Wait until every window handed to rank 0's analysis thread has been analysed and
        reported (``findings``, ``windows``, the agent, the windows file), at most
        ``timeout`` seconds; True if so. For tests and the job's end, never per step: the
        training loop must not wait for the analysis."""
        return self._analysis.wait_idle(timeout)

    def typical_step_seconds(self) -> float | None:
        """The median of this rank's recent step times (the last ``window_steps``), seconds;
        None before the first step. Safe from another thread (reads a few floats)."""
        return self._table.typical_step_seconds(self.step_index)

    # ----------------------------------------------------------------- the training-loop API
    def step(self) -> StepContext:
        """Context manager around one training step (reusable, not reentrant)."""
        return self._step_ctx

    def phase(self, name: str) -> PhaseContext:
        """Context manager timing one phase of the current step.

        Args:
            name: ``data``, ``forward``, ``backward``, ``optimizer``, or a name of your own
                (at most 16 distinct names). A name used twice in a step adds up.
        """
        if self.device_clock is not None:
            return DevicePhaseContext(self, name, self._clock, self.device_clock)
        return PhaseContext(self, name, self._clock)

    def note(self, name: str, value: float) -> None:
        """Record a value of the training loop.

        ``"tokens"`` and ``"samples"``, on every rank: the work of this step, summed over the
        step's notes into the window's ``tokens`` / ``samples`` columns (NaN for a step
        without one; a note between two steps counts toward the next). Given on every rank,
        the straggler's cause tells a rank with more work (``kind="load_imbalance"``) from a
        rank slow per token (:mod:`laggard.detectors.causes`). A value that is not a finite
        number >= 0 is counted (``stats.bad_notes``) and ignored.

        Any other name (e.g. ``loss``) is for the saved windows: rank 0 writes each name's mean
        over the window beside the window's statistics (:attr:`Config.windows_path`); ignored
        without a windows path.

        Cheap, never raises.

        Args:
            name: the value's name (at most 16 distinct names are kept besides the work notes).
            value: a number (for the other names NaN and infinities are dropped).
        """
        if name in WORK_NOTES:
            try:
                self._table.note_work(name, value)
            except Exception:  # noqa: BLE001 - e.g. a tensor of several elements: never raise
                self.stats.bad_notes += 1
                self._log_once("bad-note", "laggard: monitor.note(%r, %r) is not a finite "
                               "number >= 0: ignored (counted in stats.bad_notes)", name, value)
        elif self._windows_file is not None:
            self._windows_file.note(name, value)

    def close(self) -> None:
        """Tell the agent the run ended (rank 0: its active findings end at once), close the
        socket and destroy the gather group this monitor created; take the FSDP2 stall markers
        out. Never raises; a second call sends nothing."""
        try:
            if self._gc is not None:
                self._gc.remove()
            # the last window's findings are reported before the file and the socket close
            if not self._analysis.close():
                self._log_once("analysis-close", "laggard: rank 0's window analysis did not "
                               "finish within %.0f s of close(); its last findings are lost",
                               CLOSE_SECONDS)
            if self._heartbeat is not None:  # first: it sends through the socket
                self._heartbeat.close()
                self._heartbeat = None
            if self._fsdp_markers is not None:
                self._fsdp_markers.uninstall()
                self._fsdp_markers = None
            if self._windows_file is not None:
                self._windows_file.close()
                self.stats.save_errors = self._windows_file.errors
            if self.rank == 0:  # the rank that sends the windows ends the run's verdicts
                self._agent.send_end()
            self._agent.close()
            if self._gather is not None:
                self._gather.close()
        except Exception as exc:  # noqa: BLE001 - closing must not fail the job's exit
            self._internal_error("close", exc)

    def __enter__(self) -> TrainingMonitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------- per step
    def _begin_step(self) -> None:
        self.where = ("step", time.perf_counter())
        self._intervals.clear()
        if self._gc is not None:
            self._gc.begin_step()
        if self.device_clock is not None:
            try:
                self.device_clock.begin_step()
            except Exception as exc:  # noqa: BLE001
                self._internal_error("device", exc)
        self._step_start = time.perf_counter()

    def _end_step(self) -> None:
        end = time.perf_counter()
        step = self.step_index
        self.step_index += 1  # first, so every rank's window count stays in lock step
        self.where = ("outside", end)
        try:
            self._record_step(step, end)
        except Exception as exc:  # noqa: BLE001 - never raise into the training loop
            self._internal_error("step", exc)
        if self._detect and self.step_index % self.config.window_steps == 0:
            self._gather_window(step)

    def _record_step(self, step: int, end: float) -> None:
        """Hand the step to the participants, split its time, write it into the step table
        and the device clock, send its StepRecord."""
        column = step % self.config.window_steps
        for participant in self.participants:
            try:
                participant.end_step(step, column)
            except Exception as exc:  # noqa: BLE001 - one participant never stops the others
                self._internal_error(participant.name, exc)
        comm: Any = self.comm_timer.take_step() if self.comm_timer is not None else None
        if comm is None and self._trace is not None:
            comm = self._trace.last_step
        collected = self._gc.take_step() if self._gc is not None else None
        times = step_times(
            self._intervals, step_seconds=end - self._step_start, collectives=comm,
            exposed_interval=getattr(comm, "exposed_interval", None),
            wall_clock=self._clock is time.perf_counter,
            blocking_collectives=self.comm_timer is None,
            gc_by_phase=None if collected is None else (
                collected.cpu_by_phase if self.phase_clock == "thread_cpu"
                else collected.wall_by_phase),
            # the device clock's phases are device time: the pause is only reported there
            move_gc=self.device_clock is None,
            p2p_wait_seconds=getattr(self._trace and self._trace.last_step,
                                     "p2p_wait_seconds", 0.0))
        self._table.record(column, times, collected)
        if self.device_clock is not None:
            clock = self.device_clock
            before = clock.stats.stream_switches + clock.stats.untimed_steps
            clock.end_step(step, times)
            self.stats.device_fallbacks += (
                clock.stats.stream_switches + clock.stats.untimed_steps - before)
        self._agent.send_step(step, times, comm)

    # ----------------------------------------------------------------------- per window
    def _gather_window(self, step: int) -> None:
        """Every rank: summarise the window, add the participants' columns, gather, analyse."""
        try:
            values: dict[str, object] = dict(self._table.summary())
            if self.device_clock is not None:
                try:
                    # the previous window's device times (one window late; device_clock.py)
                    values.update(self.device_clock.window_values(step))
                    self.stats.device_pending = self.device_clock.stats.steps_pending
                except Exception as exc:  # noqa: BLE001 - the CPU clock's values go instead
                    self._internal_error("device", exc)
            if self.rank == 0:  # the analysis thread's CPU since the last window (blame.py)
                cpu = self.stats.analysis_cpu_seconds
                values["monitor_cpu_seconds"] = cpu - self._analysis_cpu_sent
                self._analysis_cpu_sent = cpu
            else:
                values["monitor_cpu_seconds"] = 0.0
            for participant in self.participants:
                values.update(participant.contribute(step))
            record = self._gather.gather(step, values, self.layout)  # type: ignore[union-attr]
            self.stats.windows += 1
            if record is None:  # a rank other than 0, no inline participant: nothing to do
                return
        except Exception as exc:  # noqa: BLE001 - a failed gather switches detection off
            self.stats.gather_errors += 1
            self._detect = False
            self._log_once("gather", "laggard: window gather failed at step %d (%s); "
                           "straggler detection off", step, exc)
            return
        self._hand_over(record)

    def _hand_over(self, record: WindowRecord) -> None:
        """The training thread's share of a gathered window: the inline participants; then on
        rank 0 the window goes to the analysis thread (never waited for). A StopJob of an
        inline participant is reported first (rank 0 waits for the analysis thread, bounded:
        the job is stopping), then raised."""
        if self.rank == 0:  # counted here: a window coalesced later still counts its rows
            self.stats.bad_rows += bad_rows(record)
        inline, stop = analyse_window(self._inline, record, self._internal_error)
        notes = self._windows_file.take_notes() if self._windows_file is not None else {}
        if stop is not None:
            # rank 0 reports it first, after the window in hand (bounded: a stuck analysis
            # leaves this window unreported, counted, and the job stops all the same)
            if self.rank == 0 and self._analysis.wait_idle(CLOSE_SECONDS) and \
                    self._analysis.lock.acquire(timeout=CLOSE_SECONDS):
                try:
                    self._report(record, inline, notes)
                finally:
                    self._analysis.lock.release()
            elif self.rank == 0:
                self._internal_error("stop_report", TimeoutError("analysis thread busy"))
            raise stop
        if self.rank == 0 and not self.config.analysis_thread:
            with self._analysis.lock:
                self._analyse_pending(PendingWindow(record=record, inline=inline, notes=notes))
            return
        if self.rank == 0:
            try:
                self._analysis.submit(PendingWindow(record=record, inline=inline, notes=notes))
            except Exception as exc:  # noqa: BLE001 - e.g. no thread could be started
                self._internal_error("analysis", exc)

    def _analyse_pending(self, pending: PendingWindow) -> None:
        """Rank 0's analysis thread: the other participants on one window, then its report."""
        found, stop = analyse_window(self._deferred, pending.record, self._internal_error)
        outcome = merge_outcomes(pending.inline, found)
        if stop is not None:  # reported, not raised: it could not stop every rank alike
            self._internal_error("stop_not_inline", stop)
        self._report(pending.record, outcome, pending.notes)

    def analyse(self, record: WindowRecord) -> list[Finding]:
        """Hand one gathered window to every participant and report what they found, now, on
        the calling thread (public for tests: a record built by hand runs the same path; the
        job's own windows go through rank 0's analysis thread instead, module docstring).

        On rank 0: logs each finding once when raised and once when cleared, keeps the
        record's width-1 columns in :attr:`windows`, sends one WindowReport to the agent and
        appends the window to ``Config.windows_path``. A participant's failure is counted
        (``stats.internal_errors``) and the others go on; a
        :class:`~laggard.integrations.participants.StopJob` (integrity policy ``raise``) is
        reported, then raised.

        Args:
            record: the gathered window; columns a participant needs and the record lacks
                leave that participant out of this window.

        Returns:
            The findings raised or cleared in this window, in participant order.
        """
        with self._analysis.lock:
            outcome, stop = analyse_window(self.participants, record, self._internal_error)
            if self.rank == 0:
                self.stats.bad_rows += bad_rows(record)
                self._report(record, outcome, None)
        if stop is not None:
            raise stop
        return outcome.findings

    def _report(self, record: WindowRecord, outcome: WindowOutcome,
                notes: dict[str, float] | None) -> None:
        """Rank 0: :meth:`_report_window`, its failure counted."""
        try:
            self._report_window(record, outcome, notes)
        except Exception as exc:  # noqa: BLE001
            self._internal_error("report", exc)

    def _report_window(self, record: WindowRecord, outcome: WindowOutcome,
                       notes: dict[str, float] | None) -> None:
        """Rank 0: log, keep, send and save one window's outcome."""
        self._finding_log.record(outcome.findings)
        kept = record.scalars()
        self._history.add(kept, outcome.scores, outcome.findings)
        self._agent.send_window(record, outcome)
        if self._windows_file is not None:
            self._windows_file.append(kept, self.world_size, outcome.scores, outcome.findings,
                                      notes)
            self.stats.save_errors = self._windows_file.errors

    # ------------------------------------------------------------------------- helpers
    def _internal_error(self, where: str, exc: BaseException) -> None:
        self.stats.internal_errors += 1
        self._log_once(where, "laggard: monitor error in %s: %r (ignored; training goes on)",
                       where, exc)


def _gc_timer(monitor: TrainingMonitor, thread_cpu: bool) -> GcTimer:
    """The monitor's GC timer, installed, reading the training thread's phase from
    ``monitor.where`` (and its CPU clock when ``thread_cpu``). It holds the monitor weakly and
    leaves ``gc.callbacks`` when the monitor is closed or collected, so a monitor dropped
    without ``close()`` does not live on."""
    ref = weakref.ref(monitor)

    def phase_of() -> str:
        live = ref()
        return live.where[0] if live is not None else OUTSIDE

    timer = GcTimer(phase_of=phase_of, thread_cpu=thread_cpu).install()
    weakref.finalize(monitor, timer.remove)
    return timer


__all__ = ["MonitorConfig", "MonitorStats", "TrainingMonitor"]
