"""A run belongs to its senders (issue 32): who may write a run label on this agent.

The first sender the kernel names on the Unix socket (its uid, and its Slurm job where its
cgroup names one) owns a run; another uid's records for it are refused, root's are admitted and
counted, and a run none of whose ranks can still send is free to claim again. Pure functions of
a run's state and the kernel's :class:`~laggard.agent.sender.SenderIdentity`; the run table
(``run_table.py``) calls them under its lock and counts what they decide. The threat model they
implement: ``docs/agent.md``, "Threat model".
"""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

from laggard.agent.run_state import RankState, RunOwner, RunState
from laggard.agent.sender import SenderIdentity
from laggard.wire import WindowReport

__all__ = ["ROOT_UID", "Admission", "admission", "claim", "refusal_text", "with_sender"]

#: The node's admin, who can stop or trace any process anyway: admitted to every run, counted.
ROOT_UID = 0

#: How a sender stands to a run: ``unowned`` (no owner yet: it may claim it), ``owner`` (the
#: owner's uid, and Slurm job where both are known), ``admin`` (root), ``freed`` (the owner's
#: ranks are all gone: the owner is dropped and the sender may claim it), ``foreign`` (refused).
Admission = Literal["unowned", "owner", "admin", "freed", "foreign"]


def admission(run: RunState | None, sender: SenderIdentity | None) -> Admission:
    """How ``sender`` stands to ``run`` (None: a run not kept yet). Drops ``run.owner`` when it
    returns ``freed``.

    Args:
        run: the run's state on the agent, or None.
        sender: the kernel's identity of the datagram's sender; None over UDP.
    """
    owner = run.owner if run is not None else None
    if run is None or owner is None:
        return "unowned"
    uid = sender.uid if sender is not None else None
    if sender is not None and uid is not None:
        cgroup = sender.owner_cgroup()
        # A sender whose cgroup is unknown (exited, another pid namespace) is its uid.
        if uid == owner.uid and (cgroup is None or owner.cgroup is None
                                 or cgroup == owner.cgroup):
            return "owner"
        if uid == ROOT_UID:
            return "admin"
    if not any(_alive(state) for state in run.ranks.values()):
        run.owner = None  # its ranks are gone: the run label is free to claim again
        return "freed"
    return "foreign"


def refusal_text(what: str, run_name: str, owner: RunOwner,
                 sender: SenderIdentity | None) -> tuple[str, tuple[object, ...]]:
    """The once-only log key and the arguments of the refusal line for a ``foreign`` sender:
    ``(what from whom, run, owner uid, owner's cgroup note, owner pid)``."""
    uid = sender.uid if sender is not None else None
    cgroup = f" ({owner.cgroup})" if owner.cgroup else ""
    if sender is None or uid is None:
        return ("foreign_sender:udp", (f"a {what} without sender identity (UDP)", run_name,
                                       owner.uid, cgroup, owner.pid))
    return (f"foreign_sender:{uid}", (f"a {what} from pid {sender.pid} uid {uid}", run_name,
                                      owner.uid, cgroup, owner.pid))


def claim(run: RunState | None, sender: SenderIdentity | None) -> None:
    """The first sender the kernel names owns ``run`` (if the run was kept and has no owner)."""
    if run is not None and run.owner is None and sender is not None \
            and sender.uid is not None:
        run.owner = RunOwner(uid=sender.uid, cgroup=sender.owner_cgroup(), pid=sender.pid)


def with_sender(report: WindowReport, sender: SenderIdentity | None) -> WindowReport:
    """``report`` with each finding (raised, cleared, or re-sent as active) stamped with the
    kernel's ``sender_pid`` and ``sender_uid`` (None over UDP); whatever the datagram wrote in
    those fields is replaced."""
    if not report.findings and not report.active:
        return report
    pid = sender.pid if sender is not None else None
    uid = sender.uid if sender is not None else None
    return replace(report,
                   findings=[{**doc, "sender_pid": pid, "sender_uid": uid}
                             for doc in report.findings],
                   active=[{**doc, "sender_pid": pid, "sender_uid": uid}
                           for doc in report.active])


def _alive(state: RankState) -> bool:
    """A rank whose process may still send: not said goodbye, not found exited."""
    return not state.progress.closed and state.progress.process != "exited"
