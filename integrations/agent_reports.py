"""What the monitor sends its node agent: a StepRecord per step, WindowReports per window.

Every datagram goes through the agent's socket (:mod:`laggard.integrations.agent_socket`: a
Unix datagram socket by default, UDP on loopback as the fallback): fire and forget on a
non-blocking socket, so a missing, slow or crashed agent costs the job nothing but a counted
drop (``MonitorStats.records_sent``, ``send_dropped``, ``send_errors``). A datagram is bounded:
a step's collectives are merged per op beyond :data:`MAX_COLLECTIVES_PER_RECORD`, a window's
findings are chunked :data:`~laggard.wire.MAX_REPORT_FINDINGS` to a report and its scores cut
to the highest :data:`~laggard.wire.MAX_REPORT_RANKS`.

Rank 0's verdict is sent as a level, not an edge: every window's reports carry the findings that
still hold (``WindowReport.active``, at most :data:`MAX_ACTIVE_SENT` a window, each datagram
under :data:`~laggard.wire.MAX_DATAGRAM_BYTES`; what does not fit is counted in
``MonitorStats.active_left_out``), so an agent restarted mid-run has the run's verdict back
within one window; clears are still sent once. :meth:`AgentReports.close` sends the run's end
(``WindowReport.end``), and the agent ends the run's findings at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from laggard.detectors.window import WindowRecord
from laggard.integrations.agent_socket import AgentSocket
from laggard.integrations.participants import WindowOutcome
from laggard.integrations.phases import StepTimes
from laggard.wire import (
    MAX_DATAGRAM_BYTES,
    MAX_REPORT_FINDINGS,
    MAX_REPORT_RANKS,
    CollectiveTiming,
    StepRecord,
    WindowReport,
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


class AgentReports:
    """The monitor's sender to its node agent; never raises.

    Args:
        address: ``MonitorConfig.agent_address`` (empty: nothing is sent).
        stats: the monitor's :class:`~laggard.integrations.monitor_config.MonitorStats`, whose
            ``records_sent``, ``send_dropped`` and ``send_errors`` this counts into.
        log_once: ``(key, msg, *args)``, the monitor's once-only log.
        rank, world_size, local_rank, node, run: this rank's fields on every StepRecord.
        device_id: this rank's CUDA identity (``uuid``, ``pci_bus_id``), or None on CPU.

    Attributes:
        sock: the :class:`~laggard.integrations.agent_socket.AgentSocket`, or None (no
            address, or it could not be opened: counted in ``send_errors``, logged once).
    """

    def __init__(self, address: str, *, stats: Any, log_once: Callable[..., Any], rank: int,
                 world_size: int, local_rank: int | None, node: str, run: str,
                 device_id: Any) -> None:
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
        self.sock: Any = None
        if address:
            try:
                self.sock = AgentSocket(address)
            except OSError as exc:
                stats.send_errors += 1
                log_once("socket", "laggard: no agent socket for %s: %s; step records off",
                         address, exc)

    def send_step(self, step: int, times: StepTimes, comm: Any) -> None:
        """Send one step's StepRecord (nothing without a socket).

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
            **self._rank_fields)
        self.send(record.encode())

    def send_window(self, record: WindowRecord, outcome: WindowOutcome) -> None:
        """Send one window's WindowReports: its scores and findings, then the findings that
        still hold (nothing is sent without a socket; the held ones are tracked all the same).
        """
        self._last_step = record.step
        note_held(self.active, [f.to_dict() for f in outcome.findings])
        if self.sock is None:
            return
        for report in window_reports(record, outcome, self.run):
            self.send(report.encode())
        reports, left_out = active_reports(list(self.active.values()), step=record.step,
                                           world_size=self._world(record), run=self.run)
        for report in reports:
            self.send(report.encode())
        if left_out:
            self._stats.active_left_out += left_out
            self._log_once("active-left-out", "laggard: %d active findings did not fit in a "
                           "window's reports to the agent (counted in stats.active_left_out; "
                           "more are left out each window they hold)", left_out)

    def send_end(self) -> None:
        """Tell the agent the run ended (``WindowReport.end``): it ends the run's active
        findings at once. Sent by the rank that sends the windows (rank 0), from ``close()``."""
        if self.sock is None:
            return
        self.send(WindowReport(step=self._last_step, world_size=max(self.world_size, 1),
                               run=self.run, end=True).encode())

    def _world(self, record: WindowRecord) -> int:
        return record.world_size or int(record.ranks.size)

    def send(self, payload: bytes) -> None:
        """Send one datagram, counted: sent, dropped (the agent's queue is full) or failed."""
        try:
            self.sock.send(payload)
            self._stats.records_sent += 1
        except BlockingIOError:
            self._stats.send_dropped += 1
        except OSError as exc:
            # ECONNREFUSED arrives here once the kernel has seen the agent's port closed
            self._stats.send_errors += 1
            self._log_once("send", "laggard: cannot send to agent %s: %s (counting, not "
                           "retrying)", self.address, exc)

    def close(self) -> None:
        """Close the socket (idempotent)."""
        sock, self.sock = self.sock, None
        if sock is not None:
            sock.close()


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


__all__ = ["HELD_DETECTORS", "MAX_ACTIVE_SENT", "MAX_COLLECTIVES_PER_RECORD", "AgentReports",
           "active_reports", "capped", "held_key", "note_held", "window_reports"]
