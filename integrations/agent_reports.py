"""What the monitor sends its node agent: a StepRecord per step, WindowReports per window.

Every datagram goes through the agent's socket (:mod:`laggard.integrations.agent_socket`: a
Unix datagram socket by default, UDP on loopback as the fallback): fire and forget on a
non-blocking socket, so a missing, slow or crashed agent costs the job nothing but a counted
drop (``MonitorStats.records_sent``, ``send_dropped``, ``send_errors``). A datagram is bounded:
a step's collectives are merged per op beyond :data:`MAX_COLLECTIVES_PER_RECORD`, a window's
findings are chunked :data:`~laggard.wire.MAX_REPORT_FINDINGS` to a report and its scores cut
to the highest :data:`~laggard.wire.MAX_REPORT_RANKS`.
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
    MAX_REPORT_FINDINGS,
    MAX_REPORT_RANKS,
    CollectiveTiming,
    StepRecord,
    WindowReport,
)

#: Per-step collective entries sent in one StepRecord; beyond it they are merged per op.
MAX_COLLECTIVES_PER_RECORD = 32


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
        """Send one window's WindowReports (nothing without a socket)."""
        if self.sock is None:
            return
        for report in window_reports(record, outcome, self.run):
            self.send(report.encode())

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


__all__ = ["MAX_COLLECTIVES_PER_RECORD", "AgentReports", "capped", "window_reports"]
