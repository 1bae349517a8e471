"""The sharded Prometheus set (``laggard.dashboards.shards``, ``deploy/prometheus/``): the split
of laggard's rules between a shard and the global layer loses and adds no rule, behaves as one
server under the shipped promtool unit tests, sends the global layer every series its rules
read, and the generated configurations pass ``promtool check config``."""

from __future__ import annotations

import shutil
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import REPO, budget

from laggard.dashboards.catalog import rule_groups
from laggard.dashboards.shards import (
    GLOBAL_RULES_FILE,
    SHARD_RULES_FILE,
    main,
    metric_names,
    render,
    shard_config,
    split_rules,
)

HERE = Path(__file__).resolve().parent
DEPLOY = REPO / "deploy" / "prometheus"
needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None,
                                    reason="promtool missing: apt-get install prometheus")


def _names(groups: list[dict[str, Any]]) -> list[str]:
    return [r.get("record") or r["alert"] for g in groups for r in g["rules"]]


def _key(rule: dict[str, Any]) -> str:
    return yaml.safe_dump(rule, sort_keys=True)


def test_the_split_holds_every_shipped_rule_once_in_its_groups_order() -> None:
    groups = rule_groups()
    split = split_rules(groups)
    single = Counter(_key(r) for g in groups for r in g["rules"])
    assert Counter(_key(r) for g in split.shard + split.global_ for r in g["rules"]) == single
    # Within each side a group keeps its name and its rules' order (the hang rules read the
    # ones above them at the same evaluation).
    order = {g["name"]: [_key(r) for r in g["rules"]] for g in groups}
    for side in (split.shard, split.global_):
        for group in side:
            keys = [_key(r) for r in group["rules"]]
            assert keys == [k for k in order[group["name"]] if k in keys]


def test_per_run_alerts_are_global_and_per_node_ones_stay_on_the_shard() -> None:
    split = split_rules(rule_groups())
    shard, global_ = set(_names(split.shard)), set(_names(split.global_))
    assert {"LaggardStragglerDetected", "LaggardStragglerRank", "LaggardStragglerThrottled",
            "LaggardSlowLink", "LaggardJobSlowdown", "LaggardJobHung"} <= global_
    assert {"LaggardGpuThrottled", "LaggardGpuXidCritical", "LaggardGpuLost",
            "LaggardAgentDown", "LaggardCollectorFailing"} <= shard
    # The per-node recording rules (each agent's own histograms) run where the histograms are;
    # the run median and the ratio to it need every node.
    assert {"instance_rank:laggard_compute_seconds_per_step:mean2m",
            "instance_gpu_xid:laggard_gpu_xid_errors:new5m"} <= shard
    assert {"run:laggard_compute_seconds_per_step:median2m",
            "instance_rank:laggard_compute_seconds_per_step:ratio_to_median"} <= global_


def test_the_global_layer_receives_every_series_its_rules_read() -> None:
    split = split_rules(rule_groups())
    recorded_on_shard = {r["record"] for g in split.shard for r in g["rules"] if "record" in r}
    recorded_globally = {r["record"] for g in split.global_ for r in g["rules"] if "record" in r}
    read = set().union(*(metric_names(r["expr"]) for g in split.global_ for r in g["rules"]))
    assert read <= recorded_globally | set(split.remote_write_names)
    for name in split.remote_write_names:
        assert ":" not in name or name in recorded_on_shard, name
    # Per-GPU and per-link detail stays on the shards.
    assert "laggard_gpu_sm_clock_hertz" not in split.remote_write_names
    assert not any(n.startswith(("laggard_network_", "laggard_infiniband_"))
                   for n in split.remote_write_names)


@pytest.mark.parametrize(("expr", "on_shard"), [
    ("sum by (instance, gpu) (laggard_x)", True),
    ("laggard_x / laggard_y", True),
    ("sum(laggard_x)", False),                                 # every node the server holds
    ("max by (run) (laggard_x)", False),
    ("max without (instance) (laggard_x)", False),
    ("laggard_x / on (run) group_left laggard_y", False),
    ("laggard_x / ignoring (instance) laggard_y", False),
    ('sum by (instance) (laggard_x{reason="max by (run) (y)"})', True),  # a string, not code
])
def test_a_recording_rule_stays_on_the_shard_only_if_it_keeps_instance(
        expr: str, on_shard: bool) -> None:
    rule = {"record": "instance:laggard_x:z", "expr": expr}
    split = split_rules([{"name": "g", "rules": [rule]}])
    assert bool(split.shard) is on_shard
    assert bool(split.global_) is not on_shard


