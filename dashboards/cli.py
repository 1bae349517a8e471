"""``laggard dashboards``: write the Grafana dashboards, their provisioning file and the rules."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from laggard.dashboards.catalog import dashboard_files, render_files


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the subcommand's flags."""
    parser.add_argument(
        "--out", required=True, metavar="DIR",
        help="folder to write <uid>.json dashboards, laggard-dashboards.yaml and rules/ into "
        "(created if missing)",
    )
    parser.add_argument(
        "--provisioning-path", metavar="PATH", default=None,
        help="dashboards folder as Grafana sees it, written into the provisioning file "
        "(default: DIR made absolute)",
    )
    parser.add_argument(
        "--no-rules", action="store_true",
        help="write only the dashboards and their provisioning file, not rules/",
    )


def run(args: argparse.Namespace) -> int:
    """Write every file; exit status 0, or 1 with a one-line message when DIR is unwritable."""
    out = Path(args.out)
    dashboards, built = dashboard_files()
    if not built:
        print("laggard dashboards: grafana-foundation-sdk not importable (pip install "
              "'laggard[dashboards]', Python 3.11+): writing the packaged copies",
              file=sys.stderr)
    try:
        files = render_files(args.provisioning_path or str(out.absolute()),
                             rules=not args.no_rules, dashboards=dashboards)
    except ImportError as exc:
        print(f"laggard dashboards: {exc}; pip install 'laggard[dashboards]'", file=sys.stderr)
        return 1
    try:
        for relative, text in files.items():
            _write_atomically(out / relative, text)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        print(f"laggard dashboards: cannot write to {out}: {reason}", file=sys.stderr)
        return 1
    for relative in files:
        print(out / relative)
    return 0


def _write_atomically(path: Path, text: str) -> None:
    # Grafana rereads the folder on a timer: never let it see a half-written dashboard.
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
