"""``laggard analyze`` rules for PyTorch profiler (Kineto) traces, one file per rank: the
per-step time breakdown of every rank and the straggler by the wait-least rule
(:mod:`laggard.detectors.kineto`)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, TextIO

import numpy as np

from laggard.analyze.findings import incident, ranks_text, sources_text
from laggard.detectors.finding import Finding, Severity
from laggard.detectors.kineto import RankTrace, StepBreakdown, find_straggler
from laggard.parsers.kineto import KinetoReader

#: Steps listed per rank in a breakdown finding's evidence (the medians cover them all).
MAX_LISTED_STEPS = 200
_RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)


@dataclass(slots=True)
class TraceSummary:
    """What is kept of one rank's trace once read: its steps, not its events."""

    source: str
    rank: int | None
    world_size: int | None
    backend: str | None
    gpu: bool
    steps: list[StepBreakdown]
    groups: dict[str, tuple[str, tuple[int, ...]]] = field(default_factory=dict)
    comm_group: str | None = None


def read_trace(stream: TextIO, source: str) -> TraceSummary:
    """Stream one trace and reduce it to its per-step breakdown.

    Raises:
        laggard.parsers.kineto.TraceError: not a trace, or truncated.
    """
    reader = KinetoReader(stream)
    trace = RankTrace(source)
    for event in reader.events():
        trace.add(event)
    trace.set_meta(reader.meta)
    rank = trace.rank
    if rank is None and (m := _RANK_IN_NAME.search(os.path.basename(source))):
        rank = int(m.group(1))
    top = trace.comm_groups.most_common(1)
    return TraceSummary(source=source, rank=rank, world_size=trace.world_size,
                        backend=trace.backend, gpu=trace.gpu, steps=trace.breakdown(),
                        groups=trace.groups, comm_group=top[0][0] if top else None)


def _ms(us: float) -> float:
    return round(us / 1000.0, 3)


def _medians(steps: list[StepBreakdown]) -> dict[str, float]:
    fields = ("duration", "compute", "communication", "exposed_communication", "overlap",
              "idle", "memory")
    return {f"{name}_ms": _ms(float(np.median([getattr(s, name) for s in steps])))
            for name in fields}


def trace_findings(traces: Iterable[TraceSummary]) -> list[Finding]:
    """One breakdown finding per set of traces, and the straggler when the rule names one."""
    traces = sorted(traces, key=lambda t: (t.rank is None, t.rank or 0))
    with_steps = [t for t in traces if t.steps and t.rank is not None]
    if not with_steps:
        return []
    source = sources_text(t.source for t in with_steps)
    form = "GPU kernels" if any(t.gpu for t in with_steps) else "CPU ranges"
    per_rank = {t.rank: _medians(t.steps) for t in with_steps}
    out = [incident(
        source=source, kind="step_breakdown", severity=Severity.INFO,
        subject=ranks_text(per_rank),
        evidence={"form": form, "unit": "ms", "median_per_step": {str(r): m for r, m in
                                                                  per_rank.items()},
                  "steps": {str(t.rank): [_step_dict(s) for s in t.steps[:MAX_LISTED_STEPS]]
                            for t in with_steps}},
        message=f"per-step time of {ranks_text(per_rank)} from {form} (medians, ms): "
                + "; ".join(f"rank {r}: step {m['duration_ms']:g}, compute {m['compute_ms']:g}, "
                            f"communication {m['communication_ms']:g} (exposed "
                            f"{m['exposed_communication_ms']:g}), idle {m['idle_ms']:g}"
                            for r, m in list(per_rank.items())[:8]))]
    straggler = find_straggler({t.rank: t.steps for t in with_steps if t.rank is not None})
    if straggler is not None:
        out.append(_straggler_finding(source, straggler, with_steps))
    return out


def _step_dict(s: StepBreakdown) -> dict[str, Any]:
    return {"step": s.step, "duration_ms": _ms(s.duration), "compute_ms": _ms(s.compute),
            "communication_ms": _ms(s.communication),
            "exposed_communication_ms": _ms(s.exposed_communication),
            "overlap_ms": _ms(s.overlap), "idle_ms": _ms(s.idle), "memory_ms": _ms(s.memory)}


def _straggler_finding(source: str, st: Any, traces: list[TraceSummary]) -> Finding:
    trace = next(t for t in traces if t.rank == st.rank)
    pg = trace.comm_group or ("0" if "0" in trace.groups else None)
    desc = trace.groups.get(pg, ("", ()))[0] if pg is not None else ""
    others = ", ".join(f"rank {r} {_ms(c):g}" for r, c in st.communication_us.items()
                       if r != st.rank)
    where = f" in PG {pg}" + (f" ({desc})" if desc else "") if pg is not None else ""
    return incident(
        source=source, kind="straggler", severity=Severity.WARNING,
        subject=f"rank {st.rank}",
        evidence={"rank": st.rank, "rule": "wait-least", "steps": list(st.steps),
                  "least_communication_in": list(st.least_in), "gap_ms": _ms(st.gap_us),
                  "median_step_ms": _ms(st.step_us), "pg": pg, "pg_desc": desc or None,
                  "communication_ms": {str(r): _ms(c) for r, c in st.communication_us.items()}},
        message=f"rank {st.rank} is the straggler{where}: it spends the least time in "
                f"collectives in {len(st.least_in)} of {len(st.steps)} steps "
                f"({_ms(st.communication_us[st.rank]):g} ms per step against {others}), so "
                f"the others wait {_ms(st.gap_us):g} ms per step for it "
                f"({100 * st.gap_us / st.step_us:.0f}% of a {_ms(st.step_us):g} ms step); "
                f"look at its compute, data loading and host")
