"""The ``laggard`` command line starts light: building a subcommand's parser, and ``laggard
analyze`` on a kernel log, import no torch, numpy, matplotlib or Grafana SDK.

Checked by the modules loaded (``sys.modules`` of a fresh interpreter), not by a timed run: an
import that costs 8 s on a loaded host and 0.3 s on an idle one is the same regression, and a
wall-clock bound would fail at a high load average while passing alone (issue 30, item 11; the
measured times are in ``benchmarks/RESULTS.md``'s table).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

#: Modules none of the parsers may import: each costs 0.2-8 s on this project's hosts.
HEAVY = ("torch", "numpy", "matplotlib", "grafana_foundation_sdk", "numba", "pandas")

#: A 4-line kernel log (the one the issue timed): two Xids, a NIC error, a link down.
KERNEL_LOG = (
    "[  100.000000] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.\n"
    "[  101.000000] mlx5_core 0000:5e:00.0: mlx5_health: Fatal error\n"
    "[  102.000000] eth0: link down\n"
    "[  103.000000] NVRM: Xid (PCI:0000:3b:00): 48, pid=1, An uncorrectable ECC error\n"
)

_PROBE = """
import json, sys
from laggard.cli import main
try:
    status = main(json.loads(sys.argv[1]))
except SystemExit as exc:  # --help exits from argparse
    status = exc.code
with open(sys.argv[2], "w") as f:
    json.dump({"status": status, "modules": sorted(sys.modules)}, f)
"""


def _loaded(argv: list[str], tmp_path: Path) -> tuple[int, set[str]]:
    """Run ``laggard ARGV`` in a fresh interpreter; its exit status and the modules it loaded."""
    out = tmp_path / "modules.json"
    proc = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(argv), str(out)],
                          capture_output=True, text=True, timeout=120)
    assert out.exists(), proc.stderr
    result = json.loads(out.read_text())
    return result["status"], set(result["modules"])


def _heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if m.split(".")[0] in HEAVY)


def test_top_level_help_imports_no_subcommand(tmp_path: Path) -> None:
    status, modules = _loaded(["--help"], tmp_path)
    assert status == 0
    assert _heavy(modules) == []
    assert not [m for m in modules if m.startswith(("laggard.agent", "laggard.demo",
                                                    "laggard.analyze", "laggard.dashboards"))]


@pytest.mark.parametrize("command", ["agent", "demo", "analyze", "report", "dashboards",
                                     "cluster-demo"])
def test_subcommand_help_imports_nothing_heavy(command: str, tmp_path: Path) -> None:
    status, modules = _loaded([command, "--help"], tmp_path)
    assert status == 0
    assert _heavy(modules) == []


def test_demo_and_report_help_do_not_import_their_run_modules(tmp_path: Path) -> None:
    assert "laggard.demo.local" not in _loaded(["demo", "--help"], tmp_path)[1]
    assert "laggard.analyze.run_report" not in _loaded(["report", "--help"], tmp_path)[1]


def test_analyze_of_a_kernel_log_imports_only_the_kernel_log_rules(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text(KERNEL_LOG)
    status, modules = _loaded(["analyze", str(log)], tmp_path)
    assert status == 1  # findings: Xid 79 and 48
    assert _heavy(modules) == []
    # nor the parsers and rules of the other kinds (prometheus_client: the exposition parser)
    assert not [m for m in modules if m.split(".")[0] == "prometheus_client"]
    assert not {"laggard.analyze.traces", "laggard.analyze.collectives",
                "laggard.detectors.flight_recorder", "laggard.analyze.network"} & modules


def test_the_report_says_once_that_matplotlib_builds_its_font_cache(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The first `laggard report` per user waits while matplotlib scans the system's fonts (40 s
    # on a loaded host): said before it starts, and never again once the cache file exists.
    from laggard.analyze.run_report import _say_font_cache

    _say_font_cache(tmp_path)
    assert "building its font cache" in capsys.readouterr().err
    (tmp_path / "fontlist-v390.json").write_text("{}")
    _say_font_cache(tmp_path)
    assert capsys.readouterr().err == ""


def test_remediate_help_imports_neither_its_run_module_nor_kubernetes(tmp_path: Path) -> None:
    status, modules = _loaded(["remediate", "--help"], tmp_path)
    assert status == 0
    assert _heavy(modules) == []
    assert not {"laggard.actions.remediate", "laggard.actions.remediator"} & modules
    assert not [m for m in modules if m.split(".")[0] == "kubernetes"]
