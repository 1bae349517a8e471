"""The job's hosts during a window: were they CPU-bound, was every GPU throttled.

The host-context participant (:mod:`laggard.integrations.host_context`) adds
:data:`HOST_CONTEXT_COLUMNS` to every rank's window record: its host's 1-minute load average per
CPU, the share of the window in which a task waited for a CPU (PSI ``some``), the CPU time the
hypervisor stole, and the rank's own involuntary context switches per second. This module is
the pure half: the columns, :func:`describe_host_contention` (what the job's nodes showed during
the window, one sentence), and :func:`with_host_cause`, which puts that sentence into a
whole-job slowdown finding before its generic guess (shared storage, the fabric, a job-wide
change of batch), so a job slowed by its own hosts is said so.

Thresholds (a node is CPU-bound when one holds):

- :data:`MIN_CPU_PRESSURE_RATIO` (0.10): PSI ``some`` is "the share of time in which at least
  some tasks are stalled" waiting for a CPU (kernel ``Documentation/accounting/psi.rst``). The
  kernel sets no alarm level; 0.10 is the straggler detector's whole-job slowdown threshold
  (``StragglerDetector.Config.job_slowdown_threshold``): a CPU wait that costs the ranks a
  tenth of their time shows as at least a tenth of ``some``.
- :data:`MAX_LOAD_PER_CPU` (1.0), used only where the kernel has no PSI: more runnable threads
  than CPUs is CPU saturation in Gregg's USE method ("load average ... greater than CPU count",
  USE method Linux checklist); node_exporter's node-mixin alerts (``NodeSystemSaturation``) at 2
  per CPU over 15 minutes, a level for paging, not for naming a window's cause. Linux's load
  also counts tasks in uninterruptible (I/O) sleep, which is why PSI, CPU-only, comes first.
- :data:`MIN_STEAL_RATIO` (0.10): the share of the host's CPU time a hypervisor ran other guests
  on (``steal`` in ``/proc/stat``, ``man 5 proc``); the same tenth as above.

The GPU half reads the GPU-state participant's columns
(:mod:`laggard.detectors.gpu_state`: :data:`~laggard.detectors.throttle.LIMITING_REASONS`
active in at least :data:`~laggard.detectors.gpu_state.MIN_REASON_RATIO` of the window, as
:func:`~laggard.detectors.gpu_state.describe_cause` names them for one rank).
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from laggard.detectors.finding import Finding
from laggard.detectors.gpu_state import MIN_REASON_RATIO, REASONS, SOURCE_NVML, reason_column
from laggard.detectors.stats import evidence_round
from laggard.detectors.throttle import LIMITING_REASONS
from laggard.detectors.window import WindowColumn, WindowRecord

#: PSI ``some`` share of the window at or above which a node is CPU-bound (module docstring).
MIN_CPU_PRESSURE_RATIO = 0.10
#: 1-minute load per CPU above which a node without PSI is CPU-bound (module docstring).
MAX_LOAD_PER_CPU = 1.0
#: Share of CPU time stolen by the hypervisor at or above which a node is CPU-bound.
MIN_STEAL_RATIO = 0.10
#: Nodes named in a sentence or the evidence at most (a finding travels in one datagram).
MAX_NAMED_NODES = 8

#: What the host-context participant adds to every rank's window record (one value per window,
#: ``reduce="last"``; NaN where not measured).
HOST_CONTEXT_COLUMNS: tuple[WindowColumn, ...] = (
    WindowColumn("host_load1_per_cpu", "ratio", "last",
                 "the host's 1-minute load average per logical CPU at the window's end "
                 "(os.getloadavg()[0] / psutil.cpu_count())"),
    WindowColumn("host_cpus", "count", "last",
                 "logical CPUs of the host (psutil.cpu_count()); NaN where psutil cannot tell"),
    WindowColumn("host_cpu_pressure_some_ratio", "ratio", "last",
                 "share of the window in which some task of the host waited for a CPU "
                 "(/proc/pressure/cpu 'some' total, its delta over the window); NaN without PSI"),
    WindowColumn("host_cpu_steal_ratio", "ratio", "last",
                 "share of the host's CPU time stolen by the hypervisor during the window "
                 "(psutil.cpu_times() steal delta / all modes' delta); NaN where not counted"),
    WindowColumn("rank_involuntary_switches_per_second", "rate", "last",
                 "involuntary context switches per second of the rank's main thread during "
                 "the window (psutil Process.num_ctx_switches: the scheduler took its CPU)"),
)
#: Names of :data:`HOST_CONTEXT_COLUMNS`.
HOST_CONTEXT_COLUMN_NAMES: tuple[str, ...] = tuple(c.name for c in HOST_CONTEXT_COLUMNS)

#: The marker of the whole-job slowdown's generic guess (detectors/straggler.py), before which
#: :func:`with_host_cause` puts what the hosts showed.
_GENERIC_GUESS = "not one rank: check "


def describe_host_contention(record: WindowRecord) -> tuple[str, dict[str, Any]] | None:
    """What the job's hosts showed during the window: CPU-bound nodes, every GPU throttled.

    Each node's value of a column is the median over its ranks' rows (they read the same host);
    without ``record.nodes`` every rank counts as a host of its own and the sentence says
    "ranks' hosts".

    Args:
        record: a gathered window record; reads :data:`HOST_CONTEXT_COLUMN_NAMES` and, where
            present, the GPU-state columns, by name.

    Returns:
        ``(text, evidence)``: ``text`` such as ``"the hosts were CPU-bound: 1 of 1 nodes
        (node07), load 3.1 per CPU, CPU pressure 62% (PSI some), ranks preempted 140/s: other
        processes compete with the ranks for CPU"``; ``evidence`` the numbers (JSON-serialisable,
        ratios as ratios, at most :data:`MAX_NAMED_NODES` nodes named). None when the record
        has none of the host columns, or neither a CPU-bound node nor every GPU throttled.
    """
    if not any(name in record for name in HOST_CONTEXT_COLUMN_NAMES):
        return None
    parts: list[str] = []
    evidence: dict[str, Any] = {}
    host = _cpu_bound(record)
    if host is not None:
        parts.append(host[0])
        evidence.update(host[1])
    gpus = _every_gpu_throttled(record)
    if gpus is not None:
        parts.append(gpus[0])
        evidence["gpus_throttled"] = gpus[1]
    if not parts:
        return None
    return "; ".join(parts), evidence


def with_host_cause(finding: Finding, record: WindowRecord) -> Finding:
    """A raised ``job_slowdown`` finding that names what its hosts showed before it guesses.

    ``"... not one rank: check shared storage, ..."`` becomes ``"... not one rank: <host text>;
    else check shared storage, ..."`` (the text appended after ``"; "`` if the message has no
    such guess), and the evidence gains ``"host"``. Any other finding, a cleared one, or a window
    whose hosts showed nothing (:func:`describe_host_contention` None) is returned as it is.

    Args:
        finding: a finding of the straggler participant.
        record: the window record the finding was raised on.
    """
    if finding.kind != "job_slowdown" or finding.cleared:
        return finding
    described = describe_host_contention(record)
    if described is None:
        return finding
    text, evidence = described
    if _GENERIC_GUESS in finding.message:
        message = finding.message.replace(_GENERIC_GUESS, f"not one rank: {text}; else check ",
                                          1)
    else:
        message = f"{finding.message}; {text}"
    return dataclasses.replace(finding, message=message,
                               evidence={**finding.evidence, "host": evidence})


def _cpu_bound(record: WindowRecord) -> tuple[str, dict[str, Any]] | None:
    """The host half of :func:`describe_host_contention`."""
    names, rows = _hosts(record)
    load = _per_host(record, "host_load1_per_cpu", rows)
    pressure = _per_host(record, "host_cpu_pressure_some_ratio", rows)
    steal = _per_host(record, "host_cpu_steal_ratio", rows)
    with np.errstate(invalid="ignore"):
        by_pressure = pressure >= MIN_CPU_PRESSURE_RATIO
        by_load = np.isnan(pressure) & (load > MAX_LOAD_PER_CPU)
        by_steal = steal >= MIN_STEAL_RATIO
    bound = by_pressure | by_load | by_steal
    if not bound.any():
        return None
    hosts = "nodes" if record.nodes is not None else "ranks' hosts"
    named = [names[i] for i in np.flatnonzero(bound)[:MAX_NAMED_NODES]]
    k, n = int(bound.sum()), len(names)
    text = f"the hosts were CPU-bound: {k} of {n} {hosts}"
    if record.nodes is not None and k <= 3:
        text += f" ({', '.join(named)})"
    upto = "up to " if k > 1 else ""
    figures = []
    if np.isfinite(load[bound]).any():
        figures.append(f"load {upto}{np.nanmax(load[bound]):.1f} per CPU")
    if np.isfinite(pressure[bound]).any():
        figures.append(f"CPU pressure {upto}{100 * np.nanmax(pressure[bound]):.0f}% (PSI some)")
    if by_steal.any():
        figures.append(f"steal {upto}{100 * np.nanmax(steal[by_steal]):.0f}%")
    cpus = _per_host(record, "host_cpus", rows)
    ranks = np.array([r.size for r in rows], dtype=np.float64)
    with np.errstate(invalid="ignore"):
        oversubscribed = bound & (ranks > cpus)  # NaN CPUs: not known to be
    if oversubscribed.any():
        worst = int(np.flatnonzero(oversubscribed)[np.argmax((ranks / cpus)[oversubscribed])])
        figures.append(f"{ranks[worst]:.0f} ranks on {cpus[worst]:.0f} CPUs"
                       + (f" ({names[worst]})" if k > 1 and record.nodes is not None else ""))
    switches = record.get("rank_involuntary_switches_per_second")
    preempted = _nanmedian(switches) if switches is not None else math.nan
    if math.isfinite(preempted):
        figures.append(f"ranks preempted {preempted:.0f}/s (median)")
    if figures:
        text += ", " + ", ".join(figures)
    if by_steal.any() and not (by_pressure | by_load).any():
        text += ": the hypervisor gives their CPUs to other guests"
    elif oversubscribed.any():
        text += ": the job runs more ranks than its hosts have CPUs"
        with np.errstate(invalid="ignore"):
            # a run queue longer than the ranks (each one runnable thread at most while it
            # computes): something besides them runs there too
            crowded = (load[oversubscribed] > (ranks / cpus)[oversubscribed]).any()
        if crowded:
            text += ", and other processes compete with them"
    else:
        text += ": other processes compete with the ranks for CPU"
    evidence: dict[str, Any] = {
        "nodes": n,
        "cpu_bound_nodes": k,
        "named": named,
        "load1_per_cpu_max": evidence_round(_nanmax(load[bound])),
        "cpu_pressure_some_ratio_max": evidence_round(_nanmax(pressure[bound])),
        "steal_ratio_max": evidence_round(_nanmax(steal[bound])),
        "involuntary_switches_per_second_median": evidence_round(preempted),
        "oversubscribed_nodes": int(oversubscribed.sum()),
        "thresholds": {"cpu_pressure_some_ratio": MIN_CPU_PRESSURE_RATIO,
                       "load1_per_cpu": MAX_LOAD_PER_CPU, "steal_ratio": MIN_STEAL_RATIO},
    }
    return text, evidence


def _every_gpu_throttled(record: WindowRecord) -> tuple[str, dict[str, Any]] | None:
    """Every rank's GPU (NVML state) held by a limiting clock-event reason in the window."""
    source = record.get("gpu_state_source")
    if source is None or not source.size or not np.all(source == SOURCE_NVML):
        return None
    limiting = [r for r in REASONS if r in LIMITING_REASONS]
    ratios = record.table([reason_column(r) for r in limiting])  # (R, reasons)
    with np.errstate(invalid="ignore"):
        active = ratios >= MIN_REASON_RATIO
    if not active.any(axis=1).all():
        return None
    counts = Counter({r: int(n) for r, n in zip(limiting, active.sum(axis=0), strict=True)
                      if n})
    gpus = int(source.size)
    reasons = ", ".join(f"{r} on {n} of {gpus}" for r, n in counts.most_common())
    text = f"every GPU was throttled ({reasons} GPUs)"
    return text, {"gpus": gpus, "reasons": dict(counts.most_common())}


def _hosts(record: WindowRecord) -> tuple[list[str], list[np.ndarray]]:
    """Host names and each host's rows: by ``record.nodes``, else one host per rank."""
    if record.nodes is None or len(record.nodes) != record.ranks.size:
        return [f"rank {int(r)}" for r in record.ranks], [np.array([i]) for i in
                                                          range(record.ranks.size)]
    order: dict[str, list[int]] = {}
    for i, node in enumerate(record.nodes):
        order.setdefault(str(node), []).append(i)
    return list(order), [np.array(v) for v in order.values()]


def _per_host(record: WindowRecord, name: str, rows: Sequence[np.ndarray]) -> np.ndarray:
    """``(hosts,)`` median of column ``name`` over each host's rows (NaN: none measured)."""
    column = record.get(name)
    if column is None:
        return np.full(len(rows), np.nan)
    return np.array([_nanmedian(column[r]) for r in rows])


def _nanmedian(values: np.ndarray) -> float:
    finite = values[np.isfinite(values)]
    return float(np.median(finite)) if finite.size else math.nan


def _nanmax(values: np.ndarray) -> float:
    finite = values[np.isfinite(values)]
    return float(finite.max()) if finite.size else math.nan
