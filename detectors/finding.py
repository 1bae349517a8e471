"""The one result type every detector returns, and the one shape of a detector.

A :class:`Finding` is raised once and cleared once: the cleared one is a copy made by
:meth:`Finding.clear`, with ``cleared=True``, the reason and the step it was raised at in its
evidence. :meth:`Finding.to_dict` is its only JSON form: the agent's ``/findings``, the
WindowReport datagrams, the saved windows and ``laggard analyze --json`` all use it.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, TypeVar, runtime_checkable


class Severity(str, enum.Enum):
    """How urgently a person should act on a finding.

    ``info``: worth knowing; ``warning``: degraded (a slow rank, a throttled GPU);
    ``critical``: the job is failing or corrupt (a fatal XID, a flipped bit, a lost GPU).
    """

    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"


@dataclass(frozen=True, slots=True)
class Finding:
    """Something a detector found that a person can act on.

    Attributes:
        detector: name of the detector that raised it (``"straggler"``, ``"throttle"``, ``"xid"``,
            ``"integrity"``); also the ``detector`` label of ``laggard_findings_total``.
        kind: what was found, within that detector (``"compute"``, ``"xid"``, ``"gpu_lost"``...).
        severity: see :class:`Severity`.
        message: one line a person can act on.
        rank: global rank concerned, if any.
        node: host name concerned, if any.
        gpu: NVML GPU index concerned, if any.
        local_rank: local rank on ``node``, if any.
        step: training step at which it was raised, if any.
        evidence: the numbers that triggered it (JSON-serialisable).
        subject: what is at fault, in words, where rank/node/gpu cannot say it (an offline
            report names ``GPU 0000:9b:00``, ``NVSwitch 0000:05:00.0``, ``ranks 9, 14``).
        source: file(s) the finding was read from (``laggard analyze``), if any.
        cleared: True on the finding that ends an earlier one (:meth:`clear`).
    """

    detector: str
    kind: str
    severity: Severity
    message: str
    rank: int | None = None
    node: str | None = None
    gpu: int | None = None
    local_rank: int | None = None
    step: int | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    subject: str | None = None
    source: str | None = None
    cleared: bool = False

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-serialisable dict (severity as its string value); ``subject`` and
        ``source`` appear only when set and ``cleared`` only when True, so a raised finding's
        form is what it always was (``laggard analyze --json`` included)."""
        out = asdict(self)
        out["severity"] = self.severity.value
        for key in ("subject", "source"):
            if out[key] is None:
                del out[key]
        if not self.cleared:
            del out["cleared"]
        return out

    def clear(self, *, step: int | None, reason: str, message: str,
              severity: Severity | None = None) -> Finding:
        """The finding that ends this one: same detector, kind and subject, ``cleared=True``.

        Args:
            step: the step at which it cleared.
            reason: why, in snake_case (``recovered``, ``not_reporting``, ``reset``...); kept
                in the evidence beside ``raised_step``.
            message: one line saying what ended.
            severity: the cleared finding's severity; the raised one's when None.
        """
        evidence = {**self.evidence, "reason": reason, "raised_step": self.step}
        return dataclasses.replace(self, step=step, message=message, evidence=evidence,
                                   severity=severity or self.severity, cleared=True)


def split_cleared(findings: Sequence[Finding]) -> tuple[list[Finding], list[Finding]]:
    """``(raised, cleared)`` of a detector's output, each in order."""
    return [f for f in findings if not f.cleared], [f for f in findings if f.cleared]


W_contra = TypeVar("W_contra", contravariant=True)


@runtime_checkable
class Detector(Protocol[W_contra]):
    """What every detector is: a name and ``update(window) -> findings``.

    ``update`` takes one window of its input (a :class:`~laggard.detectors.window.RankWindow`,
    a :class:`~laggard.detectors.link.LinkWindow`, the gathered integrity rows, a GPU clock
    sample), is deterministic, never raises on bad input (it counts it in ``stats``), and
    returns the findings raised or cleared by that window, each with ``detector == name``.
    """

    name: str

    def update(self, window: W_contra) -> list[Finding]:
        """Take one window; return the findings raised or cleared by it."""
        ...


#: Every ``kind`` of finding, by ``detector``, that the in-job detectors send to the node agent in
#: WindowReports. These are the only label values the agent takes from the wire for
#: ``laggard_findings_total`` and ``laggard_straggler_active``; anything else is exported as
#: ``other``, so no sender can grow the exposition (tests keep this in step with the detectors).
JOB_FINDING_KINDS: dict[str, frozenset[str]] = {
    "straggler": frozenset({"compute", "data", "communication", "job_slowdown", "gc",
                            "load_imbalance", "stage_imbalance", "waited_for", "node",
                            "moving"}),
    "link": frozenset({"link"}),
    "integrity": frozenset({"sum_mismatch", "check_fault", "nonfinite", "payload_mismatch",
                            "replica_mismatch", "result_mismatch"}),
}
