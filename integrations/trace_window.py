"""The tracer's participant in the monitor's window gather: per group, each step's collective
seconds.

Each rank keeps a ``(max_groups, K)`` float64 block: row ``j`` holds, per step of the window,
the summed issue-to-completion seconds of its ``j``-th watched group's collectives (NaN for an
empty slot). The block is one wide column of the window record, ``trace_group_seconds``
(``laggard.detectors.window``): per-step values, K of them per group. Rank 0 lines the groups
up by their member lists (exchanged once, at the first window) and computes, per group, who
arrived last, each member's wait and the group's transfer time
(:func:`laggard.detectors.link.group_waits`), and feeds the link detector with them and the
link probe's ``link_probe_seconds`` column (:mod:`laggard.integrations.link_probe`).

Size per rank: ``max_groups * K`` float64 (8 groups, K = 20: 1.3 KB).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from laggard.detectors.link import GroupWait, LinkDetector, LinkWindow, group_waits
from laggard.detectors.window import WindowColumn, WindowRecord
from laggard.integrations.link_probe import PROBE_COLUMN
from laggard.integrations.participants import MonitorContext, WindowOutcome, WindowParticipant

if TYPE_CHECKING:
    from laggard.integrations.trace_records import TraceStep
    from laggard.integrations.tracer import CollectiveTracer

#: The window record's column of the tracer's block.
TRACE_COLUMN = "trace_group_seconds"


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


class TraceParticipant(WindowParticipant):
    """The tracer's share of a :class:`~laggard.integrations.monitor.TrainingMonitor`: per-step
    bookkeeping, its ``trace_group_seconds`` block of the window record, and on rank 0 the
    group waits and the link detector (on the link probe's ``link_probe_seconds`` column).

    Args:
        tracer: the monitor's collective tracer.
        link: ``LinkDetector.Config`` for rank 0; None for its defaults.

    Attributes:
        groups: on rank 0, the last window's ``(label, GroupWait)`` per watched group.
        last_step: the latest :class:`~laggard.integrations.trace_records.TraceStep`.
        detector: the :class:`~laggard.detectors.link.LinkDetector` (rank 0 only).
    """

    name = "trace"

    def __init__(self, tracer: CollectiveTracer, link: Any = None) -> None:
        super().__init__()
        self.tracer = tracer
        self.link_config = link
        self.window: TraceWindow | None = None
        self.groups: list[tuple[str, GroupWait]] = []
        self.last_step: TraceStep | None = None
        self.detector: LinkDetector | None = None
        self._keys: list[list[tuple[int, ...]]] | None = None
        self.columns = ()

    def attach(self, context: MonitorContext) -> None:
        super().attach(context)
        self.window = TraceWindow(self.tracer, context.window_steps)
        self.columns = (WindowColumn(
            TRACE_COLUMN, "seconds", "last",
            "per watched group and step of the window, the summed issue-to-completion seconds "
            "of its collectives (row-major max_groups x K; NaN for an unused slot)",
            width=self.window.size),)
        if context.rank == 0:
            self.detector = LinkDetector(self.link_config)

    def end_step(self, step: int, column: int) -> None:
        """Take the tracer's step and store its per-group seconds."""
        traced = self.tracer.take_step()
        if self.window is not None:
            self.window.add_step(column, traced)
        self.last_step = traced

    def contribute(self, step: int) -> Mapping[str, object]:
        if self.window is None:
            return {}
        if self._keys is None:
            # The member lists of every rank's slots, exchanged once (every rank, same point).
            import torch.distributed as dist

            keys: list[Any] = [None] * self.context.world_size  # type: ignore[union-attr]
            dist.all_gather_object(keys, self.window.group_keys(),
                                   group=self.context.group)  # type: ignore[union-attr]
            self._keys = keys
        return {TRACE_COLUMN: self.window.vector()}

    def on_window(self, record: WindowRecord) -> WindowOutcome | None:
        """Rank 0: group waits and the link detector on the gathered blocks."""
        block = record.get(TRACE_COLUMN)
        if self.detector is None or self.window is None or block is None or self._keys is None:
            return None
        self.groups = analyse_groups(block, self._keys, self.window.slots,
                                     self.window.block.shape[1])
        ranks = block.shape[0]
        edges = record.get(PROBE_COLUMN.name)
        nodes = list(record.nodes) if record.nodes is not None else [""] * ranks
        findings = self.detector.update(LinkWindow(
            step=record.step, nodes=nodes, groups=self.groups,
            edge_seconds=edges if edges is not None else np.full(ranks, np.nan)))
        return WindowOutcome(findings=findings)


__all__ = ["TRACE_COLUMN", "TraceParticipant", "TraceWindow", "analyse_groups"]
