"""``laggard dashboards --out DIR`` as a user runs it: a real subprocess writing real files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml
from support import budget

from laggard.dashboards import catalog


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "laggard.cli", "dashboards", *args],
                          capture_output=True, text=True, timeout=budget(60))


def test_writes_dashboards_provisioning_and_rules(tmp_path: Path) -> None:
    out = tmp_path / "new" / "laggard"
    result = _run("--out", str(out))
    assert result.returncode == 0, result.stderr
    names = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert names == {
        *(f"{uid}.json" for uid in catalog.DASHBOARDS),
        catalog.PROVISIONING_FILE,
        *(f"rules/{name}" for name in catalog.RULE_FILES),
        f"rules/{catalog.PROMETHEUS_RULE_FILE}",
    }
    for uid in catalog.DASHBOARDS:
        assert json.loads((out / f"{uid}.json").read_text())["uid"] == uid
    provisioning = yaml.safe_load((out / catalog.PROVISIONING_FILE).read_text())
    assert provisioning["apiVersion"] == 1
    (provider,) = provisioning["providers"]
    assert provider["type"] == "file"
    assert provider["options"]["path"] == str(out.absolute())
    for name in catalog.RULE_FILES:
        assert (out / "rules" / name).read_text() == (catalog.RULES_DIR / name).read_text()
    manifest = yaml.safe_load((out / "rules" / catalog.PROMETHEUS_RULE_FILE).read_text())
    assert manifest["kind"] == "PrometheusRule"
    assert not list(out.glob(".*")), "temporary files left behind"


def test_provisioning_path_and_no_rules(tmp_path: Path) -> None:
    result = _run("--out", str(tmp_path), "--provisioning-path", "/srv/grafana/laggard",
                  "--no-rules")
    assert result.returncode == 0, result.stderr
    provisioning = yaml.safe_load((tmp_path / catalog.PROVISIONING_FILE).read_text())
    assert provisioning["providers"][0]["options"]["path"] == "/srv/grafana/laggard"
    assert not (tmp_path / "rules").exists()


def test_rewrites_existing_files(tmp_path: Path) -> None:
    stale = tmp_path / "laggard-network.json"
    stale.write_text("{}")
    assert _run("--out", str(tmp_path)).returncode == 0
    assert json.loads(stale.read_text())["uid"] == "laggard-network"


def test_refuses_an_unwritable_output_path(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    for out in (blocker / "dashboards", Path("/proc/laggard-dashboards")):
        result = _run("--out", str(out))
        assert result.returncode == 1
        assert result.stderr.startswith(f"laggard dashboards: cannot write to {out}:")
        assert "Traceback" not in result.stderr
    assert blocker.read_text() == "not a folder"


def test_out_is_required() -> None:
    result = _run()
    assert result.returncode == 2
    assert "--out" in result.stderr


def test_without_the_sdk_writes_the_packaged_copies(tmp_path: Path) -> None:
    # A grafana_foundation_sdk that cannot be imported, as on Python 3.10 or without the extra.
    shadow = tmp_path / "shadow" / "grafana_foundation_sdk"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('no grafana-foundation-sdk here')\n")
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "laggard.cli", "dashboards", "--out", str(out)],
        capture_output=True, text=True, timeout=budget(60),
        env={**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(shadow.parent), os.environ.get("PYTHONPATH", "")])})
    assert result.returncode == 0, result.stderr
    assert "writing the packaged copies" in result.stderr
    for uid in catalog.DASHBOARDS:
        name = f"{uid}.json"
        assert (out / name).read_text() == (catalog.GENERATED_DIR / name).read_text()
