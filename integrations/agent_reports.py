"""What the monitor sends its node agent: a StepRecord per step, WindowReports per window.

Every datagram goes through the agent's socket (:mod:`laggard.integrations.agent_socket`: a
Unix datagram socket by default; UDP only where configured): fire and forget on a
non-blocking socket, so a missing, slow or crashed agent costs the job nothing but counted
records (``MonitorStats.records_sent``, ``send_dropped``, ``send_errors``).

Step records sent to the agent's Unix socket are batched (:func:`laggard.wire.encode_batch`;
over UDP, whose queue counts bytes, not datagrams, each goes at once): a step whose previous
datagram left more than ``batch_seconds`` ago goes at once (a slow job's records are not delayed);
faster steps wait in one batch until ``batch_seconds`` passed, it would outgrow
:data:`~laggard.wire.MAX_DATAGRAM_BYTES`, or a window report or ``close()`` follows. A node's
ranks then send a few datagrams a second each, far below the agent's queue
(``net.unix.max_dgram_qlen``, 10 datagrams by the kernel's default). A datagram the queue
refuses (``EAGAIN``) is kept, up to :data:`MAX_BACKLOG_DATAGRAMS`, and sent first at the next
step; only what overflows that is dropped: counted in ``send_dropped``, told to the agent in
the next batch's header, and said once in the job's log as a warning with the cure. Nothing of
this blocks the training thread. A datagram is bounded:
a step's collectives are merged per op beyond :data:`MAX_COLLECTIVES_PER_RECORD`, a window's
findings are chunked :data:`~laggard.wire.MAX_REPORT_FINDINGS` to a report and its scores cut
to the highest :data:`~laggard.wire.MAX_REPORT_RANKS`.

Rank 0's verdict is sent as a level, not an edge: every window's reports carry the findings that
still hold (``WindowReport.active``, at most :data:`MAX_ACTIVE_SENT` a window, each datagram
under :data:`~laggard.wire.MAX_DATAGRAM_BYTES`; what does not fit is counted in
``MonitorStats.active_left_out``), so an agent restarted mid-run has the run's verdict back
within one window; clears are still sent once. :meth:`AgentReports.send_end` sends the run's end
(``WindowReport.end``) from ``close()``, and the agent ends the run's findings at once.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from laggard.detectors.window import WindowRecord
from laggard.integrations.agent_socket import AgentSocket
from laggard.integrations.participants import WindowOutcome
from laggard.integrations.phases import StepTimes
from laggard.wire import (
    MAX_BATCH_ITEMS,
    MAX_DATAGRAM_BYTES,
    MAX_REPORT_FINDINGS,
    MAX_REPORT_RANKS,
    CollectiveTiming,
    StepRecord,
    WindowReport,
    encode_batch,
)

#: Per-step collective entries sent in one StepRecord; beyond it they are merged per op.
MAX_COLLECTIVES_PER_RECORD = 32
#: Most active findings sent a window (two datagrams of :data:`~laggard.wire.MAX_REPORT_FINDINGS`):
#: a job holds a few (one per slow rank and kind); past it the most severe, then the oldest, go.
MAX_ACTIVE_SENT = 2 * MAX_REPORT_FINDINGS
#: Detectors whose findings hold until their detector clears them (``Finding.clear``), so they
#: are sent as active: the straggler's (stage imbalance included) and the link's. An integrity
#: finding is an event (a corrupt step), raised once and never cleared: not held.
HELD_DETECTORS = frozenset({"straggler", "link"})
_SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}
#: Default ``batch_seconds``: the longest a step record waits in its batch. 0.25 s keeps a
#: node of 8 ranks at ~32 step datagrams a second, so the kernel's default queue of 10 holds
#: ~0.3 s of the agent not being scheduled.
BATCH_SECONDS = 0.25
#: Bytes a batch's header line takes at most (run id of 64, rank and counts of 16 digits).
_BATCH_HEADER_BYTES = 192
#: Datagrams kept while the agent's queue is full (``EAGAIN``), sent first at the next step;
#: the oldest beyond it is dropped (counted). 8 batches of <= 8 KiB: ~1-2 s of a fast rank.
MAX_BACKLOG_DATAGRAMS = 8
#: Seconds after the first drop before the job's log says how many were dropped (once).
DROP_WARNING_DELAY_SECONDS = 1.0
#: Seconds ``close()`` waits at most for the agent's queue to take what is left.
CLOSE_DRAIN_SECONDS = 0.2


class AgentReports:
    """The monitor's sender to its node agent; never raises.

    Args:
        address: ``MonitorConfig.agent_address`` (empty: nothing is sent).
        stats: the monitor's :class:`~laggard.integrations.monitor_config.MonitorStats`, whose
            ``records_sent``, ``batches_sent``, ``send_dropped`` and ``send_errors`` this
            counts into (records, a batch counting its records).
        log_once: ``(key, msg, *args)``, the monitor's once-only log (WARNING).
        rank, world_size, local_rank, node, run: this rank's fields on every StepRecord.
        device_id: this rank's CUDA identity (``uuid``, ``pci_bus_id``), or None on CPU.
        udp_fallback: ``MonitorConfig.udp_fallback`` (empty: no UDP while the socket is away).
        batch_seconds: ``MonitorConfig.agent_batch_seconds``, the longest a step record waits
            in its batch (0: every record at once).
        clock: monotonic clock, seconds (tests pass a fake one).

    Attributes:
        sock: the :class:`~laggard.integrations.agent_socket.AgentSocket`, or None (no
            address, or it could not be opened: counted in ``send_errors``, logged once).
    """

    def __init__(self, address: str, *, stats: Any, log_once: Callable[..., Any], rank: int,
                 world_size: int, local_rank: int | None, node: str, run: str,
                 device_id: Any, udp_fallback: str = "", batch_seconds: float = BATCH_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.address = address
        self._stats = stats
        self._log_once = log_once
        self._rank_fields = dict(
            rank=rank, world_size=world_size, local_rank=local_rank, node=node, run=run,
            uuid=device_id.uuid if device_id else None,
            pci_bus_id=device_id.pci_bus_id if device_id else None)
        self.run = run
        self.world_size = world_size
        #: held key -> the finding's latest raised dict, oldest raise first (see
        #: :func:`held_key`); cleared ones removed.
        self.active: dict[tuple[Any, ...], dict[str, Any]] = {}
        self._last_step = 0
        self._rank = rank
        self._batch_seconds = batch_seconds
        self._clock = clock
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._last_flush = -float("inf")
        self._backlog: deque[tuple[bytes, int]] = deque()
        self._warn_at: float | None = None
        #: The batch and the backlog are filled by the training thread (step records) and
        #: rank 0's analysis thread (window reports); held only around non-blocking sends.
        self._lock = threading.Lock()
        self.sock: Any = None
        if address:
            try:
                self.sock = AgentSocket(address, udp_fallback=udp_fallback, log_change=log_once)
            except OSError as exc:
                stats.send_errors += 1
                log_once("socket", "laggard: no agent socket for %s: %s; step records off",
                         address, exc)

    def send_step(self, step: int, times: StepTimes, comm: Any) -> None:
        """Batch one step's StepRecord, and send what is due (nothing without a socket).

        Args:
            step: the step's index.
            times: its phases and collective wait, seconds.
            comm: its collectives (a CommTimer's or the tracer's step: ``collectives``,
                ``summary()``), or None.
        """
        if self.sock is None:
            return
        record = StepRecord(
            step=step, phases=times.phases,
            collective_wait_seconds=times.collective_wait_seconds,
            step_seconds=times.step_seconds,
            collectives=capped(comm.collectives) if comm is not None else [],
            comm=comm.summary() if comm is not None else {},
            **self._rank_fields).encode()
        with self._lock:
            self._batch_step(record)

    def _batch_step(self, record: bytes) -> None:
        now = self._clock()
        if self._pending and self._pending_bytes + len(record) + 1 > _BATCH_BUDGET:
            self._seal(now)
        self._pending.append(record)
        self._pending_bytes += len(record) + 1
        # Batched where the queue counts datagrams (a Unix socket: net.unix.max_dgram_qlen);
        # a UDP intake's queue counts bytes (the agent asks for 1 MiB): one datagram a step.
        wait = self._batch_seconds if getattr(self.sock, "target", "").startswith("unix:") \
            else 0.0
        if len(self._pending) >= MAX_BATCH_ITEMS or now - self._last_flush >= wait:
            self._seal(now)
        self._drain()
        if self._warn_at is not None and now >= self._warn_at:
            self._warn_dropped()

    def send_window(self, record: WindowRecord, outcome: WindowOutcome) -> None:
        """Send one window's WindowReports, after the steps batched before them: its scores and
        findings, then the findings that still hold (nothing is sent without a socket; the held
        ones are tracked all the same)."""
        self._last_step = record.step
        note_held(self.active, [f.to_dict() for f in outcome.findings])
        if self.sock is None:
            return
        # encoded outside the lock (rank 0's analysis thread): the training thread's
        # send_step waits at most for the non-blocking sends below
        payloads = [report.encode() for report in window_reports(record, outcome, self.run)]
        reports, left_out = active_reports(list(self.active.values()), step=record.step,
                                           world_size=self._world(record), run=self.run)
        payloads += [report.encode() for report in reports]
        with self._lock:
            self._seal(self._clock())
            for payload in payloads:
                self._enqueue(payload, 1)
            self._drain()
        if left_out:
            self._stats.active_left_out += left_out
            self._log_once("active-left-out", "laggard: %d active findings did not fit in a "
                           "window's reports to the agent (counted in stats.active_left_out; "
                           "more are left out each window they hold)", left_out)

    def send_end(self) -> None:
        """Tell the agent the run ended (``WindowReport.end``): it ends the run's active
        findings at once. Sent by the rank that sends the windows (rank 0), from ``close()``,
        after the steps still batched."""
        if self.sock is None:
            return
        self.send(WindowReport(step=self._last_step, world_size=max(self.world_size, 1),
                               run=self.run, end=True).encode())

    def _world(self, record: WindowRecord) -> int:
        return record.world_size or int(record.ranks.size)

    def send(self, payload: bytes) -> None:
        """Send one datagram now, after the batched ones (nothing without a socket)."""
        if self.sock is None:
            return
        with self._lock:
            self._seal(self._clock())
            self._enqueue(payload, 1)
            self._drain()

    def flush(self) -> None:
        """Send the batched step records now (what the agent's queue refuses stays queued)."""
        if self.sock is not None:
            with self._lock:
                self._seal(self._clock())
                self._drain()

    def _seal(self, now: float) -> None:
        """Close the batch being filled into one datagram on the backlog."""
        self._last_flush = now
        items, self._pending, self._pending_bytes = self._pending, [], 0
        if not items:
            return
        payload = items[0] if len(items) == 1 else encode_batch(
            items, run=self.run, rank=self._rank, dropped=self._stats.send_dropped)
        self._enqueue(payload, len(items))

    def _enqueue(self, payload: bytes, records: int) -> None:
        self._backlog.append((payload, records))
        if len(self._backlog) > MAX_BACKLOG_DATAGRAMS:
            _, lost = self._backlog.popleft()
            self._dropped(lost)

    def _drain(self) -> None:
        """Send the backlog in order until the agent's queue is full; never blocks."""
        while self._backlog:
            payload, records = self._backlog[0]
            try:
                self.sock.send(payload)
            except BlockingIOError:
                return  # kept: sent first next time
            except OSError as exc:
                self._backlog.popleft()
                # No target (the socket gone, no fallback) or a refused send: counted, the
                # socket is tried again with backoff by AgentSocket.
                self._stats.send_errors += records
                self._log_once("send", "laggard: cannot send to the agent at %s: %s "
                               "(counting, retrying with backoff)", self._target(), exc)
                continue
            self._backlog.popleft()
            self._stats.records_sent += records
            self._stats.batches_sent += records > 1

    def _dropped(self, records: int) -> None:
        self._stats.send_dropped += records
        if self._warn_at is None:
            self._warn_at = self._clock() + DROP_WARNING_DELAY_SECONDS

    def _warn_dropped(self) -> None:
        self._warn_at = float("inf")
        self._log_once(
            "dropped", "laggard: %d records dropped at the agent's socket %s so far: its queue "
            "was full (a Unix datagram socket queues net.unix.max_dgram_qlen datagrams, 10 by "
            "the kernel's default). Cure: sysctl -w net.unix.max_dgram_qlen=512 on the node, "
            "then restart the agent (MonitorStats.send_dropped counts them all)",
            self._stats.send_dropped, self._target())

    def _target(self) -> str:
        """Where records go now (the socket's own words), else what it was configured as."""
        return (getattr(self.sock, "target", "") or getattr(self.sock, "wanted", "")
                or self.address)

    def close(self) -> None:
        """Send what is batched (waiting :data:`CLOSE_DRAIN_SECONDS` at most for the agent's
        queue), count what is left as dropped, and close the socket (idempotent)."""
        if self.sock is not None:
            self.flush()
            deadline = self._clock() + CLOSE_DRAIN_SECONDS
            while self._backlog and self._clock() < deadline:
                time.sleep(0.005)
                self._drain()
            while self._backlog:
                self._dropped(self._backlog.popleft()[1])
            if self._warn_at is not None and self._warn_at != float("inf"):
                self._warn_dropped()
        sock, self.sock = self.sock, None
        if sock is not None:
            sock.close()


#: Bytes of records one batch holds: the datagram limit less its header line.
_BATCH_BUDGET = MAX_DATAGRAM_BYTES - _BATCH_HEADER_BYTES


def capped(collectives: list[CollectiveTiming]) -> list[CollectiveTiming]:
    """A step's collectives, merged per op (seconds and bytes summed) when there are more
    than :data:`MAX_COLLECTIVES_PER_RECORD`: one datagram holds them."""
    if len(collectives) <= MAX_COLLECTIVES_PER_RECORD:
        return collectives
    merged: dict[str, CollectiveTiming] = {}
    for c in collectives:
        m = merged.setdefault(c.op, CollectiveTiming(c.op, 0.0, 0))
        m.seconds += c.seconds
        m.bytes += c.bytes
    return list(merged.values())


def window_reports(record: WindowRecord, outcome: WindowOutcome,
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


def held_key(doc: dict[str, Any]) -> tuple[Any, ...]:
    """What a held finding is about, so its clear is matched to it: detector, kind, rank,
    node, GPU, subject and its evidence's process group and link (:meth:`Finding.clear` keeps
    them all)."""
    evidence = doc.get("evidence")
    evidence = evidence if isinstance(evidence, dict) else {}
    return (doc.get("detector"), doc.get("kind"), doc.get("rank"), doc.get("node"),
            doc.get("gpu"), doc.get("subject"), str(evidence.get("pg")),
            str(evidence.get("link")))


def note_held(active: dict[tuple[Any, ...], dict[str, Any]],
              docs: list[dict[str, Any]]) -> None:
    """Update ``active`` (held key -> raised dict) with one window's findings, in order: a
    raise of a :data:`HELD_DETECTORS` finding holds it (its latest form), a clear ends it."""
    for doc in docs:
        if doc.get("detector") not in HELD_DETECTORS:
            continue
        key = held_key(doc)
        if doc.get("cleared"):
            active.pop(key, None)
        else:
            active[key] = doc


def active_reports(active: list[dict[str, Any]], *, step: int, world_size: int,
                   run: str = "") -> tuple[list[WindowReport], int]:
    """The WindowReports that carry the findings still held, and how many were left out.

    At most :data:`MAX_ACTIVE_SENT` findings (the most severe first, then the oldest), at most
    :data:`~laggard.wire.MAX_REPORT_FINDINGS` to a report and each report's datagram within
    :data:`~laggard.wire.MAX_DATAGRAM_BYTES` (a finding too large for a datagram alone is left
    out).

    Args:
        active: raised finding dicts, oldest first.
        step, world_size, run: the window's, as on its other reports.

    Returns:
        ``(reports, left_out)``: reports with ``active`` set and nothing else, and the count of
        findings not sent.
    """
    order = sorted(range(len(active)),
                   key=lambda i: (_SEVERITY_ORDER.get(str(active[i].get("severity")), 3), i))
    chosen = [active[i] for i in order[:MAX_ACTIVE_SENT]]
    left_out = len(active) - len(chosen)
    reports: list[WindowReport] = []
    chunk: list[dict[str, Any]] = []

    def report(docs: list[dict[str, Any]]) -> WindowReport:
        return WindowReport(step=step, world_size=world_size, run=run, active=docs)

    for doc in chosen:
        if chunk and (len(chunk) == MAX_REPORT_FINDINGS
                      or len(report([*chunk, doc]).encode()) > MAX_DATAGRAM_BYTES):
            reports.append(report(chunk))
            chunk = []
        if len(report([*chunk, doc]).encode()) > MAX_DATAGRAM_BYTES:
            left_out += 1  # too large on its own
            continue
        chunk.append(doc)
    if chunk:
        reports.append(report(chunk))
    return reports, left_out


__all__ = ["BATCH_SECONDS", "HELD_DETECTORS", "MAX_ACTIVE_SENT", "MAX_BACKLOG_DATAGRAMS",
           "MAX_COLLECTIVES_PER_RECORD", "AgentReports", "active_reports", "capped", "held_key",
           "note_held", "window_reports"]
