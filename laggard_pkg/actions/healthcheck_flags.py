"""``laggard healthcheck``'s flags: argparse only, so ``--help`` and a bad flag start at once.

The run module (:mod:`laggard.actions.healthcheck`) is imported after the flags parsed
(``laggard/cli.py``; ``tests/test_cli_startup.py``).
"""

from __future__ import annotations

import argparse
import os
from typing import NoReturn

#: The agent's default web address (``laggard agent --web.listen-address``: 127.0.0.1:9477).
DEFAULT_AGENT_URL = "http://127.0.0.1:9477"
#: The environment variable that overrides that default: node-problem-detector passes its own
#: environment to a plugin but expands no variable in its args, and the agent of a Kubernetes
#: node listens on the node's IP (deploy/kubernetes/node-problem-detector/).
AGENT_URL_ENV = "LAGGARD_AGENT_URL"


#: The rules' thresholds, in minutes: flag, default, help (laggard.actions.verdict.Rules).
THRESHOLDS = (
    ("--xid-max-age", 60.0, "a critical Xid seen longer ago than this is taken as handled"),
    ("--clock-event-minutes", 5.0,
     "a limiting clock-event reason (power cap, thermal, slowdown) held this long is a problem"),
    ("--straggler-minutes", 10.0, "a rank of this node named a straggler this long is a problem"),
    ("--hung-minutes", 10.0, "a rank of this node stalled this long is a problem"),
)


class _UnknownOnBadFlag:
    """A parser's ``error``: the ``UNKNOWN: bad flag: ...`` line on stdout first (what
    node-problem-detector shows as the condition's message), then argparse's own usage and
    message on stderr and exit 2 (unknown)."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self._error = parser.error

    def __call__(self, message: str) -> NoReturn:
        print(f"UNKNOWN: bad flag: {message}"[:200], flush=True)
        self._error(message)
        raise SystemExit(2)  # argparse's error exits; never reached


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the flags of ``laggard healthcheck``."""
    parser.error = _UnknownOnBadFlag(parser)  # type: ignore[method-assign]
    parser.epilog = (
        "exit status (node-problem-detector's custom plugin protocol): 0 healthy, 1 a problem, "
        "2 unknown (the agent cannot be read: never taken as healthy). One line on stdout.")
    parser.add_argument("--agent", default=os.environ.get(AGENT_URL_ENV) or DEFAULT_AGENT_URL,
                        metavar="URL",
                        help="the node agent's web address, serving /metrics and /findings "
                             f"(default ${AGENT_URL_ENV}, else {DEFAULT_AGENT_URL})")
    parser.add_argument("--timeout", type=float, default=5.0, metavar="SECONDS",
                        help="seconds to wait for the agent (default %(default)s)")
    for flag, default, text in THRESHOLDS:
        parser.add_argument(flag, type=float, default=default, metavar="MINUTES",
                            help=f"{text} (default %(default)s)")
    parser.add_argument("--clock-event-reasons", default="", metavar="REASON,...",
                        help="the clock-event reasons that count (default: every limiting one: "
                             "sw_power_cap, hw_slowdown, sw_thermal, hw_thermal, "
                             "hw_power_brake); leave sw_power_cap out where power is capped "
                             "by policy")
    slurm = parser.add_argument_group(
        "Slurm (HealthCheckProgram)",
        "drain this node through scontrol with reason laggard:<kind>:<subject>")
    slurm.add_argument("--slurm", action="store_true",
                       help="on a problem, drain this node (dry run: says what it would do)")
    slurm.add_argument("--act", action="store_true",
                       help="with --slurm: really run scontrol (default: dry run)")
    slurm.add_argument("--slurm-resume", action="store_true",
                       help="with --slurm: when healthy, resume this node if laggard drained it "
                            "(a node drained for another reason is never resumed)")
    slurm.add_argument("--node", default=None, metavar="NAME",
                       help="the Slurm node name (default $SLURMD_NODENAME, else the short "
                            "host name)")
    slurm.add_argument("--scontrol", default="scontrol", metavar="PATH",
                       help="the scontrol program (default %(default)s)")
