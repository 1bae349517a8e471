"""TrainingMonitor: times each training step's phases, reports them to the node agent, and names
the straggler rank from inside the job.

Per step, one :class:`~laggard.wire.StepRecord` UDP datagram goes to the node agent: fire
and forget on a non-blocking socket, so a missing, slow or crashed agent costs the job nothing but
a counted drop. Every ``window_steps`` steps all ranks exchange one window record with one
``all_gather`` (:mod:`laggard.detectors.window`: the medians of the step columns over the window,
one float64 each per rank whatever K, then the participants' columns), each participant turns the
gathered record into findings (:mod:`laggard.integrations.participants`), and rank 0 logs each
finding once when it is raised and once when it clears and sends a
:class:`~laggard.wire.WindowReport` to its agent.

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

The window's columns are :mod:`laggard.detectors.window`, the phase arithmetic
:mod:`laggard.integrations.phases`, the participants :mod:`laggard.integrations.participants`,
the device clock (``phase_clock="device"``, the default ``"auto"`` on a CUDA job)
:mod:`laggard.integrations.device_clock` (docs/gpu.md says what each clock measures on a GPU).
"""

from __future__ import annotations

import collections
import itertools
import json
import logging
import math
import os
import socket
import sys
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from laggard.detectors.finding import Finding
from laggard.detectors.peer_groups import PeerGroups
from laggard.detectors.window import (
    STEP_COLUMN_NAMES,
    STEP_COLUMNS,
    WindowLayout,
    WindowRecord,
    summarize_window,
)
from laggard.integrations.agent_socket import AgentSocket, check_intake_target
from laggard.integrations.gc_timing import OUTSIDE, GcTimer
from laggard.integrations.participants import (
    MonitorContext,
    Participant,
    StopJob,
    StragglerParticipant,
    WindowOutcome,
)
from laggard.integrations.phases import step_times
from laggard.integrations.run_identity import agree_run, device_identity, resolve_run
from laggard.wire import (
    DEFAULT_INTAKE_SOCKET,
    MAX_REPORT_FINDINGS,
    MAX_REPORT_RANKS,
    CollectiveTiming,
    StepRecord,
    WindowReport,
)

if TYPE_CHECKING:
    import torch.distributed as dist

    from laggard.integrations.comm_timing import CommTimer
    from laggard.integrations.tracer import CollectiveTracer

log = logging.getLogger(__name__)

#: ``Config.phase_clock`` -> clock of the phase timers, in seconds (the device clock keeps the
#: wall clock beside its events).
_PHASE_CLOCKS: dict[str, Callable[[], float]] = {
    "wall": time.perf_counter,
    "thread_cpu": time.thread_time,
    "device": time.perf_counter,
}
#: Every accepted ``Config.phase_clock``.
PHASE_CLOCK_NAMES = ("auto", "device", "thread_cpu", "wall")
#: Backends whose collectives the device clock's markers are known to order on the stream.
_DEVICE_BACKENDS = frozenset({"nccl", "gloo"})
#: Step column name -> row of the monitor's per-step table.
_STEP_ROWS = {name: row for row, name in enumerate(STEP_COLUMN_NAMES)}
#: Per-step collective entries sent in one StepRecord; beyond it they are merged per op.
_MAX_COLLECTIVES_PER_RECORD = 32
#: The notes every rank keeps, per step, for the window's work columns (``monitor.note``).
WORK_NOTES = ("tokens", "samples")


@dataclass(slots=True)
class MonitorStats:
    """Counters of what the monitor did; read them, they are never reset.

    Attributes:
        records_sent: StepRecord datagrams handed to the kernel.
        send_dropped: datagrams dropped because the socket buffer was full (``EAGAIN``).
        send_errors: datagrams that failed otherwise (agent down: ``ECONNREFUSED``, no route...).
        windows: detection windows gathered.
        gather_errors: failed gathers (detection is switched off after the first).
        save_errors: windows that could not be appended to ``Config.windows_path``.
        internal_errors: the monitor's own bookkeeping failures (a bug; logged once).
        device_fallbacks: times the device clock was refused at construction (no CUDA, a
            model on several devices, a backend neither NCCL nor gloo, no event pool) or a
            step fell back to the CPU clock (a switched stream, a missing event); each reason
            is logged once.
        device_pending: steps whose device events were still pending at their window's
            gather (their device columns NaN, the CPU clock used).
        heartbeat: the heartbeat threads' counters (:class:`~laggard.integrations.heartbeat.
            HeartbeatStats`: datagrams, store writes and reads, bad keys, hangs reported);
            None with the heartbeat and the store exchange off.
        bad_notes: ``note("tokens" | "samples", value)`` calls whose value was not a finite
            number >= 0 (negative, NaN, infinite, a bool, not a number): ignored.
        gc: the GC timer's counters (:class:`~laggard.integrations.gc_timing.GcStats`:
            collections per generation, other threads' and between-step collections); None
            with ``Config(gc_timing=False)``.
    """

    records_sent: int = 0
    send_dropped: int = 0
    send_errors: int = 0
    windows: int = 0
    gather_errors: int = 0
    save_errors: int = 0
    internal_errors: int = 0
    device_fallbacks: int = 0
    device_pending: int = 0
    heartbeat: Any = None
    bad_notes: int = 0
    gc: Any = None


