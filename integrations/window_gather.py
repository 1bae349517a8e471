"""The window gather: every ``window_steps`` steps all ranks send rank 0 one window record.

One float64 vector per rank (:class:`~laggard.detectors.window.WindowLayout`: the window
values of the step columns, then the participants' columns) on a gloo group (the statistics
are CPU tensors), and once, at the first window, each rank's node and local rank as an object.

- ``gather`` to rank 0 (the default): only rank 0 analyses, so the other ranks send their
  vector and hold nothing else (128 B with the step columns alone), and rank 0 receives into
  one ``(R, W)`` buffer made once (its per-rank views kept, so no R tensors are made per
  window: 0.66 s at 65,536 ranks on this host, issue 31).
- ``all_gather_into_tensor`` when a participant needs every rank's record on every rank (an
  *inline* one: the integrity check), into the same kind of buffer on every rank.

Why not ``all_gather`` of a list, what the monitor did: it made R tensors and a stack on every
rank every window, and gloo's all-gather is a ring of R - 1 steps on every rank, moving
2 (R - 1) W 8 bytes per rank (16.8 MB per window at 65,536 ranks and 16 words), where a
gather moves W 8 bytes from a non-root rank (``benchmarks/gather_cost.py``; figures in
docs/integrations.md). Then every participant turns the gathered
:class:`~laggard.detectors.window.WindowRecord` into findings (:func:`analyse_window`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from laggard.detectors.window import WindowLayout, WindowRecord
from laggard.integrations.participants import Participant, StopJob, WindowOutcome


class WindowGather:
    """The gather group and the gather of one window (every rank, at the same step).

    Args:
        dist_mod: an initialised ``torch.distributed``.
        group: the job's group for the gather; None uses the default group when its backend
            is gloo, else (with ``make_gloo_group``) creates a gloo group (:meth:`close`
            destroys it). Creating one is a collective: every rank builds its gather at the
            same point.
        world_size: ranks in the job.
        node, local_rank: this rank's host name and local rank (None if unknown).
        make_gloo_group: create the gloo group where one is needed (False: a monitor that
            does not detect keeps the group it was given and makes no collective call).
        rank: this rank's global rank (rank 0 receives the gather).
        everywhere: every rank gets the record (``all_gather_into_tensor``); False: only
            rank 0 (``gather``). Set before the first window, alike on every rank.

    Attributes:
        group: the process group gathered on (None: the default group).
        everywhere: as given (the monitor sets it once its participants are known).
    """

    def __init__(self, dist_mod: Any, group: Any, *, world_size: int, node: str,
                 local_rank: int | None, make_gloo_group: bool = True, rank: int = 0,
                 everywhere: bool = False) -> None:
        self._dist = dist_mod
        self.group = group
        self._own_group = False
        if make_gloo_group and group is None and dist_mod.get_backend() != "gloo":
            self.group = dist_mod.new_group(backend="gloo")
            self._own_group = True
        self.world_size = world_size
        self.rank = rank
        self.everywhere = everywhere
        self._identity = (node, local_rank)
        self._nodes: list[str] | None = None
        self._local_ranks: np.ndarray | None = None
        self._identified = False
        self._table: Any = None  # (R, W) float64 receive buffer, made at the first window
        self._rows: list[Any] | None = None  # rank 0's views of its rows, for gather

    def gather(self, step: int, values: Mapping[str, object],
               layout: WindowLayout) -> WindowRecord | None:
        """Every rank's window values as one record, on rank 0 (on every rank with
        :attr:`everywhere`).

        Args:
            step: the window's last step.
            values: this rank's column name -> value (a float, or an array for a wide column).
            layout: the columns, in gather order (the same every window).

        Returns:
            The record; None on a rank other than 0 when not :attr:`everywhere`.

        Raises:
            Exception: whatever the collective or the packing raises (a rank gone, a column
                missing); the caller switches detection off.
        """
        import torch

        dist = self._dist
        receives = self.everywhere or self.rank == 0
        if not self._identified:
            self._identify()
        local = torch.from_numpy(layout.pack(dict(values)))
        if self._table is None and receives:
            self._table = torch.empty((self.world_size, layout.size), dtype=torch.float64)
            if not self.everywhere:
                self._rows = list(self._table.unbind(0))
        if self.everywhere:
            # gloo takes the output flat: (R * W,), rank r's vector at r * W
            dist.all_gather_into_tensor(self._table.view(-1), local, group=self.group)
        else:
            dist.gather(local, self._rows if self.rank == 0 else None, dst=0,
                        group=self.group)
        if not receives:
            return None
        return WindowRecord(
            step=step, columns=layout.unpack(self._table.numpy()),  # copies: buffer reused
            ranks=np.arange(self.world_size, dtype=np.int64), world_size=self.world_size,
            nodes=self._nodes, local_ranks=self._local_ranks)

    def _identify(self) -> None:
        """Each rank's node and local rank, once (where the record goes)."""
        dist = self._dist
        identities: list[Any] | None = [None] * self.world_size
        if self.everywhere:
            dist.all_gather_object(identities, self._identity, group=self.group)
        else:
            identities = identities if self.rank == 0 else None
            dist.gather_object(self._identity, identities, dst=0, group=self.group)
        self._identified = True
        if identities is None:
            return
        self._nodes = [node for node, _ in identities]
        local_ranks = [lr for _, lr in identities]
        self._local_ranks = None if any(lr is None for lr in local_ranks) \
            else np.array(local_ranks, dtype=np.int64)

    def close(self) -> None:
        """Destroy the gloo group this gather created, if any."""
        if self._own_group and self.group is not None:
            self._dist.destroy_process_group(self.group)
            self.group = None


def bad_rows(record: WindowRecord) -> int:
    """Rows of a gathered window whose ``step_seconds`` is not a finite number >= 0 (a rank
    that sent NaN or garbage: every real window has a wall-clock step time); 0 when the
    record has no such column."""
    steps = record.get("step_seconds")
    if steps is None:
        return 0
    values = np.asarray(steps, dtype=np.float64)
    return int(values.size - np.count_nonzero(np.isfinite(values) & (values >= 0)))


def analyse_window(participants: Iterable[Participant], record: WindowRecord,
                   count_error: Callable[[str, BaseException], None],
                   ) -> tuple[WindowOutcome, StopJob | None]:
    """Hand one gathered window to every participant, in order, and merge what they found.

    A participant's failure is counted (``count_error(name, exc)``) and the others go on; a
    :class:`~laggard.integrations.participants.StopJob` (integrity policy ``raise``) ends the
    round with its findings kept.

    Returns:
        ``(outcome, stop)``: the merged findings, scores and detector counters, and the StopJob
        to raise once the window is reported (None if none).
    """
    outcome = WindowOutcome()
    stop: StopJob | None = None
    for participant in participants:
        try:
            found = participant.on_window(record)
        except StopJob as exc:
            stop, found = exc, WindowOutcome(findings=exc.findings)
        except Exception as exc:  # noqa: BLE001 - one participant never stops the others
            count_error(participant.name, exc)
            continue
        if found is None:
            continue
        outcome.findings += found.findings
        outcome.scores.update(found.scores)
        outcome.detector_stats.update(found.detector_stats)
        if stop is not None:
            break
    return outcome, stop


__all__ = ["WindowGather", "analyse_window", "bad_rows"]
