"""The ``laggard`` command line: one subcommand per module, imported only when chosen.

A subcommand has a *flags* module, whose ``add_arguments(parser)`` declares its flags, and a
*run* module, whose ``run(args) -> int`` does the work and returns the exit status. They are one
module where that module is light; where the run module is heavy (torch, numpy, matplotlib, the
agent's servers) the flags live in a module of their own that imports only :mod:`argparse`-level
things, so ``laggard X --help`` and a bad flag cost a few tens of milliseconds, not the seconds
that importing the run module costs on a loaded host. The run module is imported only after the
flags parsed. Each one-line help lives here, so ``laggard --help`` imports no subcommand at all,
and a broken optional module cannot break the others.

``tests/test_cli_startup.py`` checks which modules each ``--help`` imports.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from laggard import __version__

#: subcommand -> (flags module, run module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str, str]] = {
    # The agent's flags are declared by laggard.agent.daemon and its collectors; that module must
    # stay free of torch and numpy at import (tests/test_cli_startup.py).
    "agent": ("laggard.agent.daemon", "laggard.agent.daemon",
              "run the node agent: sample GPUs, network and host, receive rank timings, "
              "serve /metrics"),
    "demo": ("laggard.demo.flags", "laggard.demo.local",
             "train a small model on W local ranks and find the slow one"),
    "analyze": ("laggard.analyze.cli", "laggard.analyze.cli",
                "read logs and dumps after an incident and name the culprit"),
    "report": ("laggard.analyze.report_flags", "laggard.analyze.run_report",
               "write a run's straggler report (heatmaps, findings, phases) as one HTML page"),
    "dashboards": ("laggard.dashboards.cli", "laggard.dashboards.cli",
                   "write Grafana dashboards and Prometheus rules"),
    "cluster-demo": ("laggard.demo.cluster", "laggard.demo.cluster",
                     "emulate N nodes with network namespaces, run one job across them, "
                     "inject a fault, name it"),
    "healthcheck": ("laggard.actions.healthcheck_flags", "laggard.actions.healthcheck",
                    "the node's verdict from its agent: node-problem-detector plugin, Slurm "
                    "HealthCheckProgram (exit 0 ok, 1 problem, 2 unknown)"),
    "remediate": ("laggard.actions.remediate_flags", "laggard.actions.remediate",
                  "Alertmanager webhook receiver: drain, cordon or exclude the nodes laggard's "
                  "alerts name (dry run unless --act)"),
}


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    """Build the parser; only the chosen subcommand's flags module is imported.

    The parsed namespace carries the chosen subcommand's run module, by name, as
    ``_run_module``, and its own parser as ``_subparser``, so that errors about its flags show
    its usage, not the top-level one.
    """
    parser = argparse.ArgumentParser(
        prog="laggard",
        description="Find the straggler rank, the throttled GPU and the flipped bit.",
    )
    parser.add_argument("--version", action="version", version=f"laggard {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, (flags_module, run_module, help_text) in SUBCOMMANDS.items():
        if name != chosen:
            sub.add_parser(name, help=help_text, add_help=False)
            continue
        p = sub.add_parser(name, help=help_text, description=help_text)
        importlib.import_module(flags_module).add_arguments(p)
        p.set_defaults(_run_module=run_module)
        parser.set_defaults(_subparser=p)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``laggard`` console script; returns the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        parser = build_parser(argv)
    except ImportError as exc:
        print(f"laggard: {exc}", file=sys.stderr)
        return 2
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        (getattr(args, "_subparser", None) or parser).error(
            f"unrecognized arguments: {' '.join(unknown)}")
    if not hasattr(args, "_run_module"):
        parser.print_help()
        return 2
    try:
        module = importlib.import_module(args._run_module)
    except ImportError as exc:
        print(f"laggard: {exc}", file=sys.stderr)
        return 2
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
