"""laggard's Prometheus rules: valid for promtool, and every alert fires and stays quiet where
it should (``rules_test.yml``, and ``hang_rules_test.yml`` for the hung-job rules, run by
``promtool test rules``)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from support import budget

from laggard.dashboards.catalog import RULE_FILES, RULES_DIR

HERE = Path(__file__).resolve().parent
RULES_TEST = HERE / "rules_test.yml"
#: LaggardJobHung and the laggard-hang recording rules (issue 24).
HANG_RULES_TEST = HERE / "hang_rules_test.yml"
#: LaggardGradientsCorrupt (issue 35).
INTEGRITY_RULES_TEST = HERE / "integrity_rules_test.yml"
RULE_TESTS = (RULES_TEST, HANG_RULES_TEST, INTEGRITY_RULES_TEST)

pytestmark = pytest.mark.skipif(
    shutil.which("promtool") is None,
    reason="promtool missing: apt-get install prometheus (scripts/ensure-prometheus.sh)",
)


def _promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["promtool", *map(str, args)], capture_output=True, text=True,
                          timeout=budget(60))


def _alert_names() -> set[str]:
    names = set()
    for name in RULE_FILES:
        for group in yaml.safe_load((RULES_DIR / name).read_text())["groups"]:
            names |= {rule["alert"] for rule in group["rules"] if "alert" in rule}
    return names


def test_rule_files_pass_promtool_check() -> None:
    result = _promtool("check", "rules", *(RULES_DIR / name for name in RULE_FILES))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("tests", RULE_TESTS, ids=lambda p: p.name)
def test_promtool_unit_tests_pass(tests: Path) -> None:
    result = _promtool("test", "rules", tests)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_has_a_firing_and_a_quiet_case() -> None:
    fires, quiet = set(), set()
    for tests in RULE_TESTS:
        doc = yaml.safe_load(tests.read_text())
        assert [Path(p).name for p in doc["rule_files"]] == list(RULE_FILES)
        for case in doc["tests"]:
            for check in case.get("alert_rule_test", []):
                (fires if check.get("exp_alerts") else quiet).add(check["alertname"])
    alerts = _alert_names()
    assert len(alerts) >= 8
    assert alerts - fires == set(), "alerts never shown to fire"
    assert alerts - quiet == set(), "alerts never shown to stay quiet"


def test_unit_tests_catch_a_broken_threshold(tmp_path: Path) -> None:
    # The same tests against a copy of the rules whose cross-node straggler threshold is raised
    # from 1.1 to 1.5: the 1.3x rank no longer fires, and promtool must say so.
    for name in RULE_FILES:
        text = (RULES_DIR / name).read_text()
        broken = text.replace("ratio_to_median > 1.1", "ratio_to_median > 1.5")
        if name == "laggard-alerts.yml":
            assert broken != text
        (tmp_path / name).write_text(broken)
    doc = yaml.safe_load(RULES_TEST.read_text())
    doc["rule_files"] = [str(tmp_path / name) for name in RULE_FILES]
    test_file = tmp_path / "rules_test.yml"
    test_file.write_text(yaml.safe_dump(doc))
    result = _promtool("test", "rules", test_file)
    assert result.returncode == 1
    assert "LaggardStragglerRank" in result.stdout + result.stderr


def _run_against_broken_rules(tmp_path: Path, tests: Path, old: str, new: str
                              ) -> subprocess.CompletedProcess[str]:
    """``tests`` run against a copy of the rules with ``old`` replaced by ``new`` (once; a
    mutation that matches nothing fails the test, so it cannot pass by missing its target)."""
    assert sum((RULES_DIR / name).read_text().count(old) for name in RULE_FILES) == 1, old
    for name in RULE_FILES:
        text = (RULES_DIR / name).read_text()
        if old in text:
            assert text.count(old) == 1, old
            text = text.replace(old, new)
        (tmp_path / name).write_text(text)
    doc = yaml.safe_load(tests.read_text())
    doc["rule_files"] = [str(tmp_path / name) for name in RULE_FILES]
    test_file = tmp_path / tests.name
    test_file.write_text(yaml.safe_dump(doc))
    return _promtool("test", "rules", test_file)


def test_hang_tests_catch_the_consequence_trap(tmp_path: Path) -> None:
    """Without "no work pending anywhere" the missing rule names the ranks that wait on a
    culprit in one group and so fall behind in another (ranks 2 and 4 of the TP x DP case):
    promtool must say so."""
    result = _run_against_broken_rules(
        tmp_path, HANG_RULES_TEST,
        "            and on (run, rank) (run_rank:laggard_rank_pending:sum == 0)\n"
        "            unless on (run, rank) run_rank:laggard_rank_heartbeat_stale:max\n"
        "          )\n"
        "          * 0 + on (run, group) group_left\n"
        "            run_group:laggard_hang_issued_ahead_stalled_seconds:max",
        "            unless on (run, rank) run_rank:laggard_rank_heartbeat_stale:max\n"
        "          )\n"
        "          * 0 + on (run, group) group_left\n"
        "            run_group:laggard_hang_issued_ahead_stalled_seconds:max")
    assert result.returncode == 1
    assert 'group="g5[0,2,4,6]", kind="missing", op="allreduce", rank="2"' in (
        result.stdout + result.stderr)


def test_hang_tests_catch_a_gate_on_ranks_that_are_not_stalled(tmp_path: Path) -> None:
    """Without the held-up ranks' stall a rank one collective behind is named before anything
    stalled (heartbeats of a running job catch ranks at different moments of a step): the
    quiet checks before the hang must fail."""
    result = _run_against_broken_rules(
        tmp_path, HANG_RULES_TEST,
        "(run_rank:laggard_rank_stalled_seconds:max > 0)\n          )\n      - record: "
        "run_group:laggard_hang_completed_ahead_stalled_seconds:max",
        "(run_rank:laggard_rank_stalled_seconds:max >= 0)\n          )\n      - record: "
        "run_group:laggard_hang_completed_ahead_stalled_seconds:max")
    assert result.returncode == 1
    assert "alertname: LaggardJobHung, time: 45s" in result.stdout + result.stderr


def _xid_classes() -> dict[str, set[int]]:
    """severity -> XID codes, from the label_replace() calls of the XID recording rule."""
    doc = yaml.safe_load((RULES_DIR / "laggard-recording.yml").read_text())
    (rule,) = [r for g in doc["groups"] for r in g["rules"]
               if r.get("record") == "instance_gpu_xid:laggard_gpu_xid_errors:new5m"]
    found = re.findall(r'"xid_severity", "(\w+)", "xid",\s*"([^"]+)"', rule["expr"])
    return {severity: {int(c) for c in codes.split("|")} for severity, codes in found
            if severity != "warning"}


def test_xid_severities_match_the_xid_catalog() -> None:
    from laggard.detectors.xid_catalog import _ROWS, lookup

    catalog: dict[str, set[int]] = {"critical": set(), "info": set()}
    for code in _ROWS:
        severity = lookup(code).severity.value
        if severity in catalog:
            catalog[severity].add(code)
    assert _xid_classes() == catalog
    assert {48, 64, 74, 79, 95, 119, 120} <= catalog["critical"]
