"""The dashboards the builders produce: stable identities, numbered panels and queries, the
template variables every query relies on, and committed copies equal to the builders' output."""

from __future__ import annotations

import re
from typing import Any

import pytest

from laggard.dashboards import catalog

DASHBOARDS = catalog.render_dashboards()
#: uids are part of Grafana URLs and of the provisioning: changing one breaks users' links.
STABLE_UIDS = {
    "laggard-job-overview",
    "laggard-node-gpus",
    "laggard-network",
    "laggard-communication",
}


def _panels(model: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in model["panels"] if p["type"] != "row"]


def test_committed_copies_match_the_builders() -> None:
    expected = catalog.render_files(catalog.DEFAULT_PROVISIONING_PATH, rules=False)
    committed = {p.name for p in catalog.GENERATED_DIR.iterdir() if p.is_file()}
    assert committed == set(expected), "run: laggard dashboards --out dashboards/generated " \
        "--provisioning-path /var/lib/grafana/dashboards/laggard --no-rules"
    for name, text in expected.items():
        assert (catalog.GENERATED_DIR / name).read_text() == text, f"{name} is stale"


def test_uids_are_stable_and_files_named_after_them() -> None:
    assert {m["uid"] for m in DASHBOARDS.values()} == STABLE_UIDS
    for name, model in DASHBOARDS.items():
        assert name == f"{model['uid']}.json"
        assert model["schemaVersion"] == 41
        assert "laggard" in model["tags"]


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_panel_ids_and_ref_ids_are_unique_and_set(name: str) -> None:
    model = DASHBOARDS[name]
    ids = [p["id"] for p in model["panels"]]
    assert all(isinstance(i, int) and i > 0 for i in ids)
    assert len(ids) == len(set(ids))
    for panel in _panels(model):
        refs = [t["refId"] for t in panel["targets"]]
        assert refs == [chr(ord("A") + i) for i in range(len(refs))], panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["title"] and panel["description"]


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_queries_use_only_defined_variables(name: str) -> None:
    model = DASHBOARDS[name]
    variables = {v["name"] for v in model["templating"]["list"]}
    assert {"datasource", "node"} <= variables
    builtins = {"__rate_interval", "__range", "__interval"}
    for panel in _panels(model):
        for target in panel["targets"]:
            used = set(re.findall(r"\$(\w+)", target["expr"]))
            assert used <= variables | builtins, (panel["title"], used)
            assert 'instance=~"$node"' in target["expr"], panel["title"]
            if "rank" in variables and re.search(r"laggard_(step|straggler|comm)", target["expr"]):
                assert 'rank=~"$rank"' in target["expr"], panel["title"]
                assert 'run=~"$run"' in target["expr"], panel["title"]
                # A rank number means something within its run only: never summed across runs.
                for by in re.findall(r"\bby \(([^)]*)\)", target["expr"]):
                    if "rank" in by:
                        assert "run" in by, (panel["title"], by)


def test_per_rank_dashboards_have_a_run_and_a_rank_variable() -> None:
    variables = DASHBOARDS["laggard-job-overview.json"]["templating"]["list"]
    assert [v["name"] for v in variables][:4] == ["datasource", "node", "run", "rank"]
    # The ranks listed are those of the runs chosen.
    assert 'run=~"$run"' in variables[3]["query"]
    # Communication reads the default set's per-run sums (issue 34): nodes and runs only.
    variables = DASHBOARDS["laggard-communication.json"]["templating"]["list"]
    assert [v["name"] for v in variables][:3] == ["datasource", "node", "run"]
    assert "rank" not in [v["name"] for v in variables]


def test_dashboards_read_the_default_set_only() -> None:
    """Issue 34: no panel needs --intake.rank-histograms (its per-rank families)."""
    opt_in = re.compile(r"\blaggard_(step_phase_seconds|step_seconds|steps_total|collective_"
                        r"seconds|collective_bytes_total|comm_\w+|rank_last_\w+|rank_stall_"
                        r"threshold_seconds)\b")
    for name, board in DASHBOARDS.items():
        for panel in _panels(board):
            for target in panel.get("targets", []):
                assert not opt_in.search(target["expr"]), (name, panel["title"])


def test_job_overview_has_the_panels_the_issue_asks_for() -> None:
    panels = {p["title"]: p for p in _panels(DASHBOARDS["laggard-job-overview.json"])}
    assert panels["Straggler score by rank"]["type"] == "heatmap"
    assert panels["Findings in the time range"]["type"] == "table"
    for title in ("Compute time per step by rank", "Collective wait per step by rank",
                  "Step time by rank", "Steps per second"):
        assert panels[title]["type"] == "timeseries"


def test_a_panel_without_queries_is_refused() -> None:
    from grafana_foundation_sdk.builders import timeseries

    from laggard.dashboards.panels import Board

    board = Board("x", "x", "x", [])
    with pytest.raises(ValueError, match="1 to 26 queries"):
        board.add(timeseries.Panel().title("empty"))
