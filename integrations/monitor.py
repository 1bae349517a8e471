"""TrainingMonitor: times each training step's phases, reports them to the node agent, and names
the straggler rank from inside the job.

Per step, one :class:`~laggard.wire.StepRecord` UDP datagram goes to the node agent: fire
and forget on a non-blocking socket, so a missing, slow or crashed agent costs the job nothing but
a counted drop. Every ``window_steps`` steps all ranks exchange the medians of their per-step
statistics over the window with one ``all_gather`` (7 float64 per rank, whatever K), and
rank 0 runs the straggler detector on the gathered window, logs a finding once when it is raised
and once when it clears, and sends a :class:`~laggard.wire.WindowReport` to its agent.

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

Why one module of ~670 lines: :class:`TrainingMonitor` is the one object a training loop holds;
its phase timers, window gather and non-blocking sending share the per-rank window it fills.
The window's columns are :mod:`laggard.detectors.window`, the collective tracer
:mod:`laggard.integrations.tracer`.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from laggard.detectors.finding import Finding
from laggard.detectors.window import STAT, STAT_NAMES, detector_summaries, summarize_window
from laggard.wire import (
    DEFAULT_INTAKE_ADDRESS,
    MAX_REPORT_FINDINGS,
    MAX_REPORT_RANKS,
    CollectiveTiming,
    StepRecord,
    WindowReport,
    parse_address,
)

if TYPE_CHECKING:
    import torch.distributed as dist

    from laggard.integrations.comm_timing import CommTimer
    from laggard.integrations.tracer import CollectiveTracer

log = logging.getLogger(__name__)

#: Phase names that are not the rank's own compute.
_NOT_COMPUTE = frozenset({"data", "collective_wait"})
#: ``Config.phase_clock`` -> clock of the phase timers, in seconds.
_PHASE_CLOCKS: dict[str, Callable[[], float]] = {
    "wall": time.perf_counter,
    "thread_cpu": time.thread_time,
}
#: Per-step collective entries sent in one StepRecord; beyond it they are merged per op.
_MAX_COLLECTIVES_PER_RECORD = 32


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
    """

    records_sent: int = 0
    send_dropped: int = 0
    send_errors: int = 0
    windows: int = 0
    gather_errors: int = 0
    save_errors: int = 0
    internal_errors: int = 0


