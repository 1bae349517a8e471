"""What `laggard remediate` can do to a node, behind one interface: Slurm's drain
(:mod:`laggard.actions.slurm`), Kubernetes' cordon and taint
(:mod:`laggard.actions.kubernetes_nodes`), or a file of excluded hosts for the next launch
(:mod:`laggard.actions.exclude_file`)."""

from __future__ import annotations

from typing import Protocol

from laggard.actions.audit import Decision
from laggard.actions.slurm import Slurm, SlurmError


class NodeAction(Protocol):
    """Take a node out of service and give it back, recording one audit line per call."""

    #: the audit line's ``action`` of :meth:`quarantine` (``drain``, ``cordon``, ``exclude``)
    name: str
    #: the audit line's ``action`` of :meth:`release` (``resume``, ``uncordon``, ``include``)
    release_name: str

    def quarantine(self, node: str, reason: str, *, why: str) -> Decision:
        """Take ``node`` out with ``reason`` (``laggard:<kind>:<subject>``); never raises."""
        ...

    def release(self, node: str, *, why: str) -> Decision:
        """Give ``node`` back if laggard took it out; never raises."""
        ...

    def held_reason(self, node: str) -> str:
        """laggard's reason on ``node`` when it is out of service by laggard's hand (the
        ``laggard:`` prefix), else ""; "" too when the node cannot be read."""
        ...


class SlurmNodes:
    """Drain and resume through :class:`~laggard.actions.slurm.Slurm` (scontrol)."""

    name = "drain"
    release_name = "resume"

    def __init__(self, slurm: Slurm) -> None:
        self.slurm = slurm

    def quarantine(self, node: str, reason: str, *, why: str) -> Decision:
        """``scontrol update nodename=N state=drain reason=R`` (see :meth:`Slurm.drain`)."""
        return self.slurm.drain(node, reason, why=why)

    def release(self, node: str, *, why: str) -> Decision:
        """``scontrol update nodename=N state=resume`` (see :meth:`Slurm.resume`)."""
        return self.slurm.resume(node, why=why)

    def held_reason(self, node: str) -> str:
        """The reason of a node drained with a ``laggard:`` reason ("" when scontrol cannot
        say)."""
        try:
            state = self.slurm.node(node)
        except SlurmError:
            return ""
        return state.reason if state.drained_by_laggard else ""
