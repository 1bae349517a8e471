"""The finding type of ``laggard analyze`` and the helpers its rule modules share.

The rules live in :mod:`laggard.analyze.gpu` (Xids, lost GPUs, clock events),
:mod:`laggard.analyze.collectives` (watchdog timeouts, desyncs, flight-recorder dumps)
and :mod:`laggard.analyze.network` (bus bandwidth, InfiniBand, interfaces). Each takes
what a parser produced and returns :class:`IncidentFinding` objects; they are pure (no I/O).
The agent's detectors use :class:`~laggard.detectors.finding.Finding`; an incident report names
a subject and a source file instead of rank/node/gpu fields.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from laggard.detectors.finding import Severity

KINDS = ("xid", "sxid", "gpu_lost", "collective_timeout", "collective_mismatch",
         "nccl_network_error", "busbw", "clock_event", "ib_port", "netdev")
SEVERITY_ORDER = {Severity.CRITICAL: 0, Severity.WARNING: 1, Severity.INFO: 2}


@dataclass(slots=True)
class IncidentFinding:
    """One line of ``laggard analyze``'s report.

    Attributes:
        source: file(s) it was read from.
        kind: one of :data:`KINDS`.
        severity: info / warning / critical.
        subject: what is at fault (``GPU 0000:9b:00``, ``ranks 9, 14``, ``mlx5_1 port 1``).
        evidence: the numbers (JSON-serialisable).
        message: one line a person can act on.
    """

    source: str
    kind: str
    severity: Severity
    subject: str
    evidence: dict[str, Any]
    message: str

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` form."""
        return {"source": self.source, "kind": self.kind, "severity": self.severity.value,
                "subject": self.subject, "evidence": self.evidence, "message": self.message}


def sort_findings(findings: Iterable[IncidentFinding]) -> list[IncidentFinding]:
    """Most severe first, then by kind, subject and source (stable, deterministic)."""
    return sorted(findings, key=lambda f: (SEVERITY_ORDER[f.severity], KINDS.index(f.kind),
                                           f.subject, f.source))


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
