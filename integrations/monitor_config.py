"""The monitor's configuration and its counters: :class:`MonitorConfig` (torchtitan's pattern, a
dataclass with a docstring under every field, checked in ``__post_init__``) and
:class:`MonitorStats`. The monitor is :mod:`laggard.integrations.monitor`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from laggard.integrations.agent_socket import check_intake_target
from laggard.wire import DEFAULT_INTAKE_SOCKET, parse_address

#: Every accepted ``MonitorConfig.phase_clock`` (docs/gpu.md says what each measures).
PHASE_CLOCK_NAMES = ("auto", "device", "thread_cpu", "wall")


@dataclass(slots=True)
class MonitorStats:
    """Counters of what the monitor did (``TrainingMonitor.stats``); read them, they are never
    reset.

    Attributes:
        records_sent: records (step records, window reports) handed to the kernel; a batch
            counts its records.
        batches_sent: batch datagrams among them (several step records in one,
            ``agent_batch_seconds``).
        send_dropped: records dropped because the agent's queue stayed full (``EAGAIN``) past
            the sender's backlog of ``MAX_BACKLOG_DATAGRAMS`` (``integrations/agent_reports``);
            the agent counts them too (``laggard_intake_sender_dropped_total``).
        send_errors: records that failed otherwise (the agent's socket not there and no UDP
            fallback configured, ``ECONNREFUSED``, no route...).
        active_left_out: active findings left out of a window's reports to the agent (past
            ``agent_reports.MAX_ACTIVE_SENT``, or too large for a datagram), per window.
        windows: detection windows gathered.
        gather_errors: failed gathers (detection is switched off after the first).
        windows_analysed: gathered windows rank 0's analysis thread finished
            (:mod:`laggard.integrations.window_analysis`); on other ranks 0.
        windows_coalesced: gathered windows rank 0 never analysed: handed over while the
            previous was still analysed, and replaced in the one-slot queue by a newer one
            (their inline findings, e.g. integrity, are reported with the newer window's).
        analysis_seconds: wall seconds rank 0's analysis thread spent, in all (the
            participants and the report; not on the training thread).
        analysis_cpu_seconds: CPU seconds of that thread, in all: while it runs Python it
            holds the interpreter lock that rank 0's training thread needs, so rank 0 sends
            its share of each window in the ``monitor_cpu_seconds`` column and the blame
            detector holds it out of rank 0's blame (laggard's cost, not the rank's).
        bad_rows: on rank 0, gathered rows (rank, window) whose ``step_seconds`` is not a
            finite number >= 0: a rank that sent NaN or garbage; its values are left to the
            detectors, which skip them (counted at the gather, coalesced windows too).
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
    batches_sent: int = 0
    send_dropped: int = 0
    send_errors: int = 0
    active_left_out: int = 0
    windows: int = 0
    gather_errors: int = 0
    windows_analysed: int = 0
    windows_coalesced: int = 0
    analysis_seconds: float = 0.0
    analysis_cpu_seconds: float = 0.0
    bad_rows: int = 0
    save_errors: int = 0
    internal_errors: int = 0
    device_fallbacks: int = 0
    device_pending: int = 0
    heartbeat: Any = None
    bad_notes: int = 0
    gc: Any = None


