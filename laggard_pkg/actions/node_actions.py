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

    def quarantine(self, node: str, reason: str, *, why: str) -> Decision:
        """Take ``node`` out with ``reason`` (``laggard:<kind>:<subject>``); never raises."""
        ...

    def release(self, node: str, *, why: str) -> Decision:
        """Give ``node`` back if laggard took it out; never raises."""
        ...

    def holds(self, node: str) -> bool:
        """True when ``node`` is out of service by laggard's hand (its reason's prefix)."""
        ...


class SlurmNodes:
    """Drain and resume through :class:`~laggard.actions.slurm.Slurm` (scontrol)."""

    name = "drain"

    def __init__(self, slurm: Slurm) -> None:
        self.slurm = slurm

    def quarantine(self, node: str, reason: str, *, why: str) -> Decision:
        """``scontrol update nodename=N state=drain reason=R`` (see :meth:`Slurm.drain`)."""
        return self.slurm.drain(node, reason, why=why)

    def release(self, node: str, *, why: str) -> Decision:
        """``scontrol update nodename=N state=resume`` (see :meth:`Slurm.resume`)."""
        return self.slurm.resume(node, why=why)

    def holds(self, node: str) -> bool:
        """Drained with a ``laggard:`` reason (False when scontrol cannot say)."""
        try:
            return self.slurm.node(node).drained_by_laggard
        except SlurmError:
            return False
