"""Drain and resume a Slurm node through ``scontrol``, with laggard's structured reason.

Slurm is the one owner of a Slurm node's state: laggard drains through it (``scontrol update
nodename=N state=drain reason=R``), never around it, as operators ask (NVIDIA aicr #2615,
nebius soperator #1392 drain with a structured reason). The reason is ``laggard:<kind>:<subject>``
(:func:`drain_reason`); that prefix is how laggard knows a drain is its own: it resumes only a
node whose reason carries it, and never overwrites another's drain reason.

Dry-run unless built with ``act=True``: then nothing is run but ``scontrol show node`` (to decide),
and the audit line says what would have been run. Every :meth:`Slurm.drain` and
:meth:`Slurm.resume` records exactly one :class:`~laggard.actions.audit.Decision`.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from laggard.actions.audit import Decision, record

#: What starts every reason laggard writes; a drain without it is someone else's.
REASON_PREFIX = "laggard:"
#: Longest reason written, in characters (``sinfo -R`` prints it in one column; keep it short).
MAX_REASON_CHARS = 128

# `scontrol -o show node N` prints the reason last: "... Reason=<text> [<user>@<time>]".
_REASON = re.compile(r"\bReason=(.*?)(?: \[[^\]\s]*@[^\]\s]*\])?\s*$")
_STATE = re.compile(r"\bState=(\S+)")
_NODE = re.compile(r"\bNodeName=(\S+)")


class SlurmError(RuntimeError):
    """``scontrol`` is missing, failed, timed out, or printed what cannot be read."""


def drain_reason(kind: str, subject: str) -> str:
    """The structured reason ``laggard:<kind>:<subject>``.

    Whitespace in ``kind`` and ``subject`` becomes ``_`` and control characters are dropped, so
    the reason is one token a script can split on ``:`` (the subject may hold ``:`` itself, as
    a PCI bus id does: split at most twice). Cut at :data:`MAX_REASON_CHARS`.

    Args:
        kind: what was found (``gpu_lost``, ``xid``, ``straggler``...).
        subject: what it is about (``gpu0``, ``0000:91:00``, ``rank3``...).
    """
    def token(text: str) -> str:
        words = str(text).split()  # before dropping control characters: a tab separates
        return "_".join("".join(c for c in word if c.isprintable()) for word in words)

    return f"{REASON_PREFIX}{token(kind)}:{token(subject)}"[:MAX_REASON_CHARS]


def is_laggard_reason(reason: str | None) -> bool:
    """True when ``reason`` is one laggard wrote (it starts with :data:`REASON_PREFIX`)."""
    return bool(reason) and str(reason).startswith(REASON_PREFIX)


def local_node_name(env: Mapping[str, str] | None = None) -> str:
    """This node's Slurm name: ``SLURMD_NODENAME`` (slurmd sets it for its HealthCheckProgram
    and a job's tasks), else the short host name (Slurm's default NodeName)."""
    env = os.environ if env is None else env
    return env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


@dataclass(frozen=True, slots=True)
class NodeState:
    """A node as ``scontrol show node`` reports it.

    Attributes:
        name: the node's name.
        state: Slurm's state with its flags, e.g. ``IDLE``, ``IDLE+DRAIN``, ``MIXED+DRAIN``.
        reason: the drain or down reason, without Slurm's ``[user@time]`` suffix; "" if none.
    """

    name: str
    state: str
    reason: str = ""

    @property
    def drained(self) -> bool:
        """True when the node is drained or draining (the ``DRAIN`` flag, or the ``DRAINED`` /
        ``DRAINING`` base states that ``sinfo`` prints)."""
        parts = set(self.state.upper().split("+"))
        return bool(parts & {"DRAIN", "DRAINED", "DRAINING"})

    @property
    def drained_by_laggard(self) -> bool:
        """Drained with a reason laggard wrote."""
        return self.drained and is_laggard_reason(self.reason)


def parse_show_node(text: str) -> NodeState:
    """Read ``scontrol -o show node NAME`` output (one line per node; the first is taken).

    Raises:
        SlurmError: no ``NodeName=`` or ``State=`` in it.
    """
    line = next((ln for ln in text.splitlines() if "NodeName=" in ln), "")
    name, state = _NODE.search(line), _STATE.search(line)
    if name is None or state is None:
        raise SlurmError(f"scontrol show node: no NodeName/State in {text.strip()[:200]!r}")
    reason = _REASON.search(line)
    text_reason = reason.group(1).strip() if reason else ""
    return NodeState(name.group(1), state.group(1), "" if text_reason == "(null)" else text_reason)


class Slurm:
    """Drain or resume nodes through ``scontrol``; dry-run unless ``act``.

    Args:
        act: run the ``scontrol update`` commands; False (the default) only says what would run.
        scontrol: the ``scontrol`` program (a path, or a name found on ``PATH``).
        timeout: seconds one ``scontrol`` call may take before it counts as failed.
        env: variables added to this process's environment for ``scontrol`` (``SLURM_CONF``).
        source: who decides, written in each audit line (``healthcheck``, ``remediate``).
        log: the audit logger; ``laggard.audit`` when None.
    """

    def __init__(self, *, act: bool = False, scontrol: str = "scontrol", timeout: float = 10.0,
                 env: Mapping[str, str] | None = None, source: str = "",
                 log: logging.Logger | None = None) -> None:
        self.act = act
        self.scontrol = scontrol
        self.timeout = timeout
        self.env = {**os.environ, **(env or {})}
        self.source = source
        self.log = log

    def _run(self, args: Sequence[str]) -> str:
        cmd = [self.scontrol, *args]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=self.timeout,
                                  env=self.env, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SlurmError(f"{' '.join(cmd)}: {exc}") from None
        if done.returncode != 0:
            message = (done.stderr or done.stdout).strip() or f"exit status {done.returncode}"
            raise SlurmError(f"{' '.join(cmd)}: {message}")
        return done.stdout

    def node(self, name: str) -> NodeState:
        """The node's state and reason (``scontrol -o show node NAME``).

        Raises:
            SlurmError: scontrol failed (an unknown node, no controller) or printed no state.
        """
        return parse_show_node(self._run(["-o", "show", "node", name]))

    def _decide(self, action: str, name: str, why: str, reason: str,
                update: list[str], skip: str | None) -> Decision:
        command = " ".join([self.scontrol, *update])

        def decision(outcome: str, detail: str) -> Decision:
            return record(Decision(action=action, target=name, outcome=outcome, why=why,
                                   reason=reason, detail=detail, source=self.source),
                          log=self.log)

        if skip is not None:
            return decision("skipped", skip)
        if not self.act:
            return decision("would_act", command)
        try:
            self._run(update)
        except SlurmError as exc:
            return decision("failed", str(exc))
        return decision("acted", command)

    def drain(self, name: str, reason: str, *, why: str) -> Decision:
        """Drain ``name`` with ``reason``, unless it is drained already. Never raises.

        A node already drained keeps its reason: laggard's own (idempotent: nothing run) or
        someone else's (left alone; their reason says more about the node than ours).

        Args:
            name: the Slurm node.
            reason: the reason to write, from :func:`drain_reason`.
            why: what asked for the drain, for the audit line.

        Returns:
            The recorded decision: ``acted``, ``would_act``, ``skipped`` or ``failed``.
        """
        update = ["update", f"nodename={name}", "state=drain", f"reason={reason}"]
        try:
            state = self.node(name)
        except SlurmError as exc:
            return self._fail("drain", name, why, reason, str(exc))
        skip = None
        if state.drained_by_laggard:
            skip = f"already drained by laggard ({state.reason})"
        elif state.drained:
            skip = f"drained by someone else ({state.reason or 'no reason'}): left alone"
        return self._decide("drain", name, why, reason, update, skip)

    def resume(self, name: str, *, why: str) -> Decision:
        """Resume ``name`` if laggard drained it (its reason starts with ``laggard:``). Never
        raises.

        Args:
            name: the Slurm node.
            why: what asked for it (an alert resolved), for the audit line.

        Returns:
            The recorded decision; ``skipped`` when the node is not drained or someone else
            drained it.
        """
        update = ["update", f"nodename={name}", "state=resume"]
        try:
            state = self.node(name)
        except SlurmError as exc:
            return self._fail("resume", name, why, "", str(exc))
        skip = None
        if not state.drained:
            skip = f"not drained (state {state.state})"
        elif not state.drained_by_laggard:
            skip = f"drained by someone else ({state.reason or 'no reason'}): not laggard's"
        return self._decide("resume", name, why, state.reason, update, skip)

    def _fail(self, action: str, name: str, why: str, reason: str, detail: str) -> Decision:
        return record(Decision(action=action, target=name, outcome="failed", why=why,
                               reason=reason, detail=detail, source=self.source), log=self.log)
