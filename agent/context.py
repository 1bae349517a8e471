"""AgentContext: what the daemon shares with the collectors it builds."""

from __future__ import annotations

import threading
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from laggard.detectors.finding import Finding

#: Findings kept in memory for ``/findings``; older ones drop off (counters keep counting).
MAX_RECENT_FINDINGS = 256


class FindingLog:
    """Thread-safe, bounded record of findings raised on this node.

    Counts every finding by ``(detector, kind, severity)`` for ``laggard_findings_total`` and
    keeps the last :data:`MAX_RECENT_FINDINGS` of them.
    """

    def __init__(self, maxlen: int = MAX_RECENT_FINDINGS) -> None:
        self._lock = threading.Lock()
        self._recent: deque[dict[str, Any]] = deque(maxlen=maxlen)
        self._counts: Counter[tuple[str, str, str]] = Counter()

    def add(self, finding: Finding | dict[str, Any]) -> None:
        """Record one finding (a :class:`Finding` or its ``to_dict()`` form)."""
        doc = finding.to_dict() if isinstance(finding, Finding) else dict(finding)
        key = (str(doc.get("detector")), str(doc.get("kind")), str(doc.get("severity")))
        with self._lock:
            self._recent.append(doc)
            if not doc.get("cleared"):
                self._counts[key] += 1

    def counts(self) -> dict[tuple[str, str, str], int]:
        """``(detector, kind, severity) -> count`` since the agent started."""
        with self._lock:
            return dict(self._counts)

    def recent(self) -> list[dict[str, Any]]:
        """The most recent findings, oldest first."""
        with self._lock:
            return list(self._recent)


@dataclass(slots=True)
class AgentContext:
    """Shared state handed to every collector factory.

    Attributes:
        findings: where collectors and detectors running in the agent put their findings.
        node: this node's name (``node`` label).
    """

    node: str
    findings: FindingLog = field(default_factory=FindingLog)
