"""The package layering (docs/architecture.md, "Layering") holds, and breaking it fails the
check; tests/ mirrors parsers/ and collectors/."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support import budget

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "lint-imports.sh"
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
PACKAGES = ("laggard_pkg", "agent", "analyze", "collectors", "compression", "dashboards", "demo",
            "detectors", "integrations", "nvml", "parsers")

needs_import_linter = pytest.mark.skipif(not LINT_IMPORTS.exists(),
                                         reason="import-linter is not installed (the dev extra)")

#: Modules of parsers/ and collectors/ that have no test module of their own, and the test
#: module that covers them instead.
MIRROR_EXCEPTIONS = {
    # the Collector protocol and NoDataError: no behaviour of their own; every collector test
    # raises or checks NoDataError
    "collectors/base.py": "tests/collectors/test_infiniband.py",
}


def _lint(src: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "LAGGARD_SRC": str(src), "LINT_IMPORTS": str(LINT_IMPORTS)}
    return subprocess.run([str(SCRIPT)], capture_output=True, text=True, env=env,
                          timeout=budget(120))


@needs_import_linter
def test_contracts_kept() -> None:
    result = _lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@needs_import_linter
@pytest.mark.parametrize(("module", "line", "contract"), [
    ("parsers/kernel_log.py", "import torch", "Pure parsers and detectors"),
    ("detectors/throttle.py", "import socket", "Pure parsers and detectors"),
    ("collectors/host.py", "from laggard.agent import config", "Layers"),
    ("integrations/monitor.py", "from laggard.agent import run_table", "Training side apart"),
    ("agent/run_table.py", "import torch", "No torch outside the job"),
    ("compression/sign.py", "from laggard.agent import run_table", "Training side apart"),
    ("integrations/comm_timing.py", "from laggard.compression import base", "Layers"),
    ("integrations/gpu_state.py", "import pynvml", "pynvml only in the NVML wrapper"),
    ("collectors/nvml.py", "import pynvml", "pynvml only in the NVML wrapper"),
    ("nvml/library.py", "from laggard.collectors import host", "Layers"),
    ("nvml/fake.py", "import torch", "No torch outside the job"),
    ("laggard_pkg/actions/verdict.py", "from laggard.agent import context", "Layers"),
    ("laggard_pkg/actions/slurm.py", "import torch", "No torch outside the job"),
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


@pytest.mark.parametrize("package", ["parsers", "collectors"])
def test_every_module_has_its_test_module(package: str) -> None:
    """tests/ mirrors the packages: ``parsers/x.py`` is tested in ``tests/parsers/test_x.py``."""
    missing = []
    for module in sorted((ROOT / package).glob("*.py")):
        if module.name == "__init__.py":
            continue
        relative = f"{package}/{module.name}"
        covered_by = MIRROR_EXCEPTIONS.get(relative)
        if covered_by is not None:
            # the covering module must exist and import what it covers
            text = (ROOT / covered_by).read_text()
            if f"laggard.{package}.{module.stem}" not in text:
                missing.append(f"{relative} (said to be covered by {covered_by})")
        elif not (ROOT / "tests" / package / f"test_{module.name}").exists():
            missing.append(relative)
    assert missing == [], f"modules without tests/{package}/test_<name>.py: {missing}"


def test_mirror_exceptions_name_real_modules() -> None:
    assert [m for m in MIRROR_EXCEPTIONS if not (ROOT / m).exists()] == []
