"""``laggard healthcheck``: the node's verdict from its running agent, for node-problem-detector
and Slurm.

Reads the agent's ``/metrics`` and ``/findings`` (:mod:`laggard.agent.web`), judges them
(:mod:`laggard.actions.verdict`), prints one line and exits 0 (healthy), 1 (a problem) or 2
(unknown): node-problem-detector's custom plugin protocol. An agent that cannot be reached, or
answers with what is not a laggard agent's, is unknown, never healthy. Every problem is also
written to stderr, one line each (``problem <kind> <subject>: <message>``).

With ``--slurm`` it is also Slurm's ``HealthCheckProgram``: on a problem it drains its own node
through ``scontrol`` with the reason ``laggard:<kind>:<subject>`` of the first problem
(:mod:`laggard.actions.slurm`), dry-run unless ``--act``; an unknown verdict drains nothing (a
stopped agent is not a broken GPU). It resumes a node only with ``--slurm-resume``, when healthy,
and only one laggard drained. Each Slurm decision is one audit line on stderr.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import time
import urllib.error
import urllib.request
from typing import Any

from laggard.actions.healthcheck_flags import THRESHOLDS
from laggard.actions.slurm import Slurm, drain_reason, local_node_name
from laggard.actions.verdict import OK, PROBLEM, UNKNOWN, Rules, Verdict, judge
from laggard.detectors.throttle import LIMITING_REASONS
from laggard.parsers.exposition import Sample, parse_exposition

#: Longest message line printed (node-problem-detector keeps the first 80 bytes by default:
#: its plugin config's ``max_output_length``; ours raises it to this).
MAX_MESSAGE_CHARS = 200
#: Largest response read from the agent, in bytes (a node's exposition is tens of KiB).
MAX_RESPONSE_BYTES = 32 * 1024 * 1024


class AgentUnreadable(RuntimeError):
    """The agent did not answer, or answered what cannot be read."""


def _get(url: str, timeout: float) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - an URL flag
            return response.read(MAX_RESPONSE_BYTES)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise AgentUnreadable(f"{url}: {reason}") from None


def read_agent(base: str, timeout: float) -> tuple[list[Sample], list[Any]]:
    """The agent's parsed ``/metrics`` samples and its ``/findings`` list.

    Args:
        base: the agent's web address (``http://127.0.0.1:9477``).
        timeout: seconds per request.

    Raises:
        AgentUnreadable: a request failed, or ``/findings`` is not a JSON list.
    """
    base = base.rstrip("/")
    for path in ("/metrics", "/findings"):  # the agent's page given for its address
        base = base.removesuffix(path)
    metrics = _get(f"{base}/metrics", timeout).decode("utf-8", errors="replace")
    try:
        findings = json.loads(_get(f"{base}/findings", timeout))
    except ValueError as exc:
        raise AgentUnreadable(f"{base}/findings: not JSON ({exc})") from None
    if not isinstance(findings, list):
        raise AgentUnreadable(f"{base}/findings: not a list")
    return parse_exposition(metrics.splitlines()).samples, findings


def rules_of(args: argparse.Namespace) -> Rules:
    """The rules the flags ask for.

    Raises:
        ValueError: a threshold below 0 or not finite, or an unknown clock-event reason.
    """
    reasons = frozenset(r.strip() for r in args.clock_event_reasons.split(",") if r.strip())
    return Rules(xid_max_age_seconds=60 * args.xid_max_age,
                 clock_event_seconds=60 * args.clock_event_minutes,
                 straggler_seconds=60 * args.straggler_minutes,
                 hung_seconds=60 * args.hung_minutes,
                 clock_event_reasons=reasons or LIMITING_REASONS)


def check(args: argparse.Namespace, rules: Rules, now: float | None = None) -> Verdict:
    """Read the agent named by ``args.agent`` and judge it; unknown when it cannot be read."""
    try:
        samples, findings = read_agent(args.agent, args.timeout)
    except AgentUnreadable as exc:
        return Verdict(UNKNOWN, message=f"agent unreachable: {exc}")
    return judge(samples, findings, rules, time.time() if now is None else now)


def _slurm(args: argparse.Namespace, verdict: Verdict) -> None:
    slurm = Slurm(act=args.act, scontrol=args.scontrol, source="healthcheck")
    node = args.node or local_node_name()
    if verdict.status == PROBLEM:
        first = verdict.problems[0]
        why = "; ".join(p.message for p in verdict.problems)
        slurm.drain(node, drain_reason(first.kind, first.subject), why=why)
    elif verdict.status == OK and args.slurm_resume:
        slurm.resume(node, why=verdict.message)


def run(args: argparse.Namespace) -> int:
    """Entry point of ``laggard healthcheck``; returns 0, 1 or 2 (see the module docstring)."""
    try:
        for flag, _, _ in THRESHOLDS:
            value = getattr(args, flag[2:].replace("-", "_"))
            if not 0 <= value < math.inf:
                raise ValueError(f"{flag} must be >= 0 and finite, not {value}")
        if not 0 < args.timeout < math.inf:
            raise ValueError(f"--timeout must be > 0 and finite, not {args.timeout}")
        rules = rules_of(args)
    except ValueError as exc:
        verdict = Verdict(UNKNOWN, message=f"bad flag: {exc}")
    else:
        verdict = check(args, rules)
    label = {OK: "OK", PROBLEM: "PROBLEM", UNKNOWN: "UNKNOWN"}[verdict.status]
    # One line: node-problem-detector takes stdout as the condition's message.
    line = "".join(c if c.isprintable() else " " for c in f"{label}: {verdict.message}")
    print(line[:MAX_MESSAGE_CHARS], flush=True)
    # Every problem, for a person running it by hand and for slurmd's log (stdout is NPD's).
    for problem in verdict.problems:
        print(f"problem {problem.kind} {problem.subject}: {problem.message}", file=sys.stderr)
    if args.slurm:  # an unknown verdict drains nothing and resumes nothing
        logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        _slurm(args, verdict)
    return verdict.status
