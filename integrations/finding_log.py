"""Rank 0's log lines of findings: one WARNING line when a finding is raised, one when it clears.

The lines go to the monitor's logger (``laggard.integrations.monitor``, which users and tests
filter on), and their text is part of the interface: people grep for it. A raised finding is
``laggard: LABEL: MESSAGE (step N; EVIDENCE)`` (:func:`log_label`, :func:`evidence_text`), a
cleared one ``laggard: MESSAGE (step N)``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from laggard.detectors.finding import Finding

#: Findings kept in :attr:`FindingLog.findings` and :attr:`FindingLog.cleared` each (the
#: oldest dropped first).
KEPT_FINDINGS = 256


class FindingLog:
    """Logs each finding once when raised and once when cleared, and keeps the latest of each.

    Args:
        logger: where the lines go (the monitor's logger).

    Attributes:
        findings: the raised findings, oldest first, at most :data:`KEPT_FINDINGS`.
        cleared: the cleared findings (``Finding.cleared``), likewise.
    """

    def __init__(self, logger: logging.Logger) -> None:
        self._log = logger
        self.findings: list[Finding] = []
        self.cleared: list[Finding] = []

    def record(self, findings: Iterable[Finding]) -> None:
        """Log and keep one window's findings, in order."""
        for finding in findings:
            if finding.cleared:
                self._log.warning("laggard: %s (step %s)", finding.message, finding.step)
                self.cleared.append(finding)
            else:
                self._log.warning("laggard: %s: %s (step %s; %s)", log_label(finding),
                                  finding.message, finding.step,
                                  evidence_text(finding.evidence))
                self.findings.append(finding)
        # in place: the monitor hands these very lists out as its own attributes
        del self.findings[:-KEPT_FINDINGS], self.cleared[:-KEPT_FINDINGS]


def log_label(finding: Finding) -> str:
    """The word before a raised finding in rank 0's log: its detector, but ``stage imbalance``
    for a stage imbalance (the straggler detector's, and no rank is a straggler)."""
    return "stage imbalance" if finding.kind == "stage_imbalance" else finding.detector


def evidence_text(evidence: dict[str, Any]) -> str:
    """A finding's evidence for a log line, in words (the record keeps every field).

    A straggler finding says how far its test got and against what noise; its slowdown is the
    message's own figure, so not repeated. Any other finding lists its scalar fields, numbers
    to four significant digits.
    """
    test, interval = evidence.get("evidence"), evidence.get("decision_interval")
    if isinstance(test, (int, float)) and isinstance(interval, (int, float)) and interval > 0:
        # the test's accumulated excess in units of its decision interval: raised at 1
        text = f"evidence {test / interval:.2f} of 1 decision interval"
        noise = evidence.get("noise")
        if isinstance(noise, (int, float)):
            text += f", rank-to-rank noise {100 * noise:.1f}% of a step's work"
        return text
    fields = []
    for key, value in evidence.items():
        if isinstance(value, bool) or value is None or isinstance(value, (dict, list, tuple)):
            continue
        shown = f"{value:.4g}" if isinstance(value, float) else str(value)
        fields.append(f"{key.replace('_', ' ')} {shown}")
    return "evidence: " + (", ".join(fields) if fields else "none")


__all__ = ["KEPT_FINDINGS", "FindingLog", "evidence_text", "log_label"]
