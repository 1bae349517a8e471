"""How ``laggard analyze`` builds and orders findings, and the helpers its rule modules share.

The rules live in :mod:`laggard.analyze.gpu` (Xids, lost GPUs, clock events),
:mod:`laggard.analyze.collectives` (watchdog timeouts, desyncs, flight-recorder dumps)
and :mod:`laggard.analyze.network` (bus bandwidth, InfiniBand, interfaces). Each takes
what a parser produced and returns :class:`~laggard.detectors.finding.Finding` objects (built
by :func:`incident`, with a ``subject`` and a ``source`` file); they are pure (no I/O).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from laggard.detectors.finding import Finding, Severity

KINDS = ("xid", "sxid", "gpu_lost", "collective_timeout", "collective_stuck", "p2p_stall",
         "rank_silent", "collective_mismatch", "straggler", "nccl_network_error", "busbw",
         "clock_event", "ib_port", "netdev", "step_breakdown")
SEVERITY_ORDER = {Severity.CRITICAL: 0, Severity.WARNING: 1, Severity.INFO: 2}


#: ``detector`` of every finding ``laggard analyze`` builds.
DETECTOR = "analyze"


def incident(*, source: str, kind: str, severity: Severity, subject: str,
             evidence: dict[str, Any], message: str, node: str | None = None) -> Finding:
    """One line of ``laggard analyze``'s report, as the project's one result type.

    Args:
        source: file(s) it was read from.
        kind: one of :data:`KINDS`.
        severity: info / warning / critical.
        subject: what is at fault (``GPU 0000:9b:00``, ``ranks 9, 14``, ``mlx5_1 port 1``).
        evidence: the numbers (JSON-serialisable).
        message: one line a person can act on.
        node: the host at fault, where the input names one (a syslog HOSTNAME, a pdsh prefix,
            NCCL's hostname).

    Returns:
        A :class:`~laggard.detectors.finding.Finding` with ``detector="analyze"``.
    """
    return Finding(detector=DETECTOR, kind=kind, severity=severity, message=message,
                   subject=subject, source=source, evidence=evidence, node=node)


def report_dict(finding: Finding) -> dict[str, Any]:
    """The ``--json`` form of one finding: ``source, kind, severity, subject, evidence,
    message`` (the schema ``laggard analyze --json`` has always printed), and ``node``: the
    host at fault, or None where the input names none (added in issue 25; keys are only
    ever added)."""
    return {"source": finding.source or "", "kind": finding.kind,
            "severity": finding.severity.value, "subject": finding.subject or "",
            "evidence": finding.evidence, "message": finding.message, "node": finding.node}


def sort_findings(findings: Iterable[Finding]) -> list[Finding]:
    """Most severe first, then by kind, subject and source (stable, deterministic)."""
    return sorted(findings, key=lambda f: (SEVERITY_ORDER[f.severity], KINDS.index(f.kind),
                                           f.subject or "", f.source or ""))


def ranks_text(ranks: Iterable[int]) -> str:
    """``[0, 3, 4]`` -> ``"ranks 0, 3, 4"``, ``[3]`` -> ``"rank 3"``; long runs are kept whole
    (they are the point)."""
    unique = sorted(set(ranks))
    if not unique:
        return "no rank"
    return ("rank " if len(unique) == 1 else "ranks ") + ", ".join(map(str, unique))


def sources_text(sources: Iterable[str]) -> str:
    """Join the files a finding came from; more than 4 are summarised."""
    unique = sorted(set(sources))
    if len(unique) > 4:
        return ", ".join(unique[:3]) + f" and {len(unique) - 3} more"
    return ", ".join(unique)


def location_host(locations: dict[str, str]) -> str | None:
    """The one host of ``{rank: "host GPU dddd:bb:dd (cudaDev N)"}`` locations (what
    ``collectives.rank_locations`` builds), or None when they are empty or span several hosts:
    a finding's ``node``."""
    hosts = {where.split(" GPU ", 1)[0] for where in locations.values()}
    return hosts.pop() if len(hosts) == 1 else None
