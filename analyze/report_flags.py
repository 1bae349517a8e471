"""Flags of ``laggard report``: the parser's half of :mod:`laggard.analyze.run_report`, apart so
that ``laggard report --help`` imports neither numpy nor matplotlib (:mod:`laggard.cli` imports
``run_report`` only to run).
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``laggard report``."""
    parser.add_argument("windows", metavar="WINDOWS.jsonl",
                        help="windows saved by TrainingMonitor(Config(windows_path=...)) or "
                             "`laggard demo --windows`")
    parser.add_argument("--html", required=True, metavar="PATH", help="where to write the page")
    parser.add_argument("--title", default="laggard run report")