class TrainingMonitor:
    """Phase timers per step, StepRecords to the node agent, in-job straggler detection.

    Args:
        config: see :class:`TrainingMonitor.Config`; defaults when None.
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
            Participant`), after the built-in ones (straggler, link probe, trace, integrity);
            every rank must give the same ones in the same order.
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
        stats: :class:`MonitorStats`.
        findings: on rank 0, every finding raised so far (oldest first, at most 256).
        cleared: on rank 0, the findings that have cleared since (``Finding.cleared``).
        save_error: on rank 0, the first error that kept a window out of
            ``Config.windows_path`` (``"[Errno 28] No space left on device"``), "" if none;
            ``stats.save_errors`` counts them.
        windows: on rank 0, the last ``history_windows`` gathered
            :class:`~laggard.detectors.window.WindowRecord` s (their width-1 columns).
        participants: the hosted participants, in gather order.
        phase_clock: the clock the phases are timed on: ``"wall"``, ``"thread_cpu"`` or
            ``"device"`` (``"auto"`` resolved; ``"device"`` refused falls back to ``"wall"``).
        device_clock: the :class:`~laggard.integrations.device_clock.DeviceClock` on the
            device clock (its ``stats``), else None.
        peer_groups: the resolved :class:`~laggard.detectors.peer_groups.PeerGroups` (from
            ``mesh``, ``Config.peer_groups``, or every rank: ``source == "all"``).
    """

    @dataclass(kw_only=True, slots=True)
    class Config:
        """Configuration of :class:`TrainingMonitor`."""

        agent_address: str = DEFAULT_INTAKE_SOCKET
        """Where the node agent takes step records: its Unix socket (a path, or ``unix:PATH``;
        the default, falling back to UDP on ``127.0.0.1:9478`` when the socket is not there) or
        a UDP ``host:port``. ``$LAGGARD_INTAKE`` overrides it; an empty string sends nothing
        (``laggard.integrations.agent_socket``)."""

        run: str = ""
        """The training run's id on every StepRecord and WindowReport (the ``run`` label of the
        agent's series). Empty: ``$TORCHELASTIC_RUN_ID``, else ``$SLURM_JOB_ID`` (with
        ``.$SLURM_STEP_ID``), else one rank 0 makes; rank 0's is broadcast so every rank agrees
        (``laggard.integrations.run_identity``)."""

        window_steps: int = 20
        """K: steps per detection window (one ``all_gather`` every K steps)."""

        detect: bool = True
        """Gather windows and run the straggler detector; False sends step records only."""

        straggler: Any = None
        """``StragglerDetector.Config`` of the detector on rank 0; None for its defaults."""

        peer_groups: Sequence[Sequence[int]] | None = None
        """Ranks doing the same work, compared only with each other (a partition of
        ``range(world_size)``: every rank in exactly one group; checked at construction); a
        heavier group is a stage imbalance, not a straggler (docs/integrations.md, "Peer
        groups"). None: the ``mesh`` given to the monitor, else every rank in one group."""

        history_windows: int = 256
        """Window records rank 0 keeps (their width-1 columns: about ``R x 8`` float64 each)."""

        node: str = ""
        """``node`` of the StepRecords; defaults to the host name."""

        phase_clock: str = "auto"
        """What phases measure (docs/gpu.md): ``"wall"`` (``time.perf_counter``: on a GPU,
        the time the CPU took to *launch* the phase's kernels; the exposed collective wait is
        moved out of the phase it fell in), ``"thread_cpu"`` (``time.thread_time``, CPU
        seconds of the training thread: for CPU-only emulations whose ranks share cores, where
        wall time mostly measures the scheduler; nothing is moved), ``"device"`` (a pooled
        timing event on the current stream at each phase boundary, read without blocking,
        beside the wall clock; the detector ranks ``max(device, wall)`` per phase, and the
        window's device columns are gathered one window late), or ``"auto"``: ``"device"``
        when the job's tensors are on CUDA (``model`` on a CUDA device, a ``device`` module
        given, or ``torch.cuda`` initialised), else ``"wall"``. Step time and collective
        times stay wall time."""

        gc_timing: bool = True
        """Time the training thread's Python garbage collections (``gc.callbacks``,
        :mod:`laggard.integrations.gc_timing`; two clock reads per collection): each phase loses
        the collections that fell in it to a phase ``"gc"`` (on the CPU clocks), and the window
        gets ``gc_seconds`` and ``gc_generation``, from which a straggler slowed by its
        collections is reported as ``kind="gc"`` rather than as a slow GPU."""

        link_probe_bytes: int | None = None
        """Payload of the per-window link probe (``laggard.integrations.link_probe``): each
        rank times a round trip to its ring successor so rank 0 can name a slow link. None:
        256 KiB when a tracer is given, else off; 0: off."""

        link: Any = None
        """``laggard.detectors.link.LinkDetector.Config`` for rank 0; None for defaults."""

        windows_path: str = ""
        """On rank 0, append every gathered window to this file as one JSON line (step,
        ``stat_names``, per-rank values, scores, findings raised or cleared, and the values
        given to :meth:`TrainingMonitor.note`): what ``laggard report WINDOWS.jsonl --html``
        reads. Empty: nothing is written. A write error is counted and logged once."""

        integrity: Any = None
        """A ``laggard.integrations.integrity.GradientIntegrity`` whose window fingerprints ride
        in this gather (its ``integrity_words`` column, int64), checked on every rank so its
        policy acts alike everywhere; None: no integrity check."""

        device_pool_events: int = 1024
        """Timing events the device clock makes up front (never on the hot path). A step takes
        2 per phase, 1 per DDP model and 2 per FSDP2 wait point (4 per FSDP2 unit and step,
        about); a few steps are in flight at once. An empty pool leaves steps on the CPU clock,
        counted."""

        heartbeat_seconds: float = 1.0
        """Seconds between two heartbeat datagrams to the agent, sent by a daemon thread
        whatever the training thread does (:mod:`laggard.integrations.heartbeat`); 0: none."""

        hang_store_seconds: float = 2.0
        """Seconds between two writes of this rank's state to the job's ``torch.distributed``
        store, from which rank 0 names the ranks that hold a hung job up (its own daemon
        thread); 0: no in-job hang attribution."""

        hang_store_writes_per_second: float = 500.0
        """Store writes per second the job's ranks make together at most: in a job of more
        than ``hang_store_seconds x`` this many ranks the interval is ``world_size /`` it
        (16,384 ranks: 33 s)."""

        hang_seconds: float | None = None
        """A job whose ranks have all made no progress for this long, seconds, with ranks the
        hang rules name, is reported hung (rank 0: one ``laggard.hang`` log line, ``on_hang``);
        None: ``max(10, 5 x`` rank 0's typical step)."""

        on_hang: Callable[[Any], Any] | None = None
        """Called on rank 0, on the store thread, once per hang episode with a
        :class:`~laggard.integrations.heartbeat.HangReport` (verdict, step, seconds since
        progress, message); what it raises is counted and ignored."""

        def __post_init__(self) -> None:
            for name in ("heartbeat_seconds", "hang_store_seconds"):
                value = getattr(self, name)
                if not (value == 0 or 0.05 <= value <= 3600):
                    raise ValueError(f"{name} must be 0 (off) or in [0.05, 3600]")
            if not self.hang_store_writes_per_second > 0:
                raise ValueError("hang_store_writes_per_second must be > 0")
            if self.hang_seconds is not None and not self.hang_seconds > 0:
                raise ValueError("hang_seconds must be > 0 (or None)")
            if not 2 <= self.device_pool_events <= 1 << 20:
                raise ValueError("device_pool_events must be in [2, 2**20]")
            if self.agent_address:
                check_intake_target(self.agent_address)
            if not 2 <= self.window_steps <= 10_000:
                raise ValueError(f"window_steps {self.window_steps} outside [2, 10000]")
            if self.history_windows < 0:
                raise ValueError("history_windows must be >= 0")
            if self.link_probe_bytes is not None and not 0 <= self.link_probe_bytes <= 64 << 20:
                raise ValueError("link_probe_bytes must be in [0, 64 MiB]")
            if self.phase_clock not in PHASE_CLOCK_NAMES:
                raise ValueError(f"phase_clock must be one of {list(PHASE_CLOCK_NAMES)}")

    def __init__(
        self,
        config: TrainingMonitor.Config | None = None,
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
        self.config = config if config is not None else TrainingMonitor.Config()
        if mesh is not None and self.config.peer_groups is not None:
            raise ValueError("give the peer groups once: TrainingMonitor(mesh=...) or "
                             "Config(peer_groups=...), not both")
        self.comm_timer = comm_timer
        self.tracer = tracer
        self.stats = MonitorStats()
        self.findings: list[Finding] = []
        self.cleared: list[Finding] = []
        self.save_error = ""
        self.windows: collections.deque[WindowRecord] = collections.deque(
            maxlen=self.config.history_windows)
        dist_mod = _initialized_dist()
        self.rank = rank if rank is not None else (
            dist_mod.get_rank() if dist_mod else int(os.environ.get("RANK", 0)))
        self.world_size = world_size if world_size is not None else (
            dist_mod.get_world_size() if dist_mod else int(os.environ.get("WORLD_SIZE", 1)))
        env_local = os.environ.get("LOCAL_RANK")
        self.local_rank = local_rank if local_rank is not None else (
            int(env_local) if env_local is not None else None)
        self.node = self.config.node or socket.gethostname()
        self.peer_groups = (
            PeerGroups.from_mesh(mesh, self.world_size) if mesh is not None
            else PeerGroups.from_lists(self.config.peer_groups, self.world_size)
            if self.config.peer_groups is not None else PeerGroups.all(max(self.world_size, 1)))
        self.step_index = 0
        self._steps = np.zeros((len(STEP_COLUMNS), self.config.window_steps), dtype=np.float64)
        self._steps[[_STEP_ROWS[n] for n in ("compute_device_seconds",
                                             "collective_wait_device_seconds")]] = np.nan
        self._intervals: list[tuple[str, float, float]] = []
        #: Where the training thread is: (phase, perf_counter at entry), replaced whole by
        #: one assignment (the heartbeat thread reads it without a lock).
        self.where: tuple[str, float] = ("outside", time.perf_counter())
        self._heartbeat: Any = None
        self._gc: GcTimer | None = None
        self._gc_generation = -1  # the highest generation collected so far in this window
        self._work = dict.fromkeys(WORK_NOTES, math.nan)  # this step's noted work
        self._step_start = 0.0
        self._step_ctx = _StepContext(self)
        self._logged: set[str] = set()
        self._sock = self._open_socket()
        self._group = group
        self._own_group = False
        self._detect = self.config.detect and dist_mod is not None and self.world_size > 1
        if self._detect and group is None and dist_mod.get_backend() != "gloo":
            self._group = dist_mod.new_group(backend="gloo")
            self._own_group = True
        self.run = self._agree_run(dist_mod)
        self.device_clock: Any = None
        self._fsdp_markers: Any = None
        self.phase_clock = self._resolve_clock(device, model, dist_mod)
        self._device_id = _rank_device(model)
        self._clock = _PHASE_CLOCKS[self.phase_clock]
        if self.config.gc_timing:
            self._gc = _gc_timer(self, thread_cpu=self.phase_clock == "thread_cpu")
            self.stats.gc = self._gc.stats
        self._identities: list[tuple[str, int | None]] | None = None
        self._notes: dict[str, list[float]] = {}
        self._windows_file: Any = None
        self.participants = tuple(self._builtin_participants()) + tuple(participants)
        context = MonitorContext(
            rank=self.rank, world_size=self.world_size, node=self.node,
            local_rank=self.local_rank, window_steps=self.config.window_steps,
            group=lambda: self._group, log_once=self._log_once,
            count_error=self._internal_error)
        for participant in self.participants:
            participant.attach(context)
        self.layout = WindowLayout(
            STEP_COLUMNS + tuple(c for p in self.participants for c in p.columns))
        self._trace = self.participant("trace")
        self._start_heartbeat(dist_mod)

    def _start_heartbeat(self, dist_mod: Any) -> None:
        """Start the heartbeat threads (:mod:`laggard.integrations.heartbeat`); never
        raises."""
        cfg = self.config
        if cfg.heartbeat_seconds <= 0 and cfg.hang_store_seconds <= 0:
            return
        try:
            from laggard.integrations.heartbeat import HeartbeatThreads

            sock = self._sock
            self._heartbeat = HeartbeatThreads(
                self, rank=self.rank, world_size=self.world_size, run=self.run,
                node=self.node, send=sock.send if sock is not None else None,
                heartbeat_seconds=cfg.heartbeat_seconds,
                store_seconds=cfg.hang_store_seconds if dist_mod is not None else 0.0,
                writes_per_second=cfg.hang_store_writes_per_second,
                hang_seconds=cfg.hang_seconds, on_hang=cfg.on_hang).start()
            self.stats.heartbeat = self._heartbeat.stats
        except Exception as exc:  # noqa: BLE001 - no heartbeat, the job goes on
            self._internal_error("heartbeat", exc)

    def typical_step_seconds(self) -> float | None:
        """The median of this rank's recent step times (the last ``window_steps``), seconds;
        None before the first step. Safe from another thread (reads a few floats)."""
        count = min(self.step_index, self.config.window_steps)
        if count <= 0:
            return None
        values = self._steps[_STEP_ROWS["step_seconds"], :count]
        return float(np.median(values))

    def _resolve_clock(self, device: Any, model: Any, dist_mod: Any) -> str:
        """The phase clock to use; on the device clock, build it (never raises)."""
        wanted = self.config.phase_clock
        if wanted in ("wall", "thread_cpu"):
            return wanted
        try:
            devices = _model_devices(model)
            cuda_model = bool(devices) and all(d.startswith("cuda") for d in devices)
            if wanted == "auto":
                if not (device is not None or cuda_model or (
                        model is None and _cuda_initialized())):
                    return "wall"
            if len(devices) > 1:
                return self._refuse(f"the model is on several devices ({sorted(devices)})")
            if dist_mod is not None:
                backend = str(dist_mod.get_backend(
                    getattr(self.comm_timer, "process_group", None)))
                names = {part.rsplit(":", 1)[-1] for part in backend.split(",")}
                if not names <= _DEVICE_BACKENDS:
                    return self._refuse(f"backend {backend!r} is neither NCCL nor gloo")
            if device is None:
                from laggard.integrations.device_events import cuda_if_available

                device = cuda_if_available()
                if device is None:
                    return self._refuse("no CUDA device")
            from laggard.integrations.device_clock import DeviceClock

            self.device_clock = DeviceClock(device, window_steps=self.config.window_steps,
                                            pool_events=self.config.device_pool_events,
                                            log_once=self._log_once)
        except Exception as exc:  # noqa: BLE001 - a device clock that cannot start is refused
            return self._refuse(f"the device clock could not start ({exc!r})")
        if self.comm_timer is not None and hasattr(self.comm_timer, "attach_device_clock"):
            self.comm_timer.attach_device_clock(self.device_clock)
        if "torch.distributed.fsdp._fully_shard._fsdp_param_group" in sys.modules:
            from laggard.integrations.fsdp_device import FsdpStallMarkers

            self._fsdp_markers = FsdpStallMarkers(self.device_clock, log_once=self._log_once)
            self._fsdp_markers.install()
        return "device"

    def _refuse(self, reason: str) -> str:
        """Count and log once a refused device clock; the wall clock is used instead."""
        self.stats.device_fallbacks += 1
        self._log_once("device-refused", "laggard: phase_clock=%r: %s; phases are timed on "
                       "the wall clock instead (see docs/gpu.md)", self.config.phase_clock,
                       reason)
        return "wall"

    def _builtin_participants(self) -> list[Participant]:
        """Straggler detector; with a tracer, the link probe and the tracer's block (whose
        link detector reads the probe's column); the integrity check when configured."""
        out: list[Participant] = [StragglerParticipant(self.config.straggler,
                                                       peer_groups=self.peer_groups)]
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

    # ----------------------------------------------------------------- the training-loop API
    def step(self) -> _StepContext:
        """Context manager around one training step (reusable, not reentrant)."""
        return self._step_ctx

    def phase(self, name: str) -> _PhaseContext:
        """Context manager timing one phase of the current step.

        Args:
            name: ``data``, ``forward``, ``backward``, ``optimizer``, or a name of your own
                (at most 16 distinct names). A name used twice in a step adds up.
        """
        if self.device_clock is not None:
            return _DevicePhaseContext(self, name, self._clock, self.device_clock)
        return _PhaseContext(self, name, self._clock)

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
        if name in self._work:
            self._note_work(name, value)
            return
        if not self.config.windows_path or self.rank != 0:
            return
        try:
            values = self._notes.get(name)
            if values is None:
                if len(self._notes) >= 16:
                    return
                values = self._notes[name] = []
            value = float(value)
            if np.isfinite(value):
                values.append(value)
        except (TypeError, ValueError):
            return

    def _note_work(self, name: str, value: object) -> None:
        """Add a tokens or samples note to this step's sum; bad values counted, ignored."""
        try:
            if isinstance(value, bool):
                raise TypeError("a bool is not an amount of work")
            amount = float(value)  # type: ignore[arg-type]
            if not (math.isfinite(amount) and amount >= 0):
                raise ValueError(f"work must be a finite number >= 0, got {amount}")
        except Exception:  # noqa: BLE001 - e.g. a tensor of several elements: never raise
            self.stats.bad_notes += 1
            self._log_once("bad-note", "laggard: monitor.note(%r, %r) is not a finite number "
                           ">= 0: ignored (counted in stats.bad_notes)", name, value)
            return
        total = self._work[name]
        self._work[name] = amount if total != total else total + amount

    def close(self) -> None:
        """Close the socket and destroy the gather group this monitor created; take the FSDP2
        stall markers out. Never raises."""
        try:
            if self._gc is not None:
                self._gc.remove()
            if self._heartbeat is not None:  # first: it sends through the socket
                self._heartbeat.close()
                self._heartbeat = None
            if self._fsdp_markers is not None:
                self._fsdp_markers.uninstall()
                self._fsdp_markers = None
            self._close_windows_file()
            if self._sock is not None:
                self._sock.close()
                self._sock = None
            if self._own_group and self._group is not None:
                import torch.distributed as dist

                dist.destroy_process_group(self._group)
                self._group = None
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
        for name, value in times.columns().items():
            self._steps[_STEP_ROWS[name], column] = value
        self._record_gc_and_work(column, collected)
        self._steps[_STEP_ROWS["compute_cpu_seconds"], column] = times.compute_seconds
        if self.device_clock is not None:
            clock = self.device_clock
            before = clock.stats.stream_switches + clock.stats.untimed_steps
            clock.end_step(step, times)
            self.stats.device_fallbacks += (
                clock.stats.stream_switches + clock.stats.untimed_steps - before)
        if self._sock is not None:
            record = StepRecord(
                rank=self.rank, world_size=self.world_size, step=step,
                local_rank=self.local_rank, node=self.node, phases=times.phases,
                collective_wait_seconds=times.collective_wait_seconds,
                step_seconds=times.step_seconds,
                collectives=_capped(comm.collectives) if comm is not None else [],
                comm=comm.summary() if comm is not None else {},
                run=self.run, uuid=self._device_id.uuid if self._device_id else None,
                pci_bus_id=self._device_id.pci_bus_id if self._device_id else None,
            )
            self._send(record.encode())

    def _record_gc_and_work(self, column: int, collected: Any) -> None:
        """This step's ``gc_generation`` (the window's highest so far, for the column's "last"
        reduction) and its noted ``tokens`` / ``samples``."""
        if column == 0:
            self._gc_generation = -1
        generation = math.nan
        if collected is not None:
            self._gc_generation = max(self._gc_generation, collected.generation)
            generation = float(self._gc_generation)
        self._steps[_STEP_ROWS["gc_generation"], column] = generation
        for name, amount in self._work.items():
            self._steps[_STEP_ROWS[name], column] = amount
            self._work[name] = math.nan

    def _send(self, payload: bytes) -> None:
        try:
            self._sock.send(payload)  # type: ignore[union-attr]
            self.stats.records_sent += 1
        except BlockingIOError:
            self.stats.send_dropped += 1
        except OSError as exc:
            # ECONNREFUSED arrives here once the kernel has seen the agent's port closed
            self.stats.send_errors += 1
            self._log_once("send", "laggard: cannot send to agent %s: %s (counting, not "
                           "retrying)", self.config.agent_address, exc)

    def _agree_run(self, dist_mod: Any) -> str:
        """The run id every rank uses: rank 0's, broadcast over the gather group (a
        collective: every rank builds its monitor at the same point); without detection or a
        process group, what this rank's config and environment say ("" if nothing)."""
        resolved = resolve_run(self.config.run or None, os.environ)
        if dist_mod is None or self.world_size <= 1 or not self._detect:
            return resolved or ""
        try:
            return agree_run(resolved, dist_mod, self._group)
        except Exception as exc:  # noqa: BLE001 - a failed broadcast loses the id, not the job
            self._internal_error("run", exc)
            return resolved or ""

    def _open_socket(self) -> Any:
        if not self.config.agent_address:
            return None
        try:
            return AgentSocket(self.config.agent_address)
        except OSError as exc:
            self.stats.send_errors += 1
            self._log_once("socket", "laggard: no agent socket for %s: %s; step records off",
                           self.config.agent_address, exc)
            return None

    # ----------------------------------------------------------------------- per window
    def _gather_window(self, step: int) -> None:
        """Every rank: summarise the window, add the participants' columns, gather, analyse."""
        try:
            import torch
            import torch.distributed as dist

            if self._identities is None:
                identities: list[Any] = [None] * self.world_size
                dist.all_gather_object(identities, (self.node, self.local_rank),
                                       group=self._group)
                self._identities = [(node, lr) for node, lr in identities]
            values: dict[str, object] = dict(summarize_window(self._steps))
            if self.device_clock is not None:
                try:
                    # the previous window's device times (one window late; device_clock.py)
                    values.update(self.device_clock.window_values(step))
                    self.stats.device_pending = self.device_clock.stats.steps_pending
                except Exception as exc:  # noqa: BLE001 - the CPU clock's values go instead
                    self._internal_error("device", exc)
            for participant in self.participants:
                values.update(participant.contribute(step))
            local = torch.from_numpy(self.layout.pack(values))
            gathered = [torch.empty_like(local) for _ in range(self.world_size)]
            dist.all_gather(gathered, local, group=self._group)
            self.stats.windows += 1
        except Exception as exc:  # noqa: BLE001 - a failed gather switches detection off
            self.stats.gather_errors += 1
            self._detect = False
            self._log_once("gather", "laggard: window gather failed at step %d (%s); "
                           "straggler detection off", step, exc)
            return
        nodes = [node for node, _ in self._identities]
        local_ranks = [lr for _, lr in self._identities]
        record = WindowRecord(
            step=step, columns=self.layout.unpack(torch.stack(gathered).numpy()),
            ranks=np.arange(self.world_size, dtype=np.int64), world_size=self.world_size,
            nodes=nodes, local_ranks=None if any(lr is None for lr in local_ranks)
            else np.array(local_ranks, dtype=np.int64))
        self.analyse(record)

    def analyse(self, record: WindowRecord) -> list[Finding]:
        """Hand one gathered window to every participant and report what they found (public
        for tests: a record built by hand runs the same path).

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
        outcome = WindowOutcome()
        stop: StopJob | None = None
        for participant in self.participants:
            try:
                found = participant.on_window(record)
            except StopJob as exc:
                stop, found = exc, WindowOutcome(findings=exc.findings)
            except Exception as exc:  # noqa: BLE001 - one participant never stops the others
                self._internal_error(participant.name, exc)
                continue
            if found is None:
                continue
            outcome.findings += found.findings
            outcome.scores.update(found.scores)
            outcome.detector_stats.update(found.detector_stats)
            if stop is not None:
                break
        if self.rank == 0:
            try:
                self._report_window(record, outcome)
            except Exception as exc:  # noqa: BLE001
                self._internal_error("report", exc)
        if stop is not None:
            raise stop
        return outcome.findings

    def _report_window(self, record: WindowRecord, outcome: WindowOutcome) -> None:
        """Rank 0: log, keep, send and save one window's outcome."""
        for finding in outcome.findings:
            if finding.cleared:
                log.warning("laggard: %s (step %s)", finding.message, finding.step)
                self.cleared.append(finding)
            else:
                log.warning("laggard: %s: %s (step %s; %s)", _log_label(finding),
                            finding.message, finding.step, _evidence_text(finding.evidence))
                self.findings.append(finding)
        del self.findings[:-256], self.cleared[:-256]
        kept = record.scalars()
        self.windows.append(kept)
        if self._sock is not None:
            for report in _window_reports(record, outcome, self.run):
                self._send(report.encode())
        if self.config.windows_path:
            self._save_window(kept, outcome)

    def _save_window(self, kept: WindowRecord, outcome: WindowOutcome) -> None:
        """Append one window (its width-1 columns, ``kept``) to ``Config.windows_path`` as a
        JSON line (rank 0)."""
        notes = {name: float(np.mean(v)) for name, v in self._notes.items() if v}
        self._notes = {name: [] for name in self._notes}
        try:
            if self._windows_file is None:
                self._windows_file = open(self.config.windows_path, "a", encoding="utf-8")
            names = list(kept.columns)
            doc = {
                "step": kept.step, "world_size": self.world_size, "stat_names": names,
                # each rank's window value of each column (the medians of the step columns)
                "medians": [[v if np.isfinite(v) else None for v in row]
                            for row in kept.table(names).tolist()],
                "scores": {str(r): v for r, v in outcome.scores.items()},
                "findings": [f.to_dict() for f in outcome.findings],
                "notes": notes,
            }
            self._windows_file.write(json.dumps(doc) + "\n")
            # A full disk fails here, not in write(): the line sat in the file's buffer.
            self._windows_file.flush()
        except (OSError, TypeError, ValueError) as exc:
            self.stats.save_errors += 1
            self.save_error = self.save_error or str(exc)
            self._log_once("save", "laggard: cannot write the windows file %s: %s; windows "
                           "that cannot be written are counted (stats.save_errors), not "
                           "retried, and training goes on", self.config.windows_path, exc)
            if isinstance(exc, OSError):
                # Drop the unwritten bytes: the next window reopens the file and tries anew
                # with its own line, rather than after a stale, partly written buffer.
                self._close_windows_file(count=False)  # this window's error, counted above

    def _close_windows_file(self, count: bool = True) -> None:
        """Close the windows file; a flush that fails on close (a full disk) is counted as a
        save error (``count``), never raised."""
        file, self._windows_file = self._windows_file, None
        if file is None:
            return
        try:
            file.close()  # closed even when its final flush fails
        except OSError:
            self.stats.save_errors += count

    # ------------------------------------------------------------------------- helpers
    def _internal_error(self, where: str, exc: BaseException) -> None:
        self.stats.internal_errors += 1
        self._log_once(where, "laggard: monitor error in %s: %r (ignored; training goes on)",
                       where, exc)

    def _log_once(self, key: str, msg: str, *args: object) -> None:
        if key not in self._logged:
            self._logged.add(key)
            log.warning(msg, *args)


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


def _log_label(finding: Finding) -> str:
    """The word before a raised finding in rank 0's log: its detector, but ``stage imbalance``
    for a stage imbalance (the straggler detector's, and no rank is a straggler)."""
    return "stage imbalance" if finding.kind == "stage_imbalance" else finding.detector


def _evidence_text(evidence: dict[str, Any]) -> str:
    """A finding's evidence for a log line, in words (the record keeps every field).

    A straggler finding says how far its test got and against what noise; its slowdown is the
    message's own figure, so not repeated. Any other finding lists its scalar fields, numbers
    to four significant digits.
    """
    test, interval = evidence.get("evidence"), evidence.get("decision_interval")
    if isinstance(test, (int, float)) and isinstance(interval, (int, float)) and interval > 0:
        # the test's accumulated excess in units of its decision interval: raised at 1
        text = f"evidence {test / interval:.2f} of 1 decision interval"
        noise = evidence.get("noise")
        if isinstance(noise, (int, float)):
            text += f", rank-to-rank noise {100 * noise:.1f}% of a step's work"
        return text
    fields = []
    for key, value in evidence.items():
        if isinstance(value, bool) or value is None or isinstance(value, (dict, list, tuple)):
            continue
        shown = f"{value:.4g}" if isinstance(value, float) else str(value)
        fields.append(f"{key.replace('_', ' ')} {shown}")
    return "evidence: " + (", ".join(fields) if fields else "none")


class _StepContext:
    """``with monitor.step():`` (one object per monitor, reused every step)."""

    __slots__ = ("_monitor",)

    def __init__(self, monitor: TrainingMonitor) -> None:
        self._monitor = monitor

    def __enter__(self) -> _StepContext:
        self._monitor._begin_step()
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> bool:
        if exc_type is None:
            self._monitor._end_step()
        return False  # the training code's exception passes through


class _PhaseContext:
    """``with monitor.phase(name):``: appends ``(name, start, end)`` to the step's intervals
    and publishes ``monitor.where`` (the phase, then ``step`` again on exit) for the
    heartbeat."""

    __slots__ = ("_clock", "_intervals", "_monitor", "_name", "_start")

    def __init__(self, monitor: TrainingMonitor, name: str,
                 clock: Callable[[], float]) -> None:
        self._monitor = monitor
        self._intervals = monitor._intervals
        self._name = name
        self._clock = clock
        self._start = 0.0

    def __enter__(self) -> _PhaseContext:
        self._monitor.where = (self._name, time.perf_counter())
        self._start = self._clock()
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> bool:
        self._intervals.append((self._name, self._start, self._clock()))
        self._monitor.where = ("step", time.perf_counter())
        return False


class _DevicePhaseContext(_PhaseContext):
    """``with monitor.phase(name):`` on the device clock: an event on the current stream at
    each boundary, the wall clock beside it."""

    __slots__ = ("_device",)

    def __init__(self, monitor: TrainingMonitor, name: str,
                 clock: Callable[[], float], device: Any) -> None:
        super().__init__(monitor, name, clock)
        self._device = device

    def __enter__(self) -> _PhaseContext:
        self._monitor.where = (self._name, time.perf_counter())
        try:
            self._device.phase_mark("start", self._name)
        except Exception:  # noqa: BLE001 - a failed mark leaves the step untimed (counted)
            pass
        self._start = self._clock()
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> bool:
        end = self._clock()
        try:
            self._device.phase_mark("end", self._name)
        except Exception:  # noqa: BLE001
            pass
        self._intervals.append((self._name, self._start, end))
        self._monitor.where = ("step", time.perf_counter())
        return False


def _model_devices(model: Any) -> set[str]:
    """The device types and indices (``"cuda:0"``, ``"cpu"``) of a model's parameters and
    buffers (a module or a sequence of modules); empty for None."""
    if model is None:
        return set()
    modules = model if isinstance(model, (list, tuple)) else [model]
    out: set[str] = set()
    for module in modules:
        for tensor in itertools.chain(module.parameters(), module.buffers()):
            out.add(str(tensor.device))
    return out


def _cuda_initialized() -> bool:
    """True when torch is loaded and the job has initialised CUDA (its tensors are there)."""
    torch = sys.modules.get("torch")
    try:
        return torch is not None and bool(torch.cuda.is_initialized())
    except Exception:  # noqa: BLE001
        return False


def _rank_device(model: Any) -> Any:
    """This rank's CUDA device identity (UUID, PCI bus id) for the agent's
    ``laggard_rank_info``: the model's device, else the current CUDA device; None on CPU."""
    try:
        import torch
    except ImportError:
        return None
    try:
        if not torch.cuda.is_available():
            return None
        if model is not None:
            param = next(iter(model.parameters()), None)
            if param is not None and param.device.type == "cuda":
                return device_identity(param.device)
        return device_identity(torch.cuda.current_device())
    except Exception:  # noqa: BLE001 - identity is optional, never a failure
        return None


def _initialized_dist() -> Any:
    """``torch.distributed`` when a default process group exists, else None."""
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    return dist if dist.is_available() and dist.is_initialized() else None


def _capped(collectives: list[CollectiveTiming]) -> list[CollectiveTiming]:
    if len(collectives) <= _MAX_COLLECTIVES_PER_RECORD:
        return collectives
    # Too many buckets for one datagram: one entry per op, seconds and bytes summed.
    merged: dict[str, CollectiveTiming] = {}
    for c in collectives:
        m = merged.setdefault(c.op, CollectiveTiming(c.op, 0.0, 0))
        m.seconds += c.seconds
        m.bytes += c.bytes
    return list(merged.values())


def _window_reports(record: WindowRecord, outcome: WindowOutcome,
                    run: str = "") -> list[WindowReport]:
    """The WindowReport datagrams of one window: the scores (the highest
    :data:`MAX_REPORT_RANKS`), the job's collective means and the detector's counters in the
    first, the findings :data:`MAX_REPORT_FINDINGS` at a time (none is left out)."""
    scores = outcome.scores
    if len(scores) > MAX_REPORT_RANKS:
        top = sorted(scores, key=scores.__getitem__, reverse=True)[:MAX_REPORT_RANKS]
        scores = {r: scores[r] for r in top}
    docs = [f.to_dict() for f in outcome.findings]
    comm = {key: float(np.nanmean(values)) if (values := record.get(name)) is not None
            and np.isfinite(values).any() else 0.0
            for key, name in (("total_seconds", "collective_seconds"),
                              ("exposed_seconds", "collective_wait_seconds"),
                              ("bytes", "comm_bytes"))}
    world = record.world_size or int(record.ranks.size)
    reports = [WindowReport(step=record.step, world_size=world, scores=scores,
                            findings=docs[:MAX_REPORT_FINDINGS], comm=comm,
                            detector_stats=outcome.detector_stats, run=run)]
    for start in range(MAX_REPORT_FINDINGS, len(docs), MAX_REPORT_FINDINGS):
        reports.append(WindowReport(step=record.step, world_size=world, run=run,
                                    findings=docs[start:start + MAX_REPORT_FINDINGS]))
    return reports


__all__ = ["MonitorStats", "TrainingMonitor"]
