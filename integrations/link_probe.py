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

The data path, chosen per job at the first probe (:func:`probe_path`):

* **gloo jobs** (and any default group that is not NCCL): the probe runs over the monitor's gloo
  gather group with CPU tensors, timed by ``perf_counter`` on the training thread. A backend
  that is neither NCCL nor gloo is reported once and probed this way.
* **NCCL jobs**: a gloo probe would time TCP on the host network, never NCCL's NVLink or
  InfiniBand path, so the probe uses a CUDA tensor over the job's own default (NCCL) group,
  timed on the device: a pooled timing event on the current stream before the ``isend`` and
  one after the ack's ``recv`` (an NCCL ``recv`` makes the current stream wait for it, it does
  not block the CPU), read with ``query()`` only (:mod:`laggard.integrations.device_events`).
  So the round trip of window ``w`` is usually read, and reported in the record, at window
  ``w + 1``: the link column is one window late on NCCL (NaN at the first window). The device
  interval starts where the current stream reaches the probe, so it can include the peer's
  stream catching up; the second of the :data:`REPEATS` probes starts with the pair aligned by
  the first, and the fastest is kept. The first probe of each pair also makes NCCL set up its
  point-to-point connection (a one-off, at the first window).

Cost: ``2 x`` two or three round trips of ``nbytes`` per window (256 KiB: about 2 ms each on a
1 Gbit/s link, 20 ms on 100 Mbit/s over gloo; figures in ``benchmarks/RESULTS.md``), every
``window_steps`` steps: on the training thread over gloo; on NCCL the CPU only enqueues (a few
event records and four p2p launches) and the device spends the round trips on the job's
stream. ``TrainingMonitor.Config(link_probe_bytes=0)`` turns it off.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
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


@dataclass(frozen=True, slots=True)
class ProbePath:
    """Where the probe runs.

    Attributes:
        group: the process group (None: the default group).
        backend: ``gloo``, ``nccl``, or the default group's other backend (probed over gloo).
        device: the device module timing it (``torch.cuda``); None: the CPU clock.
        tensor_device: where the payload lives (``cuda:N`` on NCCL); None: CPU.
    """

    group: Any
    backend: str
    device: Any = None
    tensor_device: Any = None


def probe_path(gather_group: Any, log_once: Any = None) -> ProbePath:
    """The probe's data path for this job: the default group's backend decides.

    Args:
        gather_group: the monitor's gloo gather group (the gloo path's group).
        log_once: ``(key, message, *args)`` for a backend that is neither NCCL nor gloo.

    Returns:
        NCCL default group and a usable CUDA device: the default group, ``torch.cuda``, a
        tensor on the current CUDA device. Otherwise the gloo gather group on the CPU clock.
    """
    import torch
    import torch.distributed as dist

    try:
        backend = str(dist.get_backend())
    except Exception:  # noqa: BLE001 - no default group: the gather group decides
        backend = "gloo"
    if "nccl" in backend:
        try:
            if torch.cuda.is_available():
                device = torch.device("cuda", torch.cuda.current_device())
                return ProbePath(None, "nccl", torch.cuda, device)
        except Exception:  # noqa: BLE001 - a broken driver: probe over gloo
            pass
        if log_once is not None:
            log_once("probe_backend", "laggard: NCCL job without a usable CUDA device; the "
                     "link probe runs over gloo (the host network)")
    elif backend != "gloo" and log_once is not None:
        log_once("probe_backend", "laggard: backend %r is neither NCCL nor gloo; the link probe "
                 "runs over the monitor's gloo group (the host network)", backend)
    return ProbePath(gather_group, backend)


