"""One audit line per decision: what was (or would have been) done to which node, and why.

Every action module (the Slurm drain, ``laggard remediate``'s cordon and hostfile) records each
decision it takes, acted or not, as one :class:`Decision` logged as one logfmt line on the
``laggard.audit`` logger, so a person can answer "why is this node drained?" with ``grep``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

#: The logger every decision is written to (route it to a file to keep an audit trail).
AUDIT_LOGGER = "laggard.audit"

#: Outcomes: acted; would have acted (dry run); skipped (nothing to do, or not ours to do);
#: failed (the command or API call failed: ``detail`` says how).
OUTCOMES = ("acted", "would_act", "skipped", "failed")

_FIELDS = ("action", "target", "outcome", "reason", "why", "detail", "source")


@dataclass(frozen=True, slots=True)
class Decision:
    """One decision about one node.

    Attributes:
        action: what was decided: ``drain``, ``resume``, ``cordon``, ``exclude``...
        target: the node it is about.
        outcome: one of :data:`OUTCOMES`.
        why: what asked for it, one line (the finding or the alert).
        reason: the structured reason written on the node (``laggard:<kind>:<subject>``).
        detail: for ``skipped`` and ``failed``, why not; for ``acted`` and ``would_act``, the
            command run or that would have run.
        source: who decided (``healthcheck``, ``remediate``, an alert's fingerprint).

    Raises:
        ValueError: an outcome outside :data:`OUTCOMES`.
    """

    action: str
    target: str
    outcome: str
    why: str
    reason: str = ""
    detail: str = ""
    source: str = ""

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"outcome {self.outcome!r}: one of {', '.join(OUTCOMES)}")

    @property
    def acted(self) -> bool:
        """True when the action was carried out."""
        return self.outcome == "acted"

    def line(self) -> str:
        """The decision as one logfmt line: ``audit action=drain target=n1 outcome=...``.

        Values with a space, ``=`` or ``"`` are quoted (``"`` and ``\\`` escaped); control
        characters are escaped, so a message taken from an agent cannot forge a second line.
        Empty fields are left out.
        """
        parts = ["audit"]
        for name in _FIELDS:
            value = getattr(self, name)
            if value:
                parts.append(f"{name}={_logfmt(str(value))}")
        return " ".join(parts)


def _logfmt(value: str) -> str:
    value = "".join(c if c.isprintable() else repr(c)[1:-1] for c in value)
    if value and not any(c in value for c in ' ="\\'):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def record(decision: Decision, *, log: logging.Logger | None = None) -> Decision:
    """Log ``decision`` as its one audit line (WARNING when it failed, INFO otherwise).

    Args:
        decision: what was decided.
        log: the logger; ``logging.getLogger(AUDIT_LOGGER)`` when None.

    Returns:
        ``decision``, so a caller can ``return record(Decision(...))``.
    """
    logger = log or logging.getLogger(AUDIT_LOGGER)
    level = logging.WARNING if decision.outcome == "failed" else logging.INFO
    logger.log(level, "%s", decision.line())
    return decision
