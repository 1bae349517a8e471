"""The tracer's part of the monitor's window gather: per group, each step's collective seconds.

Each rank keeps a ``(max_groups, K)`` float64 block: row ``j`` holds, per step of the window,
the summed issue-to-completion seconds of its ``j``-th watched group's collectives (NaN for an
empty slot). The block rides after the window's statistics (``laggard.detectors.window``; the
link probe's round trip is one of those columns, ``link_probe_seconds``) in the same gather:
per-step values cannot be a column, which holds one value per rank. Rank 0 lines the groups
up by their member lists (exchanged once, with the ranks' identities) and computes, per group,
who arrived last, each member's wait and the group's transfer time
(:func:`laggard.detectors.link.group_waits`), and feeds the link detector.

Size per rank: ``max_groups * K`` float64 (8 groups, K = 20: 1.3 KB).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import numpy as np

from laggard.detectors.link import GroupWait, LinkDetector, group_waits
from laggard.wire import WindowReport

if TYPE_CHECKING:
    from laggard.detectors.finding import Finding
    from laggard.integrations.monitor import TrainingMonitor
    from laggard.integrations.tracer import CollectiveTracer, TraceStep

log = logging.getLogger(__name__)
#: Probe payload when ``Config.link_probe_bytes`` is None and a tracer is given.
DEFAULT_PROBE_BYTES = 256 << 10
#: Fewest ranks for the probe to be worth it: the link detector compares >= 3 edges.
_MIN_PROBE_RANKS = 3


class TraceWindow:
    """One rank's per-step, per-group collective seconds over a window.

    Args:
        tracer: the tracer whose groups fill the rows.
        window_steps: K.
    """

    def __init__(self, tracer: CollectiveTracer, window_steps: int) -> None:
        self.tracer = tracer
        self.slots = tracer.config.max_groups
        self.block = np.full((self.slots, window_steps), np.nan)

    def add_step(self, column: int, step: TraceStep) -> None:
        """Store one step's per-group seconds in column ``column`` (0 for a group that ran
        nothing this step, NaN for an unused slot)."""
        self.block[:, column] = np.nan
        for info in self.tracer.groups[: self.slots]:
            g = step.groups.get(info.index)
            self.block[info.index, column] = g.seconds if g is not None else 0.0

    def vector(self) -> np.ndarray:
        """``(max_groups * K,)`` float64: the block, row-major."""
        return self.block.ravel().copy()

    def group_keys(self) -> list[tuple[int, ...]]:
        """Member lists (global ranks) of this rank's slots, in slot order."""
        return [info.ranks for info in self.tracer.groups[: self.slots]]

    @property
    def size(self) -> int:
        """Length of :meth:`vector`."""
        return self.block.size


def analyse_groups(vectors: np.ndarray, keys: list[list[tuple[int, ...]]], slots: int,
                   window_steps: int) -> list[tuple[str, GroupWait]]:
    """Rank 0: per distinct watched group, who waited for whom over the window.

    Args:
        vectors: ``(R, slots * K)`` float64, row r = rank r's :meth:`TraceWindow.vector`.
        keys: per rank, its slots' member lists (:meth:`TraceWindow.group_keys`).
        slots: ``max_groups``.
        window_steps: K.

    Returns:
        ``(label, GroupWait)`` per group seen by any rank, label ``"world"`` for the group of
        every rank, else ``"ranks a,b,..."``; members that did not report it are left out.
    """
    ranks = vectors.shape[0]
    blocks = vectors[:, : slots * window_steps].reshape(ranks, slots, window_steps)
    rows: dict[tuple[int, ...], dict[int, np.ndarray]] = {}
    for r, rank_keys in enumerate(keys):
        for slot, members in enumerate(rank_keys[:slots]):
            if r in members:
                rows.setdefault(tuple(members), {})[r] = blocks[r, slot]
    out = []
    for members, by_rank in rows.items():
        present = [m for m in members if m in by_rank]
        if len(present) < 2:
            continue
        label = "world" if len(members) == ranks else "ranks " + ",".join(map(str, members))
        out.append((label, group_waits(np.array(present), np.stack([by_rank[m]
                                                                    for m in present]))))
    return out