class LinkProbe:
    """Times this rank's edge to its ring successor.

    Args:
        group: a process group spanning every rank: the monitor's gloo gather group, or on
            NCCL the job's default group (None).
        rank: this rank in ``group``.
        world_size: ranks in ``group``.
        nbytes: payload bytes (rounded down to whole float32).
        device: the device module timing the probe (``torch.cuda``'s names: ``Event``,
            ``current_stream``); None: the CPU clock (``perf_counter``), for gloo.
        tensor_device: where the payload lives (``cuda:N`` on NCCL); None: CPU.
        dist: the ``torch.distributed`` module (a fake in tests).
        pool_size: timing events made once when ``device`` is given.

    Attributes:
        last_seconds: on a device, the fastest round trip of the probe read during the last
            :meth:`run` (usually the previous window's), NaN when none was; on the CPU clock,
            the last :meth:`run`'s.
        pending_stats: on a device, the events' counters
            (:class:`~laggard.integrations.device_events.DeviceEventStats`); else None.
    """

    def __init__(self, group: Any, rank: int, world_size: int, nbytes: int, *,
                 device: Any = None, tensor_device: Any = None, dist: Any = None,
                 pool_size: int = 32) -> None:
        import torch

        if dist is None:
            import torch.distributed as dist
        self._dist = dist
        self.group, self.rank, self.world = group, rank, world_size
        kw: dict[str, Any] = {} if tensor_device is None else {"device": tensor_device}
        self._payload = torch.zeros(max(1, nbytes // 4), dtype=torch.float32, **kw)
        self._inbox = torch.empty_like(self._payload)
        self._ack = torch.zeros(1, **kw)
        self._ack_in = torch.empty_like(self._ack)
        self.device = device
        self.last_seconds = float("nan")
        self._pending: Any = None
        self.pending_stats: Any = None
        if device is not None:
            from laggard.integrations.device_events import EventPool, PendingIntervals

            pool = EventPool(device, pool_size)
            # a probe whose events are still pending after a few windows is dropped as NaN
            self._pending = PendingIntervals(pool, max_pending=max(1, pool_size // 2 - 1))
            self.pending_stats = pool.stats

    def _sender_round(self, rank: int) -> int | None:
        """The round in which ``rank`` sends (None: never, a one-rank ring)."""
        if self.world < 2:
            return None
        if self.world % 2 == 1 and rank == self.world - 1:
            return 2
        return rank % 2

    def run(self) -> float:
        """Probe :data:`REPEATS` times; returns this rank's fastest round trip, seconds.

        On the CPU clock: this call's probes. On a device: the probes are enqueued and timed by
        events; the value returned is the fastest round trip of the most recent probe whose
        events have completed (usually the previous call's: one window late), NaN when none
        has yet. Never blocks on the device. Every rank of the group must call it at the same
        point (it is a collective step). Raises whatever torch.distributed raises (the monitor
        counts it and stops probing).
        """
        if self._pending is None:
            self.last_seconds = min(self._once() for _ in range(REPEATS))
            return self.last_seconds
        self.last_seconds = float("nan")  # a value read in this call or none: never a stale one
        self._pending.harvest()
        got: list[float] = []

        def sink(seconds: float) -> None:
            got.append(seconds)
            if len(got) == REPEATS:
                read = [s for s in got if not math.isnan(s)]
                self.last_seconds = min(read) if read else float("nan")

        for _ in range(REPEATS):
            self._once(sink)
        self._pending.harvest()
        return self.last_seconds

    def _once(self, sink: Any = None) -> float:
        """Probe once; returns this rank's round trip to its successor, seconds (on a device:
        NaN, and the interval goes to ``sink`` when its events are read).

        Every rank of the group must call it at the same point (it is a collective step).
        Raises whatever torch.distributed raises (the monitor counts it and stops probing).
        """
        dist = self._dist
        pending = self._pending
        succ = (self.rank + 1) % self.world
        pred = (self.rank - 1) % self.world
        mine = self._sender_round(self.rank)
        theirs = self._sender_round(pred)
        seconds = float("nan")
        for round_ in range(_ROUNDS):
            tag = _TAG + round_
            if round_ == mine:
                if pending is not None:
                    # on the current stream: NCCL's stream waits for it at the isend, and the
                    # recv below makes the current stream wait for the ack
                    begin = pending.pool.record()
                start = time.perf_counter()
                send = dist.isend(self._payload, self._global(succ), group=self.group, tag=tag)
                dist.recv(self._ack_in, self._global(succ), group=self.group, tag=tag)
                seconds = time.perf_counter() - start
                if pending is not None:
                    pending.add(begin, pending.pool.record(), sink)
                    seconds = float("nan")
                send.wait()
            if round_ == theirs:
                dist.recv(self._inbox, self._global(pred), group=self.group, tag=tag)
                dist.send(self._ack, self._global(pred), group=self.group, tag=tag)
        return seconds

    def _global(self, group_rank: int) -> int:
        if self.group is None:
            return group_rank
        return int(self._dist.get_global_rank(self.group, group_rank))


class LinkProbeParticipant(WindowParticipant):
    """The monitor's participant that probes this rank's link once per window, right before
    the gather, into the record's ``link_probe_seconds`` column (read by the link detector in
    :mod:`laggard.integrations.trace_window`).

    The data path is the job's (:func:`probe_path`): gloo jobs over the monitor's gloo group on
    the CPU clock; NCCL jobs over the default group with a CUDA tensor, timed by events and so
    reported one window late.

    Args:
        nbytes: payload bytes; 0 turns the probe off (the column stays NaN).
        path: the data path to use instead of :func:`probe_path`'s choice (tests: a fake group
            and device).
        dist: the ``torch.distributed`` module (a fake in tests).

    Attributes:
        seconds: this rank's last round trip, NaN when off, failed or not read yet.
        path: the data path chosen (None before the first probe).
    """

    name = "link_probe"
    columns = (PROBE_COLUMN,)

    def __init__(self, nbytes: int, *, path: ProbePath | None = None, dist: Any = None) -> None:
        super().__init__()
        self.nbytes = nbytes
        self.seconds = float("nan")
        self.path = path
        self._dist = dist
        self._probe: LinkProbe | None = None

    def contribute(self, step: int) -> Mapping[str, object]:
        context = self.context
        self.seconds = float("nan")
        if context is None or self.nbytes <= 0 or context.world_size < MIN_PROBE_RANKS:
            return {}
        try:
            if self._probe is None:
                if self.path is None:
                    self.path = probe_path(context.group, context.log_once)
                self._probe = LinkProbe(self.path.group, context.rank, context.world_size,
                                        self.nbytes, device=self.path.device,
                                        tensor_device=self.path.tensor_device, dist=self._dist)
            self.seconds = self._probe.run()
        except Exception as exc:  # noqa: BLE001 - no probe; the gather still runs
            self.nbytes = 0
            context.log_once("probe", "laggard: link probe failed (%r); off", exc)
        return {PROBE_COLUMN.name: self.seconds}


__all__ = ["DEFAULT_PROBE_BYTES", "PROBE_COLUMN", "LinkProbe", "LinkProbeParticipant",
           "ProbePath", "probe_path"]