def test_a_rule_reading_a_global_series_is_global_and_an_alert_naming_run_too() -> None:
    rules = [
        {"record": "run:laggard_x:median", "expr": "quantile by (run) (0.5, laggard_x)"},
        {"record": "instance:laggard_x:ratio", "expr": "laggard_x / run:laggard_x:median"},
        {"record": "job:laggard_x:sum", "expr": "sum by (job, instance) (laggard_x)"},
        {"alert": "PerNode", "expr": "max by (instance) (laggard_x) > 1"},
        {"alert": "PerRun", "expr": "max by (instance, run) (laggard_x) > 1"},
        {"alert": "PerRunMatcher", "expr": 'laggard_x{run="a"} > 1'},
    ]
    split = split_rules([{"name": "g", "rules": rules}])
    assert _names(split.shard) == ["PerNode"]
    assert split.remote_write_names == ("laggard_x",)


@needs_promtool
@pytest.mark.parametrize("tests", ["rules_test.yml", "hang_rules_test.yml"])
def test_shard_and_global_rules_pass_the_single_servers_unit_tests(
        tests: str, tmp_path: Path) -> None:
    # Both files in one evaluator, the shard's first: the same alerts at the same times as the
    # single server's files (a real global layer sees the shards' series up to
    # batch_send_deadline later).
    files = render(2, remote_write_url="http://global/api/v1/write", rules_dir=str(tmp_path),
                   targets=["node01:9477"])
    paths = []
    for name in (SHARD_RULES_FILE, GLOBAL_RULES_FILE):
        (tmp_path / name).write_text(files[f"rules/{name}"])
        paths.append(str(tmp_path / name))
    doc = yaml.safe_load((HERE / tests).read_text())
    doc["rule_files"] = paths
    (tmp_path / tests).write_text(yaml.safe_dump(doc))
    result = subprocess.run(["promtool", "test", "rules", str(tmp_path / tests)],
                            capture_output=True, text=True, timeout=budget(120))
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_generated_configurations_pass_promtool(tmp_path: Path) -> None:
    files = render(3, remote_write_url="http://global:9090/api/v1/write",
                   rules_dir=str(tmp_path / "rules"), file_sd=str(tmp_path / "targets/*.yml"),
                   alertmanagers=["alertmanager:9093"])
    assert sorted(files) == ["prometheus-global.yml", "prometheus-shard-0.yml",
                             "prometheus-shard-1.yml", "prometheus-shard-2.yml",
                             f"rules/{GLOBAL_RULES_FILE}", f"rules/{SHARD_RULES_FILE}"]
    for relative, text in files.items():
        (tmp_path / relative).parent.mkdir(exist_ok=True)
        (tmp_path / relative).write_text(text)
    configs = [tmp_path / name for name in files if name.startswith("prometheus-")]
    result = subprocess.run(["promtool", "check", "config", *map(str, configs)],
                            capture_output=True, text=True, timeout=budget(60))
    assert result.returncode == 0, result.stdout + result.stderr
    shard = yaml.safe_load(files["prometheus-shard-2.yml"])
    assert shard["scrape_configs"][0]["relabel_configs"] == [
        {"source_labels": ["__address__"], "modulus": 3, "target_label": "__tmp_hashmod",
         "action": "hashmod"},
        {"source_labels": ["__tmp_hashmod"], "regex": "2", "action": "keep"}]
    assert shard["global"]["external_labels"] == {"shard": "2"}


def test_deploy_folder_is_the_generated_set_for_two_shards() -> None:
    files = render(2, remote_write_url="http://prometheus-global:9090/api/v1/write",
                   rules_dir="/etc/prometheus/laggard/rules",
                   file_sd="/etc/prometheus/laggard/targets/*.yml")
    for relative, text in files.items():
        assert (DEPLOY / relative).read_text() == text, (
            f"deploy/prometheus/{relative} is stale: python -m laggard.dashboards.shards "
            "--shards 2 --out deploy/prometheus")


def test_the_command_writes_the_set_and_fails_cleanly_on_an_unwritable_folder(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--shards", "2", "--out", str(tmp_path / "out")]) == 0
    for relative in render(2, remote_write_url="u", rules_dir="r", targets=["t:1"]):
        assert (tmp_path / "out" / relative).is_file()
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["--shards", "2", "--out", str(blocker / "out")]) == 1
    assert "cannot write" in capsys.readouterr().err


@pytest.mark.parametrize(("index", "count", "targets"), [(2, 2, ["t:1"]), (0, 2, [])])
def test_shard_config_rejects_a_bad_index_or_no_targets(
        index: int, count: int, targets: list[str]) -> None:
    with pytest.raises(ValueError):
        shard_config(index, count, remote_write_url="u", remote_write_names=["x"],
                     rules_dir="r", targets=targets)
