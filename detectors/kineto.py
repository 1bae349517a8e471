"""Profiler (Kineto) traces across ranks: per-step time breakdown and the straggler.

Per rank and per profiler step (``ProfilerStep#N`` ranges), the step's wall time is split by
what ran in it, as unions of intervals (nested and concurrent ranges are counted once):

* **GPU form** (the trace has GPU kernels): compute = compute kernels; communication = NCCL
  kernels (``nccl*``); memory = ``gpu_memcpy``/``gpu_memset``. Kernels are placed in the step
  whose GPU-side ``ProfilerStep#N`` annotation holds them, else in the CPU step their launch
  (``cuda_runtime`` event with the same ``correlation``) ran in, as Holistic Trace Analysis does;
  the step's GPU time then runs from its first kernel to the next step's first kernel (the last
  step's to its last kernel).
* **CPU form** (no kernels: gloo, CPU-only jobs): communication = the collective ranges PyTorch
  records on the CPU (``gloo:*``, ``nccl:*``, ``c10d::*``, ``record_param_comms``, FSDP's
  all-gather and reduce-scatter ranges); compute = every other ``cpu_op``.

From those: overlap = communication running while compute runs; exposed communication =
communication with no compute beside it; idle = the step's time with neither (nor memory
copies). Units: microseconds, as the trace's ``ts``/``dur``.

**Straggler, by the wait-least rule**: in synchronous training every rank waits in the step's
collectives for the slowest, so the rank whose communication is *shortest* is the one the others
wait for (see docs/architecture.md, "Why wall time is the wrong signal"). A rank is named when it
has the least communication time in at least :data:`MIN_SHARE` of the steps every rank traced
(at least :data:`MIN_STEPS`), and the others' median communication exceeds its own by at least
:data:`MIN_GAP` of the median step time in the median step. HTA's straggler report, by
contrast, flags ranks by a z-score on each rank's own totals, which names every rank of a small
job whose ranks differ at all.

Intervals are kept in compact arrays (16 bytes and a kind byte per kernel or range), whatever
else the trace holds, and reduced one step at a time.
"""

from __future__ import annotations

import re
from array import array
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["MIN_GAP", "MIN_SHARE", "MIN_STEPS", "RankTrace", "StepBreakdown", "Straggler",
           "find_straggler"]

#: Fewest steps traced by every rank before a straggler is named.
MIN_STEPS = 3
#: Share of those steps in which the named rank must communicate least. By chance alone, one
#: given rank of a 3-rank job is last in 5 or more of 6 steps with probability 1.8% (5% for
#: any of the three); at 2/3 it would be 10% per rank, and a clean 3-rank gloo run on this
#: shared machine was named at 4 of 6.
MIN_SHARE = 0.8
#: Least gap (others' median communication minus the rank's), as a share of the step time.
MIN_GAP = 0.10

_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_CPU_COMM = re.compile(r"^(?:gloo:|nccl:|c10d::|record_param_comms$|FSDP::.*(?:all_gather|"
                       r"reduce|scatter|broadcast))")
_COMPUTE, _COMM, _MEMORY = 0, 1, 2


@dataclass(frozen=True, slots=True)
class StepBreakdown:
    """One rank's step, in microseconds.

    Attributes:
        step: N of ``ProfilerStep#N``; ``duration``: its wall time.
        compute, communication, memory: union of each kind's intervals within the step.
        overlap: communication time with compute running beside it.
        exposed_communication: communication time with no compute beside it.
        idle: time with nothing running (of the kinds above).
    """

    step: int
    duration: float
    compute: float
    communication: float
    memory: float
    overlap: float
    exposed_communication: float
    idle: float


