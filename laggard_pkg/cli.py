"""The ``laggard`` command line: one subcommand per module, imported only when chosen.

Each subcommand module exposes ``add_arguments(parser)`` and ``run(args) -> int`` (the exit
status); its one-line help lives here, so ``laggard --help`` shows it without importing it.
Importing lazily keeps ``laggard agent`` free of torch and keeps a broken optional module from
breaking the others.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from laggard import __version__

#: subcommand -> (module implementing it, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "agent": ("laggard.agent.daemon", "run the node agent: sample GPUs, network and host, "
              "receive rank timings, serve /metrics"),
    "demo": ("laggard.demo.local", "train a small model on W local ranks and find the slow one"),
    "analyze": ("laggard.analyze.cli",
                "read logs and dumps after an incident and name the culprit"),
    "dashboards": ("laggard.dashboards.cli", "write Grafana dashboards and Prometheus rules"),
    "cluster-demo": ("laggard.demo.cluster", "emulate N nodes with network namespaces, run one "
                     "job across them, inject a fault, name it"),
}


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    """Build the parser; only the chosen subcommand's module is imported.

    The chosen subcommand's own parser is kept as ``parser.chosen_subparser`` so that errors
    about its flags show its usage, not the top-level one.
    """
    parser = argparse.ArgumentParser(
        prog="laggard",
        description="Find the straggler rank, the throttled GPU and the flipped bit.",
    )
    parser.add_argument("--version", action="version", version=f"laggard {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        if name != chosen:
            sub.add_parser(name, help=help_text, add_help=False)
            continue
        module = importlib.import_module(module_name)
        p = sub.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
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
    if not hasattr(args, "_run"):
        parser.print_help()
        return 2
    return int(args._run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
