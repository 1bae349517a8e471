"""The one result type every detector returns."""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any


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

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-serialisable dict (severity as its string value)."""
        out = asdict(self)
        out["severity"] = self.severity.value
        return out


#: Every ``kind`` of finding, by ``detector``, that the in-job detectors send to the node agent in
#: WindowReports. These are the only label values the agent takes from the wire for
#: ``laggard_findings_total`` and ``laggard_straggler_active``; anything else is exported as
#: ``other``, so no sender can grow the exposition (tests keep this in step with the detectors).
JOB_FINDING_KINDS: dict[str, frozenset[str]] = {
    "straggler": frozenset({"compute", "data", "communication", "job_slowdown"}),
    "integrity": frozenset({"sum_mismatch", "check_fault", "nonfinite", "payload_mismatch",
                            "replica_mismatch", "result_mismatch"}),
}