@dataclass(slots=True)
class WindowSummary:
    """Rank 0's view of one gathered window: per-rank medians of each statistic.

    Attributes:
        step: last step of the window.
        medians: ``(R, len(STAT_NAMES))`` float64, row r = rank r's median over the window's
            steps, columns as :data:`STAT_NAMES` (seconds; bytes for ``comm_bytes``).
        scores: the straggler detector's score per rank after this window.
    """

    step: int
    medians: np.ndarray
    scores: dict[int, float] = field(default_factory=dict)


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

    Raises:
        ValueError: an invalid configuration (raised here, before training starts).

    Attributes:
        stats: :class:`MonitorStats`.
        findings: on rank 0, every finding raised so far (oldest first, at most 256).
        cleared: on rank 0, the findings that have cleared since (same objects).
        windows: on rank 0, the last ``history_windows`` :class:`WindowSummary` objects.
    """

    @dataclass(kw_only=True, slots=True)
    class Config:
        """Configuration of :class:`TrainingMonitor`."""

        agent_address: str = DEFAULT_INTAKE_ADDRESS
        """``host:port`` of the node agent's UDP intake; empty string sends nothing."""

        window_steps: int = 20
        """K: steps per detection window (one ``all_gather`` every K steps)."""

        detect: bool = True
        """Gather windows and run the straggler detector; False sends step records only."""

        straggler: Any = None
        """``StragglerDetector.Config`` of the detector on rank 0; None for its defaults."""

        history_windows: int = 256
        """Window summaries rank 0 keeps (each ``R x 7`` float64)."""

        node: str = ""
        """``node`` of the StepRecords; defaults to the host name."""

        phase_clock: str = "wall"
        """What phases measure: ``"wall"`` (``time.perf_counter``; what a GPU job wants, and
        the exposed collective wait is moved out of the phase it fell in) or ``"thread_cpu"``
        (``time.thread_time``, CPU seconds of the training thread: for CPU-only emulations
        whose ranks share cores with each other and with other work, where wall time mostly
        measures the scheduler; a thread waiting on a collective uses no CPU, so nothing is
        moved). Step time and collective times stay wall time."""

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
        in this gather (its int64 vector as float64 words after the statistics), checked on every
        rank so its policy acts alike everywhere; None: no integrity check."""

        def __post_init__(self) -> None:
            if self.agent_address:
                parse_address(self.agent_address)
            if not 2 <= self.window_steps <= 10_000:
                raise ValueError(f"window_steps {self.window_steps} outside [2, 10000]")
            if self.history_windows < 0:
                raise ValueError("history_windows must be >= 0")
            if self.link_probe_bytes is not None and not 0 <= self.link_probe_bytes <= 64 << 20:
                raise ValueError("link_probe_bytes must be in [0, 64 MiB]")
            if self.phase_clock not in _PHASE_CLOCKS:
                raise ValueError(f"phase_clock must be one of {sorted(_PHASE_CLOCKS)}")

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
    ) -> None:
        self.config = config if config is not None else TrainingMonitor.Config()
        self.comm_timer = comm_timer
        self.tracer = tracer
        self.stats = MonitorStats()
        self.findings: list[Finding] = []
        self.cleared: list[Finding] = []
        self.windows: collections.deque[WindowSummary] = collections.deque(
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
        self.step_index = 0
        k = self.config.window_steps
        self._window = np.zeros((len(STAT_NAMES), k), dtype=np.float64)
        self._intervals: list[tuple[str, float, float]] = []
        self._step_start = 0.0
        self._step_ctx = _StepContext(self)
        self._clock = _PHASE_CLOCKS[self.config.phase_clock]
        self._logged: set[str] = set()
        self._sock = self._open_socket()
        self._group = group
        self._own_group = False
        self._detect = self.config.detect and dist_mod is not None and self.world_size > 1
        if self._detect and group is None and dist_mod.get_backend() != "gloo":
            self._group = dist_mod.new_group(backend="gloo")
            self._own_group = True
        self._identities: list[tuple[str, int]] | None = None
        self._group_keys: list[Any] = []
        self._notes: dict[str, list[float]] = {}
        self._windows_file: Any = None
        self._detector: Any = None
        if self._detect and self.rank == 0:
            self._detector = _make_detector(self.config.straggler)  # not in the first window
            min_ranks = self._detector.config.min_ranks
            if self.world_size < min_ranks:
                # The detector needs a majority to compare a rank against (and the user may
                # ask for more ranks than that). Say so once rather than report nothing.
                log.warning("laggard: straggler detection needs at least %d ranks; this job "
                            "has %d, so only step records are sent", min_ranks, self.world_size)
        self._trace = _trace_extension(self) if tracer is not None else None

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
        return _PhaseContext(self._intervals, name, self._clock)

    def note(self, name: str, value: float) -> None:
        """Record a value of the training loop (e.g. ``loss``) for the saved windows: rank 0
        writes each name's mean over the window beside the window's statistics
        (:attr:`Config.windows_path`). Cheap, never raises; ignored without a windows path.

        Args:
            name: the value's name (at most 16 distinct names are kept).
            value: a float (NaN and infinities are dropped).
        """
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

    def close(self) -> None:
        """Close the socket and destroy the gather group this monitor created. Never raises."""
        try:
            if self._windows_file is not None:
                self._windows_file.close()
                self._windows_file = None
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
        self._intervals.clear()
        self._step_start = time.perf_counter()

    def _end_step(self) -> None:
        end = time.perf_counter()
        step = self.step_index
        self.step_index += 1  # first, so every rank's window count stays in lock step
        try:
            self._record_step(step, end)
        except Exception as exc:  # noqa: BLE001 - never raise into the training loop
            self._internal_error("step", exc)
        if self._detect and self.step_index % self.config.window_steps == 0:
            self._gather_window(step)

    def _record_step(self, step: int, end: float) -> None:
        comm: Any = self.comm_timer.take_step() if self.comm_timer is not None else None
        if self._trace is not None:
            traced = self._trace.take_step(step)
            comm = comm if comm is not None else traced
        exposed = getattr(comm, "exposed_interval", None)
        if self._clock is not time.perf_counter:
            exposed = None  # other clocks do not advance while the thread waits
        phases: dict[str, float] = {}
        for name, start, stop in self._intervals:
            seconds = stop - start
            if exposed is not None:
                # DDP waits for the collectives inside backward(): move that wait out of the
                # phase it fell in, so phases measure this rank's own work.
                seconds -= max(0.0, min(stop, exposed[1]) - max(start, exposed[0]))
            phases[name] = phases.get(name, 0.0) + max(0.0, seconds)
        step_seconds = end - self._step_start
        if comm is not None:
            wait = comm.exposed_seconds
        else:
            wait = phases.pop("collective_wait", 0.0)
        data = phases.get("data", 0.0)
        compute = (sum(v for k, v in phases.items() if k not in _NOT_COMPUTE) if phases
                   else max(0.0, step_seconds - wait))
        if comm is not None and exposed is None and self._clock is time.perf_counter:
            # blocking collectives (FSDP2 on gloo) sat inside the wall-clock phases
            compute = max(0.0, compute - (wait if self.comm_timer is None else 0.0))
        column = step % self.config.window_steps
        w = self._window
        w[STAT["compute_seconds"], column] = compute
        w[STAT["data_seconds"], column] = data
        w[STAT["collective_wait_seconds"], column] = wait
        w[STAT["transfer_seconds"], column] = np.nan
        w[STAT["collective_seconds"], column] = comm.total_seconds if comm is not None else wait
        w[STAT["step_seconds"], column] = step_seconds
        w[STAT["comm_bytes"], column] = comm.bytes if comm is not None else 0
        w[STAT["link_probe_seconds"], column] = np.nan  # set for the window at the gather
        if self._sock is not None:
            record = StepRecord(
                rank=self.rank, world_size=self.world_size, step=step,
                local_rank=self.local_rank, node=self.node, phases=phases,
                collective_wait_seconds=wait, step_seconds=step_seconds,
                collectives=_capped(comm.collectives) if comm is not None else [],
                comm=comm.summary() if comm is not None else {},
            )
            self._send(record.encode())

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

    def _open_socket(self) -> socket.socket | None:
        if not self.config.agent_address:
            return None
        try:
            host, port = parse_address(self.config.agent_address)
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_DGRAM)
            sock.setblocking(False)
            # connect() on UDP only fixes the peer (no handshake); it lets send() report an
            # agent that is down (ECONNREFUSED) so it can be counted.
            sock.connect((host, port))
            return sock
        except OSError as exc:
            self.stats.send_errors += 1
            self._log_once("socket", "laggard: no agent socket for %s: %s; step records off",
                           self.config.agent_address, exc)
            return None

    # ----------------------------------------------------------------------- per window
    def _gather_window(self, step: int) -> None:
        integrity = self.config.integrity
        try:
            import torch
            import torch.distributed as dist

            if self._identities is None:
                identities: list[Any] = [None] * self.world_size
                keys = self._trace.group_keys() if self._trace is not None else []
                dist.all_gather_object(identities, (self.node, self.local_rank, keys),
                                       group=self._group)
                self._identities = [(node, lr) for node, lr, _ in identities]
                self._group_keys = [k for _, _, k in identities]
            # Per-rank medians over the window: a fixed len(STAT_NAMES) float64 per rank,
            # whatever K, robust to one slow step (a garbage-collection pause).
            if self._trace is not None:
                self._window[STAT["link_probe_seconds"]] = self._trace.probe(self._group)
            local = torch.from_numpy(window_medians(self._window))
            if self._trace is not None:
                local = torch.cat([local, torch.from_numpy(self._trace.window.vector())])
            if integrity is not None:
                local = torch.cat([local, integrity.window_vector().view(torch.float64)])
            gathered = [torch.empty_like(local) for _ in range(self.world_size)]
            dist.all_gather(gathered, local, group=self._group)
            self.stats.windows += 1
        except Exception as exc:  # noqa: BLE001 - a failed gather switches detection off
            self.stats.gather_errors += 1
            self._detect = False
            self._log_once("gather", "laggard: window gather failed at step %d (%s); "
                           "straggler detection off", step, exc)
            return
        matrix = torch.stack(gathered)
        extra = len(STAT_NAMES) + (self._trace.size if self._trace is not None else 0)
        if integrity is not None:
            from laggard.integrations.integrity import IntegrityError

            try:
                found = integrity.check_window(
                    matrix[:, extra:].contiguous().view(torch.int64))
            except IntegrityError as exc:  # policy "raise": report it, then stop the job
                self._report_integrity(step, exc.findings)
                raise
            self._report_integrity(step, found)
        if self.rank == 0:
            try:
                self.analyse_window(step, matrix[:, :len(STAT_NAMES)].numpy())
                if self._trace is not None:
                    self._trace.analyse(
                        step, matrix[:, len(STAT_NAMES):extra].numpy(), self._group_keys,
                        edge_seconds=matrix[:, STAT["link_probe_seconds"]].numpy())
            except Exception as exc:  # noqa: BLE001
                self._internal_error("detector", exc)

    def _report_integrity(self, step: int, findings: list[Finding]) -> None:
        """Rank 0 sends gradient-integrity findings to its agent (laggard_findings_total)."""
        if findings and self.rank == 0 and self._sock is not None:
            docs = [f.to_dict() for f in findings[:MAX_REPORT_FINDINGS]]
            self._send(WindowReport(step=step, world_size=self.world_size, findings=docs).encode())

    def analyse_window(self, step: int, medians: np.ndarray) -> list[Finding]:
        """Run the straggler detector on one gathered window (rank 0's part; public for tests).

        Logs each finding once when raised and once when cleared, appends a
        :class:`WindowSummary`, and sends a WindowReport to the agent.

        Args:
            step: last step of the window.
            medians: ``(R, len(STAT_NAMES))`` float64, row r = rank r's
                :func:`window_medians`.

        Returns:
            The findings raised or cleared in this window (cleared ones carry
            ``evidence["cleared"] = True``).
        """
        from laggard.detectors.straggler import RankWindow

        if self._detector is None:
            self._detector = _make_detector(self.config.straggler)
        ranks = medians.shape[0]
        identities = self._identities or [(self.node, None)] * ranks
        window = RankWindow.from_summaries(
            step=step,
            ranks=np.arange(ranks, dtype=np.int64),
            summaries=detector_summaries(medians),
            world_size=self.world_size,
            nodes=[node for node, _ in identities],
            local_ranks=None if any(lr is None for _, lr in identities)
            else np.array([lr for _, lr in identities], dtype=np.int64),
        )
        findings = list(self._detector.update(window))
        for finding in findings:
            if finding.evidence.get("cleared"):
                log.warning("laggard: %s (step %s)", finding.message, finding.step)
                self.cleared.append(finding)
            else:
                log.warning("laggard: straggler: %s (step %s; evidence %s)", finding.message,
                            finding.step, finding.evidence)
                self.findings.append(finding)
        del self.findings[:-256], self.cleared[:-256]
        scores = {int(r): float(v) for r, v in self._detector.scores.items()}
        self.windows.append(WindowSummary(step, medians.copy(), scores))
        if self._sock is not None:
            self._send_report(step, medians, scores, findings)
        if self.config.windows_path:
            self._save_window(step, medians, scores, findings)
        return findings

    def _save_window(self, step: int, medians: np.ndarray, scores: dict[int, float],
                     findings: list[Finding]) -> None:
        """Append one window to ``Config.windows_path`` as a JSON line (rank 0)."""
        notes = {name: float(np.mean(v)) for name, v in self._notes.items() if v}
        self._notes = {name: [] for name in self._notes}
        try:
            if self._windows_file is None:
                self._windows_file = open(self.config.windows_path, "a", encoding="utf-8")
            doc = {
                "step": step, "world_size": self.world_size, "stat_names": list(STAT_NAMES),
                "medians": [[v if np.isfinite(v) else None for v in row]
                            for row in medians.tolist()],
                "scores": {str(r): v for r, v in scores.items()},
                "findings": [{**f.to_dict(), "cleared": bool(f.evidence.get("cleared"))}
                             for f in findings],
                "notes": notes,
            }
            self._windows_file.write(json.dumps(doc) + "\n")
            self._windows_file.flush()
        except (OSError, TypeError, ValueError) as exc:
            self.stats.save_errors += 1
            self._log_once("save", "laggard: cannot save windows to %s: %s (counting, not "
                           "retrying)", self.config.windows_path, exc)

    def _send_report(self, step: int, medians: np.ndarray, scores: dict[int, float],
                     findings: list[Finding]) -> None:
        if len(scores) > MAX_REPORT_RANKS:
            top = sorted(scores, key=scores.__getitem__, reverse=True)[:MAX_REPORT_RANKS]
            scores = {r: scores[r] for r in top}
        docs = []
        for finding in findings[:MAX_REPORT_FINDINGS]:
            doc = finding.to_dict()
            if finding.evidence.get("cleared"):
                doc["cleared"] = True
            docs.append(doc)
        job = medians[:, [STAT["collective_seconds"], STAT["collective_wait_seconds"],
                          STAT["comm_bytes"]]].mean(axis=0)
        report = WindowReport(
            step=step, world_size=self.world_size, scores=scores, findings=docs,
            comm={"total_seconds": float(job[0]), "exposed_seconds": float(job[1]),
                  "bytes": float(job[2])},
            detector_stats={k: int(v) for k, v in self._detector.stats.items()},
        )
        self._send(report.encode())

    # ------------------------------------------------------------------------- helpers
    def _internal_error(self, where: str, exc: BaseException) -> None:
        self.stats.internal_errors += 1
        self._log_once(where, "laggard: monitor error in %s: %r (ignored; training goes on)",
                       where, exc)

    def _log_once(self, key: str, msg: str, *args: object) -> None:
        if key not in self._logged:
            self._logged.add(key)
            log.warning(msg, *args)


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
    """``with monitor.phase(name):``: appends ``(name, start, end)`` to the step's intervals."""

    __slots__ = ("_clock", "_intervals", "_name", "_start")

    def __init__(self, intervals: list[tuple[str, float, float]], name: str,
                 clock: Callable[[], float]) -> None:
        self._intervals = intervals
        self._name = name
        self._clock = clock
        self._start = 0.0

    def __enter__(self) -> _PhaseContext:
        self._start = self._clock()
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> bool:
        self._intervals.append((self._name, self._start, self._clock()))
        return False


def _trace_extension(monitor: TrainingMonitor) -> Any:
    from laggard.integrations.trace_window import TraceExtension

    return TraceExtension(monitor)


def _make_detector(config: Any) -> Any:
    # imported here: numpy-heavy detector code is loaded only where detection runs
    from laggard.detectors.straggler import StragglerDetector

    return StragglerDetector(config)


def _initialized_dist() -> Any:
    """``torch.distributed`` when a default process group exists, else None."""
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    return dist if dist.is_available() and dist.is_initialized() else None


def window_medians(window: np.ndarray) -> np.ndarray:
    """One rank's summary of a window: each column reduced over its K steps
    (:func:`laggard.detectors.window.summarize_window`).

    Args:
        window: ``(len(STAT_NAMES), K)`` float64 per-step statistics.

    Returns:
        ``(len(STAT_NAMES),)`` float64; ``transfer_seconds`` is NaN (not measured).
    """
    return summarize_window(window)


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


__all__ = ["STAT_NAMES", "MonitorStats", "TrainingMonitor", "WindowSummary", "window_medians"]