@dataclass(slots=True)
class RankTrace:
    """What one rank's trace holds, accumulated event by event (:meth:`add`).

    Attributes:
        source: the file.
        rank, world_size, backend: from ``distributedInfo`` (``set_meta``); rank None if absent.
        groups: process-group name -> (description, ranks), from ``distributedInfo``.
        gpu: True once a GPU kernel was seen.
        comm_groups: process-group names seen on communication events, with counts.
    """

    source: str
    rank: int | None = None
    world_size: int | None = None
    backend: str | None = None
    groups: dict[str, tuple[str, tuple[int, ...]]] = field(default_factory=dict)
    gpu: bool = False
    comm_groups: Counter = field(default_factory=Counter)
    _cpu_steps: dict[int, tuple[float, float]] = field(default_factory=dict)
    _gpu_steps: dict[int, tuple[float, float]] = field(default_factory=dict)
    _cpu: tuple[array, array, array] = field(
        default_factory=lambda: (array("d"), array("d"), array("b")))
    _kernels: tuple[array, array, array, array] = field(
        default_factory=lambda: (array("d"), array("d"), array("b"), array("q")))
    _launches: tuple[array, array] = field(default_factory=lambda: (array("q"), array("d")))

    def set_meta(self, meta: dict[str, Any]) -> None:
        """Read ``distributedInfo`` (rank, world size, backend, process groups)."""
        info = meta.get("distributedInfo")
        if not isinstance(info, dict):
            return
        self.rank = _int(info.get("rank"))
        self.world_size = _int(info.get("world_size"))
        self.backend = str(info["backend"]) if info.get("backend") is not None else None
        configs = info.get("pg_config")
        for pg in configs if isinstance(configs, list) else []:
            if isinstance(pg, dict) and pg.get("pg_name") is not None:
                ranks = pg["ranks"] if isinstance(pg.get("ranks"), list) else []
                self.groups[str(pg["pg_name"])] = (str(pg.get("pg_desc", "")),
                                                   tuple(r for r in ranks if isinstance(r, int)))

    def add(self, event: dict[str, Any]) -> None:
        """Take one trace event (a complete ``"ph": "X"`` event; others are ignored)."""
        if event.get("ph") != "X":
            return
        ts, dur = event.get("ts"), event.get("dur")
        if not isinstance(ts, (int, float)) or not isinstance(dur, (int, float)) or dur < 0:
            return
        cat, name = event.get("cat"), event.get("name")
        if not isinstance(name, str):
            return
        if cat == "kernel" or cat in ("gpu_memcpy", "gpu_memset"):
            self._add_kernel(cat, name, float(ts), float(dur), event.get("args"))
        elif cat == "cuda_runtime" or cat == "cuda_driver":
            args = event.get("args")
            corr = _int(args.get("correlation")) if isinstance(args, dict) else None
            if corr is not None:
                self._launches[0].append(corr)
                self._launches[1].append(float(ts))
        elif (m := _STEP.match(name)) is not None:
            steps = self._gpu_steps if cat == "gpu_user_annotation" else self._cpu_steps
            steps[int(m.group(1))] = (float(ts), float(ts) + float(dur))
        elif cat in ("cpu_op", "user_annotation"):
            comm = _CPU_COMM.match(name) is not None
            if comm:
                self._note_group(event.get("args"))
            elif cat != "cpu_op":
                return  # user ranges (optimizer, data loading labels) are not compute
            starts, ends, kinds = self._cpu
            starts.append(float(ts))
            ends.append(float(ts) + float(dur))
            kinds.append(_COMM if comm else _COMPUTE)

    def _add_kernel(self, cat: str, name: str, ts: float, dur: float, args: Any) -> None:
        self.gpu = True
        kind = _MEMORY if cat != "kernel" else _COMM if "nccl" in name.lower() else _COMPUTE
        if kind == _COMM:
            self._note_group(args)
        starts, ends, kinds, corrs = self._kernels
        starts.append(ts)
        ends.append(ts + dur)
        kinds.append(kind)
        corr = _int(args.get("correlation")) if isinstance(args, dict) else None
        corrs.append(corr if corr is not None else -1)

    def _note_group(self, args: Any) -> None:
        if isinstance(args, dict) and args.get("Process Group Name") is not None:
            if len(self.comm_groups) < 64 or args["Process Group Name"] in self.comm_groups:
                self.comm_groups[str(args["Process Group Name"])] += 1

    @property
    def steps(self) -> list[int]:
        """Step numbers traced (CPU ``ProfilerStep#N`` ranges)."""
        return sorted(self._cpu_steps or self._gpu_steps)

    def breakdown(self) -> list[StepBreakdown]:
        """The per-step breakdown (see module doc), in step order."""
        if self.gpu:
            starts, ends, kinds = self._gpu_intervals()
            windows = self._gpu_steps or self._cpu_steps
        else:
            starts, ends, kinds = (np.frombuffer(a, dtype=t) for a, t in
                                   zip(self._cpu, ("f8", "f8", "i1"), strict=True))
            windows = self._cpu_steps
        order = np.argsort(starts, kind="stable")
        starts, ends, kinds = starts[order], ends[order], kinds[order]
        return [_step(n, a, b, starts, ends, kinds) for n, (a, b) in sorted(windows.items())]

    def _gpu_intervals(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        starts = np.frombuffer(self._kernels[0], dtype="f8")
        ends = np.frombuffer(self._kernels[1], dtype="f8")
        kinds = np.frombuffer(self._kernels[2], dtype="i1")
        if self._gpu_steps or not self._cpu_steps:
            return starts, ends, kinds
        # No GPU-side step ranges: a kernel belongs to the CPU step its launch ran in (HTA's
        # iteration assignment, through the launch's correlation id); the step's GPU window is
        # the span of its kernels.
        corrs = np.frombuffer(self._kernels[3], dtype="i8")
        launch_corr = np.frombuffer(self._launches[0], dtype="i8")
        launch_ts = np.frombuffer(self._launches[1], dtype="f8")
        order = np.argsort(launch_corr, kind="stable")
        launch_corr, launch_ts = launch_corr[order], launch_ts[order]
        at = np.minimum(np.searchsorted(launch_corr, corrs), max(len(launch_corr) - 1, 0))
        found = (launch_corr[at] == corrs) if len(launch_corr) else np.zeros(len(corrs), bool)
        launch = np.where(found, launch_ts[at] if len(launch_ts) else 0.0, np.nan)
        step_of = np.full(len(starts), -1)
        for n, (a, b) in self._cpu_steps.items():
            step_of[(launch >= a) & (launch < b)] = n
        spans = {}
        for n in sorted(self._cpu_steps):
            mask = step_of == n
            if mask.any():
                spans[n] = (float(starts[mask].min()), float(ends[mask].max()))
        # A step's GPU time runs from its first kernel to the next step's first kernel (the
        # gap between them is GPU idle time, waiting for the host), as HTA's iterations do;
        # the last step ends with its last kernel.
        in_order = sorted(spans)
        self._gpu_steps = {n: (spans[n][0], spans[in_order[i + 1]][0] if i + 1 < len(in_order)
                               else spans[n][1]) for i, n in enumerate(in_order)}
        keep = step_of >= 0
        return starts[keep], ends[keep], kinds[keep]


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _union(starts: np.ndarray, ends: np.ndarray) -> float:
    """Length of the union of intervals (``starts`` sorted ascending)."""
    if len(starts) == 0:
        return 0.0
    reach = np.maximum.accumulate(ends)
    # a new segment starts where an interval begins after everything before it has ended
    new = np.empty(len(starts), dtype=bool)
    new[0] = True
    new[1:] = starts[1:] > reach[:-1]
    seg_start = starts[new]
    seg_end = np.append(reach[np.flatnonzero(new)[1:] - 1], reach[-1])
    return float(np.sum(seg_end - seg_start))


def _step(n: int, a: float, b: float, starts: np.ndarray, ends: np.ndarray,
          kinds: np.ndarray) -> StepBreakdown:
    hi = int(np.searchsorted(starts, b, side="left"))
    s, e, k = starts[:hi], ends[:hi], kinds[:hi]
    inside = e > a
    s, e, k = np.maximum(s[inside], a), np.minimum(e[inside], b), k[inside]
    order = np.argsort(s, kind="stable")
    s, e, k = s[order], e[order], k[order]
    compute = _union(s[k == _COMPUTE], e[k == _COMPUTE])
    comm = _union(s[k == _COMM], e[k == _COMM])
    memory = _union(s[k == _MEMORY], e[k == _MEMORY])
    both = k != _MEMORY
    overlap = compute + comm - _union(s[both], e[both])
    busy = _union(s, e)
    return StepBreakdown(step=n, duration=b - a, compute=compute, communication=comm,
                         memory=memory, overlap=max(overlap, 0.0),
                         exposed_communication=max(comm - overlap, 0.0),
                         idle=max((b - a) - busy, 0.0))


@dataclass(frozen=True, slots=True)
class Straggler:
    """The rank the others wait for.

    Attributes:
        rank: it; ``steps``: the steps every rank traced; ``least_in``: steps where it
            communicated least.
        gap_us: median over steps of (others' median communication - its own), microseconds.
        step_us: median step time.
        communication_us: rank -> median communication per step.
    """

    rank: int
    steps: tuple[int, ...]
    least_in: tuple[int, ...]
    gap_us: float
    step_us: float
    communication_us: dict[int, float]


def find_straggler(per_rank: dict[int, list[StepBreakdown]]) -> Straggler | None:
    """Apply the wait-least rule (module doc) to per-rank breakdowns.

    Args:
        per_rank: rank -> its steps (at least two ranks to compare).

    Returns:
        The straggler, or None when no rank meets the rule.
    """
    if len(per_rank) < 2:
        return None
    by_step = {r: {s.step: s for s in steps} for r, steps in per_rank.items()}
    common = sorted(set.intersection(*(set(s) for s in by_step.values())))
    if len(common) < MIN_STEPS:
        return None
    least: dict[int, list[int]] = {r: [] for r in per_rank}
    gaps: dict[int, list[float]] = {r: [] for r in per_rank}
    durations = []
    for n in common:
        comm = {r: by_step[r][n].communication for r in per_rank}
        durations.append(float(np.median([by_step[r][n].duration for r in per_rank])))
        low = min(comm, key=lambda r: (comm[r], r))
        least[low].append(n)
        for r in per_rank:
            others = [c for q, c in comm.items() if q != r]
            gaps[r].append(float(np.median(others)) - comm[r])
    rank = max(least, key=lambda r: (len(least[r]), -r))
    step_us = float(np.median(durations))
    gap = float(np.median(gaps[rank]))
    if len(least[rank]) < MIN_SHARE * len(common) or gap < MIN_GAP * step_us:
        return None
    return Straggler(rank=rank, steps=tuple(common), least_in=tuple(least[rank]), gap_us=gap,
                     step_us=step_us,
                     communication_us={r: float(np.median([by_step[r][n].communication
                                                           for n in common]))
                                       for r in sorted(per_rank)})
