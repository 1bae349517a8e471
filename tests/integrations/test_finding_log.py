"""Rank 0's finding log lines (``integrations/finding_log.py``)."""

from __future__ import annotations

import logging

import pytest

from laggard.detectors.finding import Finding, Severity
from laggard.integrations.finding_log import KEPT_FINDINGS, FindingLog, log_label

LOGGER = "laggard.integrations.monitor"


def _finding(kind: str = "compute", step: int = 19, **kwargs: object) -> Finding:
    return Finding(detector="straggler", kind=kind, severity=Severity.WARNING, rank=2,
                   message="rank 2 is slow", step=step, **kwargs)


def test_raised_and_cleared_lines_and_what_is_kept(caplog: pytest.LogCaptureFixture) -> None:
    log = FindingLog(logging.getLogger(LOGGER))
    kept = log.findings
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        log.record([_finding(evidence={"ranks": 4}), _finding(step=39, cleared=True)])
    assert caplog.messages == ["laggard: straggler: rank 2 is slow (step 19; evidence: ranks 4)",
                               "laggard: rank 2 is slow (step 39)"]
    assert len(log.findings) == len(log.cleared) == 1
    log.record([_finding(step=s) for s in range(KEPT_FINDINGS + 3)])
    assert log.findings is kept and len(kept) == KEPT_FINDINGS  # trimmed in place
    assert kept[-1].step == KEPT_FINDINGS + 2


def test_a_stage_imbalance_is_not_called_a_straggler() -> None:
    assert log_label(_finding(kind="stage_imbalance")) == "stage imbalance"
    assert log_label(_finding()) == "straggler"