@dataclass(kw_only=True, slots=True)
class MonitorConfig:
    """Configuration of :class:`~laggard.integrations.monitor.TrainingMonitor` (also reached as
    ``TrainingMonitor.Config``); every field is checked at construction.

    Raises:
        ValueError: a field out of its range (each field says its range), an intake target
            that is neither a socket path nor ``host:port``, a ``udp_fallback`` that is not
            ``host:port``, an unknown ``phase_clock``.
    """

    agent_address: str = DEFAULT_INTAKE_SOCKET
    """Where the node agent takes step records: the agent's socket, a Unix datagram socket (a
    path, or ``unix:PATH``; the default), or a UDP ``host:port``. ``$LAGGARD_INTAKE``
    overrides it; an empty string sends nothing (``laggard.integrations.agent_socket``). A
    socket that is not there is tried again with backoff (0.25 s doubling to 4 s) and
    returned to as soon as it is back."""

    udp_fallback: str = ""
    """A UDP ``host:port`` to send to while the agent's socket is unreachable (e.g. the
    agent's ``127.0.0.1:9478`` intake); ``$LAGGARD_UDP_FALLBACK`` overrides it. Empty (the
    default): none, records are counted as ``send_errors`` until the socket is back: any
    local user may bind a UDP port and read what a job sends there."""

    agent_batch_seconds: float = 0.25
    """Longest a step record waits to share one datagram with later steps' records (sent at
    once when the previous datagram left longer ago): in [0, 5] s; 0: one datagram a step
    (``laggard.integrations.agent_reports``). Batching keeps a node's ranks within the
    agent's socket queue (``net.unix.max_dgram_qlen``: 10 by the kernel's default)."""

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
    """Windows rank 0 keeps (``monitor.window_summaries``: C x 5 quantiles each, ~1 KB
    whatever the world size; ``laggard.integrations.window_history``). The latest of them
    are also kept in full in ``monitor.windows`` (their width-1 columns, an R x C float64
    table each: R ranks, C = the 16 step columns of ``laggard.detectors.window.STEP_COLUMNS``
    plus the participants' width-1 columns) within ``history_full_bytes``."""

    history_full_bytes: int = 32 << 20
    """Bytes the full windows of ``monitor.windows`` may take together (the latest is kept
    whatever its size): every one of ``history_windows`` up to ~1,000 ranks, the last 4 at
    65,536 ranks (~7.8 MB each)."""

    analysis_thread: bool = True
    """Rank 0 analyses and reports each gathered window on a thread of its own, behind a
    one-slot queue (``laggard.integrations.window_analysis``): its steps never wait for the
    analysis, findings come at most one window later, and a window gathered while two are
    pending is coalesced (counted in ``stats.windows_coalesced``). False: on the training
    thread, every window analysed before the next step (the job's steps wait for it): for
    tests and replays that must see every window."""

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

    host_context: bool = True
    """Add each rank's host to the window record (:mod:`laggard.integrations.host_context`:
    load per CPU, CPU pressure, steal, the rank's involuntary context switches; a few small
    ``/proc`` reads per window), so a whole-job slowdown on CPU-bound hosts says so before it
    guesses at storage or the fabric."""

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
    """Seconds between two hand-overs of this rank's state to its node's leader, which
    writes it to the job's ``torch.distributed`` store, from which rank 0 names the ranks
    that hold a hung job up (its own daemon thread); 0: no in-job hang attribution."""

    hang_store_writes_per_second: float = 500.0
    """Store writes per second the job's node leaders make together at most (one key per
    node, :mod:`laggard.integrations.heartbeat_node`): in a job of more than
    ``hang_store_seconds x`` this many nodes the interval is ``nodes /`` it (16,384 ranks in
    nodes of 8: 4.1 s)."""

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
        if self.udp_fallback:
            parse_address(self.udp_fallback)
        if not 0 <= self.agent_batch_seconds <= 5:
            raise ValueError("agent_batch_seconds must be in [0, 5]")
        if not 2 <= self.window_steps <= 10_000:
            raise ValueError(f"window_steps {self.window_steps} outside [2, 10000]")
        if self.history_windows < 0:
            raise ValueError("history_windows must be >= 0")
        if self.history_full_bytes < 0:
            raise ValueError("history_full_bytes must be >= 0")
        if self.link_probe_bytes is not None and not 0 <= self.link_probe_bytes <= 64 << 20:
            raise ValueError("link_probe_bytes must be in [0, 64 MiB]")
        if self.phase_clock not in PHASE_CLOCK_NAMES:
            raise ValueError(f"phase_clock must be one of {list(PHASE_CLOCK_NAMES)}")


__all__ = ["PHASE_CLOCK_NAMES", "MonitorConfig", "MonitorStats"]
