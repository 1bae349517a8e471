"""The package layering (docs/architecture.md, "Layering") holds; breaking it fails the check."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "lint-imports.sh"
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
PACKAGES = ("laggard_pkg", "agent", "analyze", "collectors", "dashboards", "demo", "detectors",
            "integrations", "parsers")

pytestmark = pytest.mark.skipif(not LINT_IMPORTS.exists(),
                                reason="import-linter is not installed (the dev extra)")


def _lint(src: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "LAGGARD_SRC": str(src), "LINT_IMPORTS": str(LINT_IMPORTS)}
    return subprocess.run([str(SCRIPT)], capture_output=True, text=True, env=env, timeout=120)


def test_contracts_kept() -> None:
    result = _lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(("module", "line", "contract"), [
    ("parsers/kernel_log.py", "import torch", "Pure parsers and detectors"),
    ("detectors/throttle.py", "import socket", "Pure parsers and detectors"),
    ("collectors/host.py", "from laggard.agent import config", "Layers"),
    ("integrations/monitor.py", "from laggard.agent import intake", "Training side apart"),
    ("agent/intake.py", "import torch", "No torch outside the job"),
])
def test_a_broken_layer_is_reported(tmp_path: Path, module: str, line: str,
                                    contract: str) -> None:
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package,
                        ignore=shutil.ignore_patterns("__pycache__", "generated", "rules"))
    target = tmp_path / module
    target.write_text(target.read_text() + f"\n{line}  # injected by the test\n")
    result = _lint(tmp_path)
    assert result.returncode != 0
    broken = [ln for ln in result.stdout.splitlines() if " BROKEN" in ln]
    assert any(ln.startswith(contract) for ln in broken), result.stdout
