"""Each rank's own link, timed once per window: a payload to its ring successor and a 1-element ack.

A collective cannot say whose link is slow: in a ring every member waits for the slowest edge
alike. So once per window, right after the window gather, each rank ``r`` sends ``nbytes`` to
``(r + 1) mod R`` and waits for a one-element acknowledgement, timing the round trip on its own
clock (no clock of another host is read). The edges are probed in disjoint pairs, two or three
rounds (even senders, odd senders, and the wrap-around edge when R is odd), so each probe has
its two links to itself. ``laggard.detectors.link.LinkDetector`` names a node whose incoming and
outgoing edges are both slow.

The payload must be larger than what a link passes at burst speed (a switch's or a token
bucket's burst: ``laggard cluster-demo`` shapes with a 96 KiB bucket), or the probe measures
latency, not rate: 256 KiB by default. Each probe runs :data:`REPEATS` times and keeps the
fastest, so one scheduling hiccup of a loaded host does not look like a slow link.

Cost: ``2 x`` two or three round trips of ``nbytes`` per window on the monitor's gloo group
(256 KiB: about 2 ms each on a 1 Gbit/s link, 20 ms on 100 Mbit/s), on the training thread,
every ``window_steps`` steps. ``TrainingMonitor.Config(link_probe_bytes=0)`` turns it off.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from laggard.detectors.window import WindowColumn
from laggard.integrations.participants import WindowParticipant

#: Tags of the probe's point-to-point messages (distinct from anything a job is likely to use).
_TAG = 0x1A66
_ROUNDS = 3
#: Probes per window; the fastest is kept (scheduling noise only ever adds time).
REPEATS = 2
#: Probe payload when ``TrainingMonitor.Config.link_probe_bytes`` is None and a tracer is given.
DEFAULT_PROBE_BYTES = 256 << 10
#: Fewest ranks for the probe to be worth it: the link detector compares >= 3 edges.
MIN_PROBE_RANKS = 3
#: The window record's column of the probe's round trip.
PROBE_COLUMN = WindowColumn(
    "link_probe_seconds", "seconds", "last",
    "round trip of a fixed payload to the ring successor (laggard.integrations.link_probe); "
    "NaN when not probed")


class LinkProbe:
    """Times this rank's edge to its ring successor.

    Args:
        group: a gloo process group spanning every rank (the monitor's gather group).
        rank: this rank in ``group``.
        world_size: ranks in ``group``.
        nbytes: payload bytes (rounded down to whole float32).
    """

    def __init__(self, group: Any, rank: int, world_size: int, nbytes: int) -> None:
        import torch

        self.group, self.rank, self.world = group, rank, world_size
        self._payload = torch.zeros(max(1, nbytes // 4), dtype=torch.float32)
        self._inbox = torch.empty_like(self._payload)
        self._ack = torch.zeros(1)
        self._ack_in = torch.empty(1)

    def _sender_round(self, rank: int) -> int | None:
        """The round in which ``rank`` sends (None: never, a one-rank ring)."""
        if self.world < 2:
            return None
        if self.world % 2 == 1 and rank == self.world - 1:
            return 2
        return rank % 2

    def run(self) -> float:
        """Probe :data:`REPEATS` times; returns this rank's fastest round trip, seconds.

        Every rank of the group must call it at the same point (it is a collective step).
        Raises whatever torch.distributed raises (the monitor counts it and stops probing).
        """
        return min(self._once() for _ in range(REPEATS))

    def _once(self) -> float:
        """Probe once; returns this rank's round trip to its successor, seconds.

        Every rank of the group must call it at the same point (it is a collective step).
        Raises whatever torch.distributed raises (the monitor counts it and stops probing).
        """
        import torch.distributed as dist

        succ = (self.rank + 1) % self.world
        pred = (self.rank - 1) % self.world
        mine = self._sender_round(self.rank)
        theirs = self._sender_round(pred)
        seconds = float("nan")
        for round_ in range(_ROUNDS):
            tag = _TAG + round_
            if round_ == mine:
                start = time.perf_counter()
                send = dist.isend(self._payload, self._global(succ), group=self.group, tag=tag)
                dist.recv(self._ack_in, self._global(succ), group=self.group, tag=tag)
                seconds = time.perf_counter() - start
                send.wait()
            if round_ == theirs:
                dist.recv(self._inbox, self._global(pred), group=self.group, tag=tag)
                dist.send(self._ack, self._global(pred), group=self.group, tag=tag)
        return seconds

    def _global(self, group_rank: int) -> int:
        import torch.distributed as dist

        if self.group is None:
            return group_rank
        return int(dist.get_global_rank(self.group, group_rank))


class LinkProbeParticipant(WindowParticipant):
    """The monitor's participant that probes this rank's link once per window, right before
    the gather, into the record's ``link_probe_seconds`` column (read by the link detector in
    :mod:`laggard.integrations.trace_window`).

    Args:
        nbytes: payload bytes; 0 turns the probe off (the column stays NaN).

    Attributes:
        seconds: this rank's last round trip, NaN when off or failed.
    """

    name = "link_probe"
    columns = (PROBE_COLUMN,)

    def __init__(self, nbytes: int) -> None:
        super().__init__()
        self.nbytes = nbytes
        self.seconds = float("nan")
        self._probe: LinkProbe | None = None

    def contribute(self, step: int) -> Mapping[str, object]:
        context = self.context
        self.seconds = float("nan")
        if context is None or self.nbytes <= 0 or context.world_size < MIN_PROBE_RANKS:
            return {}
        try:
            if self._probe is None:
                self._probe = LinkProbe(context.group, context.rank, context.world_size,
                                        self.nbytes)
            self.seconds = self._probe.run()
        except Exception as exc:  # noqa: BLE001 - no probe; the gather still runs
            self.nbytes = 0
            context.log_once("probe", "laggard: link probe failed (%r); off", exc)
        return {PROBE_COLUMN.name: self.seconds}


__all__ = ["DEFAULT_PROBE_BYTES", "PROBE_COLUMN", "LinkProbe", "LinkProbeParticipant"]