class TraceExtension:
    """The tracer's share of a :class:`~laggard.integrations.monitor.TrainingMonitor`: per-step
    bookkeeping, its block of the window gather, the link probe, and on rank 0 the group waits
    and the link detector. Kept apart from the monitor so the gather's statistics columns and
    this block evolve separately.

    Attributes:
        groups: on rank 0, the last window's ``(label, GroupWait)`` per watched group.
        last_step: the latest :class:`~laggard.integrations.tracer.TraceStep`.
    """

    def __init__(self, monitor: TrainingMonitor) -> None:
        self.monitor = monitor
        tracer = monitor.tracer
        assert tracer is not None
        k = monitor.config.window_steps
        self.window = TraceWindow(tracer, k)
        nbytes = monitor.config.link_probe_bytes
        self.probe_bytes = DEFAULT_PROBE_BYTES if nbytes is None else nbytes
        self._probe: Any = None
        self.groups: list[tuple[str, GroupWait]] = []
        self.last_step: TraceStep | None = None
        self.probe_seconds = float("nan")
        self.detector = LinkDetector(monitor.config.link) if monitor.rank == 0 else None

    @property
    def size(self) -> int:
        """float64 values this extension adds to each rank's gathered vector."""
        return self.window.size

    def take_step(self, step: int) -> TraceStep:
        """Take the tracer's step and store its per-group seconds."""
        traced = self.monitor.tracer.take_step()  # type: ignore[union-attr]
        self.window.add_step(step % self.monitor.config.window_steps, traced)
        self.last_step = traced
        return traced

    def group_keys(self) -> list[tuple[int, ...]]:
        """This rank's slots' member lists (sent once with the identities)."""
        return self.window.group_keys()

    def probe(self, group: Any) -> float:
        """Probe this rank's link (every rank at the same point, before the gather); returns
        the round trip in seconds, NaN when off or failed."""
        self.probe_seconds = float("nan")
        if self.probe_bytes > 0 and self.monitor.world_size >= _MIN_PROBE_RANKS:
            try:
                if self._probe is None:
                    from laggard.integrations.link_probe import LinkProbe

                    self._probe = LinkProbe(group, self.monitor.rank, self.monitor.world_size,
                                            self.probe_bytes)
                self.probe_seconds = self._probe.run()
            except Exception as exc:  # noqa: BLE001 - no probe; the gather still runs
                self.probe_bytes = 0
                self.monitor._log_once("probe", "laggard: link probe failed (%r); off", exc)
        return self.probe_seconds

    def analyse(self, step: int, block: np.ndarray, keys: list[Any], *,
                edge_seconds: np.ndarray) -> list[Finding]:
        """Rank 0: group waits and the link detector on the gathered blocks.

        Args:
            step: last step of the window.
            block: ``(R, size)`` float64, the gathered :meth:`TraceWindow.vector` of every
                rank.
            keys: per rank, its slots' member lists.
            edge_seconds: ``(R,)`` float64, each rank's ``link_probe_seconds``.
        """
        m = self.monitor
        self.groups = analyse_groups(block, keys, self.window.slots, m.config.window_steps)
        identities = m._identities or [(m.node, None)] * block.shape[0]
        assert self.detector is not None
        findings = self.detector.update(step=step, edge_seconds=edge_seconds,
                                        nodes=[node for node, _ in identities],
                                        groups=self.groups)
        for finding in findings:
            if finding.evidence.get("cleared"):
                log.warning("laggard: %s (step %s)", finding.message, step)
                m.cleared.append(finding)
            else:
                log.warning("laggard: slow link: %s (step %s; evidence %s)", finding.message,
                            step, finding.evidence)
                m.findings.append(finding)
        if findings and m._sock is not None:
            docs = []
            for f in findings[:16]:
                doc = f.to_dict()
                if f.evidence.get("cleared"):
                    doc["cleared"] = True
                docs.append(doc)
            m._send(WindowReport(step=step, world_size=m.world_size, findings=docs).encode())
        return findings


__all__ = ["TraceExtension", "TraceWindow", "analyse_groups"]
