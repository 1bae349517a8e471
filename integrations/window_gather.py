"""The window gather: every ``window_steps`` steps all ranks exchange one window record.

One ``all_gather`` of a float64 vector per rank (:class:`~laggard.detectors.window.
WindowLayout`: the window values of the step columns, then the participants' columns) on a
gloo group (the statistics are CPU tensors), and once, at the first window, an
``all_gather_object`` of each rank's node and local rank. Then every participant turns the
gathered :class:`~laggard.detectors.window.WindowRecord` into findings
(:func:`analyse_window`).
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

    Attributes:
        group: the process group gathered on (None: the default group).
    """

    def __init__(self, dist_mod: Any, group: Any, *, world_size: int, node: str,
                 local_rank: int | None, make_gloo_group: bool = True) -> None:
        self._dist = dist_mod
        self.group = group
        self._own_group = False
        if make_gloo_group and group is None and dist_mod.get_backend() != "gloo":
            self.group = dist_mod.new_group(backend="gloo")
            self._own_group = True
        self.world_size = world_size
        self._identity = (node, local_rank)
        self._identities: list[tuple[str, int | None]] | None = None

    def gather(self, step: int, values: Mapping[str, object],
               layout: WindowLayout) -> WindowRecord:
        """All ranks' window values as one record.

        Args:
            step: the window's last step.
            values: this rank's column name -> value (a float, or an array for a wide column).
            layout: the columns, in gather order.

        Raises:
            Exception: whatever the collective or the packing raises (a rank gone, a column
                missing); the caller switches detection off.
        """
        import torch

        dist = self._dist
        if self._identities is None:
            identities: list[Any] = [None] * self.world_size
            dist.all_gather_object(identities, self._identity, group=self.group)
            self._identities = [(node, lr) for node, lr in identities]
        local = torch.from_numpy(layout.pack(dict(values)))
        gathered = [torch.empty_like(local) for _ in range(self.world_size)]
        dist.all_gather(gathered, local, group=self.group)
        nodes = [node for node, _ in self._identities]
        local_ranks = [lr for _, lr in self._identities]
        return WindowRecord(
            step=step, columns=layout.unpack(torch.stack(gathered).numpy()),
            ranks=np.arange(self.world_size, dtype=np.int64), world_size=self.world_size,
            nodes=nodes, local_ranks=None if any(lr is None for lr in local_ranks)
            else np.array(local_ranks, dtype=np.int64))

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
