"""A node's health verdict from its agent's ``/metrics`` samples and ``/findings``: pure rules.

The rules, each a cause an operator drains a node for (NVIDIA's Xid catalog, DCGM's health
watches and NVSentinel's quarantine triggers act on the same ones):

* ``gpu_lost``: ``laggard_gpu_lost == 1`` (NVML's GpuIsLost, or an Xid 79 of this boot for a GPU
  NVML does not list);
* ``xid``: an Xid finding of the catalog's critical class (:mod:`laggard.detectors.xid_catalog`:
  reset the GPU, reboot, drain, contact support) seen within ``xid_max_age_seconds``; an older
  one is taken as handled (the kernel log holds this boot's history, and a GPU reset does not
  clear it);
* ``row_remap_failure``, ``row_remap_pending``, ``ecc_uncorrected``: NVML's remapped-rows state
  and its volatile uncorrected ECC count (``laggard_gpu_row_remap_failure``,
  ``laggard_gpu_row_remap_pending``, ``laggard_gpu_ecc_errors_total{type="uncorrected"}``): the
  GPU needs a reset (DCGM's "row remap pending" and "DBE" health failures);
* ``clock_event``: a limiting clock-event reason
  (:data:`~laggard.detectors.throttle.LIMITING_REASONS`) active now
  (``laggard_gpu_clock_event_active``) whose throttle finding was raised at least
  ``clock_event_seconds`` ago (the throttle detector raises once per episode and needs a recovery
  to raise again, so the finding's ``last_seen`` is when the current hold began, give or take its
  ``min_samples`` rounds);
* ``straggler``: a straggler finding that names a rank of *this* node (its ``node`` field) and
  has held for ``straggler_seconds`` (first raise to its latest window); only the agent that
  received rank 0's WindowReports has these (the in-job detector runs on rank 0);
* ``hung``: a rank of this node stalled (``laggard_rank_stalled_seconds``) for ``hung_seconds``
  that holds its job up: stuck in its own work, or named by the hang rules among the ranks this
  agent sees (:mod:`laggard.actions.local_hang`); a rank that waits on another node is a victim.

Absent is not failing: a node without GPUs, or a collector that found no hardware, yields no
problem. What cannot be read at all is ``unknown`` (:class:`Verdict`), never healthy.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from laggard.actions.local_hang import local_culprits
from laggard.detectors.throttle import LIMITING_REASONS
from laggard.parsers.exposition import Sample

#: Exit statuses of node-problem-detector's custom plugin protocol
#: (https://github.com/kubernetes/node-problem-detector/blob/master/docs/custom_plugin_monitor.md).
OK, PROBLEM, UNKNOWN = 0, 1, 2

#: Kinds of problem, in the order a verdict names them (the first is the drain reason).
KINDS = ("gpu_lost", "xid", "row_remap_failure", "row_remap_pending", "ecc_uncorrected",
         "clock_event", "straggler", "hung")

#: Straggler kinds that name a rank, or (``node``) a node whose ranks are all slow
#: (job_slowdown, stage_imbalance and moving name neither).
_RANK_STRAGGLER_KINDS = frozenset({"compute", "data", "communication", "gc", "load_imbalance",
                                   "waited_for", "node"})


@dataclass(frozen=True, slots=True)
class Problem:
    """One reason this node is unhealthy.

    Attributes:
        kind: one of :data:`KINDS`.
        subject: what is at fault, one token (``gpu1``, ``0000:91:00``, ``rank3``).
        message: one short line a person can act on.
    """

    kind: str
    subject: str
    message: str


@dataclass(frozen=True, slots=True)
class Verdict:
    """The node's verdict: :data:`OK`, :data:`PROBLEM` or :data:`UNKNOWN`, and why.

    Attributes:
        status: the exit status (node-problem-detector's protocol).
        problems: for :data:`PROBLEM`, in :data:`KINDS` order.
        message: one line: the problems, or why the verdict is unknown, or what was checked.
    """

    status: int
    problems: tuple[Problem, ...] = ()
    message: str = ""


@dataclass(kw_only=True, slots=True)
class Rules:
    """Thresholds of the rules (flags of ``laggard healthcheck``)."""

    xid_max_age_seconds: float = 3600.0
    """A critical Xid older than this is taken as handled (the GPU reset or replaced since)."""

    clock_event_seconds: float = 300.0
    """A limiting clock-event reason must be held this long to make the node unhealthy."""

    straggler_seconds: float = 600.0
    """A rank of this node must be named a straggler this long (its finding held)."""

    hung_seconds: float = 600.0
    """A rank of this node stalled this long is a problem."""

    clock_event_reasons: frozenset[str] = LIMITING_REASONS
    """The clock-event reasons that count (a subset of the throttle detector's limiting ones)."""

    def __post_init__(self) -> None:
        for name in ("xid_max_age_seconds", "clock_event_seconds", "straggler_seconds",
                     "hung_seconds"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and value >= 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a finite number >= 0, not {value!r}")
        unknown = set(self.clock_event_reasons) - LIMITING_REASONS
        if unknown or not self.clock_event_reasons:
            raise ValueError(f"clock_event_reasons: {sorted(unknown) or 'none'}; choose among "
                             f"{', '.join(sorted(LIMITING_REASONS))}")


def parse_rfc3339(text: Any) -> float | None:
    """Unix seconds of an RFC 3339 time (``2026-12-01T21:42:55.120Z``); None if unreadable."""
    if not isinstance(text, str):
        return None
    try:
        moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    return moment.timestamp()


def _holds(doc: Mapping[str, Any]) -> bool:
    return not doc.get("cleared") and not doc.get("cleared_at") and not doc.get("ended_at")


def _gpu_subject(labels: Mapping[str, Any]) -> str:
    gpu = labels.get("gpu")
    if gpu not in (None, ""):
        return f"gpu{gpu}"
    return str(labels.get("pci_bus_id") or "gpu")


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 60 else f"{seconds:.0f} s"


def _hardware(samples: Sequence[Sample], findings: Sequence[Mapping[str, Any]], rules: Rules,
              now: float) -> list[Problem]:
    out: list[Problem] = []
    for s in samples:
        if s.name == "laggard_gpu_lost" and s.value == 1:
            gpu, pci = s.labels.get("gpu"), s.labels.get("pci_bus_id")
            where = f"GPU {gpu} ({pci})" if gpu and pci else f"GPU {gpu or pci}"
            out.append(Problem("gpu_lost", _gpu_subject(s.labels), f"{where} lost"))
    for doc in findings:
        if doc.get("detector") != "xid" or doc.get("kind") != "xid":
            continue
        if doc.get("severity") != "critical" or not _holds(doc):
            continue
        seen = parse_rfc3339(doc.get("last_seen"))
        if seen is None or now - seen > rules.xid_max_age_seconds:
            continue
        evidence = doc.get("evidence")
        if not isinstance(evidence, dict):
            evidence = {}
        subject = _gpu_subject({"gpu": doc.get("gpu"), "pci_bus_id": evidence.get("pci_bus_id")})
        # ``<xid>/<gpu>``: the subject laggard remediate writes for LaggardGpuXidCritical
        out.append(Problem("xid", f"{evidence.get('xid', '?')}/{subject}",
                           f"critical Xid {evidence.get('xid', '?')} on {subject} "
                           f"({evidence.get('action', 'see the catalog')})"))
    memory = {"laggard_gpu_row_remap_failure": ("row_remap_failure", "row remap failed"),
              "laggard_gpu_row_remap_pending": ("row_remap_pending", "row remap pending")}
    for s in samples:
        if s.name in memory and s.value >= 1:
            kind, text = memory[s.name]
            out.append(Problem(kind, _gpu_subject(s.labels),
                               f"{_gpu_subject(s.labels)}: {text} (reset the GPU)"))
        elif (s.name == "laggard_gpu_ecc_errors_total" and s.labels.get("type") == "uncorrected"
              and s.value > 0):
            out.append(Problem("ecc_uncorrected", _gpu_subject(s.labels),
                               f"{_gpu_subject(s.labels)}: {s.value:.0f} uncorrected ECC errors "
                               "since the driver loaded"))
    return out


def _clock_events(samples: Sequence[Sample], findings: Sequence[Mapping[str, Any]],
                  rules: Rules, now: float) -> list[Problem]:
    active: dict[str, set[str]] = {}
    for s in samples:
        if (s.name == "laggard_gpu_clock_event_active" and s.value == 1
                and s.labels.get("reason") in rules.clock_event_reasons):
            active.setdefault(str(s.labels.get("gpu")), set()).add(str(s.labels["reason"]))
    out = []
    for doc in findings:
        if doc.get("detector") != "throttle" or str(doc.get("gpu")) not in active:
            continue
        since = parse_rfc3339(doc.get("last_seen"))
        if since is None or now - since < rules.clock_event_seconds:
            continue
        reasons = ",".join(sorted(active.pop(str(doc.get("gpu")))))
        out.append(Problem("clock_event", f"gpu{doc.get('gpu')}",
                           f"GPU {doc.get('gpu')} clocks held by {reasons} for "
                           f"{_minutes(now - since)}"))
    return out


def _job(samples: Sequence[Sample], findings: Sequence[Mapping[str, Any]], node: str | None,
         rules: Rules, now: float) -> list[Problem]:
    out = []
    named: set[str] = set()
    for doc in findings:
        if (doc.get("detector") != "straggler" or doc.get("kind") not in _RANK_STRAGGLER_KINDS
                or not _holds(doc) or node is None or doc.get("node") != node):
            continue
        first, last = parse_rfc3339(doc.get("first_seen")), parse_rfc3339(doc.get("last_seen"))
        rank = str(doc.get("rank"))
        if first is None or last is None or last - first < rules.straggler_seconds:
            continue
        subject = "node" if doc.get("kind") == "node" else f"rank{rank}"
        if subject in named:
            continue
        named.add(subject)
        who = "its ranks all" if subject == "node" else f"rank {rank} ({doc.get('kind')})"
        out.append(Problem("straggler", subject,
                           f"{who} a straggler for {_minutes(last - first)}"))
    stalled: dict[tuple[str, int], float] = {}
    for s in samples:
        if s.name == "laggard_rank_stalled_seconds" and s.value >= max(rules.hung_seconds, 1e-9):
            rank = s.labels.get("rank", "")
            if rank.isdigit():
                stalled[(s.labels.get("run", ""), int(rank))] = s.value
    for run, rank in sorted(local_culprits(samples, set(stalled))):
        out.append(Problem("hung", f"rank{rank}",
                           f"rank {rank} of run {run} stalled for "
                           f"{_minutes(stalled[(run, rank)])}, holding its job up"))
    return out


def agent_node(samples: Iterable[Sample]) -> str | None:
    """The agent's node name (``laggard_agent_info{node}``), None if it does not say."""
    return next((s.labels.get("node") for s in samples if s.name == "laggard_agent_info"), None)


def judge(samples: Sequence[Sample], findings: Sequence[Mapping[str, Any]], rules: Rules,
          now: float) -> Verdict:
    """The node's verdict from one read of its agent.

    Args:
        samples: the agent's ``/metrics``, parsed
            (:func:`laggard.parsers.exposition.parse_exposition`).
        findings: the agent's ``/findings`` (a list of finding dicts with ``first_seen`` and
            ``last_seen``, RFC 3339); entries that are not dicts are ignored.
        rules: the thresholds.
        now: Unix seconds.

    Returns:
        :data:`PROBLEM` with the problems in :data:`KINDS` order; :data:`UNKNOWN` when the
        metrics hold no ``laggard_agent_info`` (not a laggard agent); else :data:`OK`.
    """
    docs = [d for d in findings if isinstance(d, Mapping)]
    node = agent_node(samples)
    if node is None:
        return Verdict(UNKNOWN, message="no laggard_agent_info in /metrics: not a laggard agent")
    problems = (_hardware(samples, docs, rules, now) + _clock_events(samples, docs, rules, now)
                + _job(samples, docs, node, rules, now))
    problems.sort(key=lambda p: KINDS.index(p.kind))
    if not problems:
        gpus = sum(1 for s in samples if s.name == "laggard_gpu_info")
        checked = f"{gpus} GPUs checked" if gpus else "no GPU"
        return Verdict(OK, message=f"node {node} healthy ({checked})")
    more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
    return Verdict(PROBLEM, tuple(problems), f"{problems[0].message}{more}")
