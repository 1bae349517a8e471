"""The alerts remediate acts on are laggard's own, by their real names and severities."""

from __future__ import annotations

import yaml

from laggard.actions.alert_actions import ALERT_ACTIONS
from laggard.dashboards.catalog import RULES_DIR


def _alerts() -> dict[str, dict]:
    doc = yaml.safe_load((RULES_DIR / "laggard-alerts.yml").read_text())
    return {r["alert"]: r for g in doc["groups"] for r in g["rules"] if "alert" in r}


def test_every_alert_acted_on_exists_in_the_rules() -> None:
    rules = _alerts()
    assert set(ALERT_ACTIONS) <= set(rules)
    severities = {name: rules[name]["labels"]["severity"] for name in ALERT_ACTIONS}
    assert severities == {"LaggardGpuLost": "critical", "LaggardGpuXidCritical": "critical",
                          "LaggardStragglerRank": "warning", "LaggardJobHung": "critical",
                          "LaggardGradientsCorrupt": "critical"}


def test_subjects_name_what_the_alert_is_about() -> None:
    assert ALERT_ACTIONS["LaggardGpuLost"].subject({"gpu": "1"}) == "gpu1"
    assert ALERT_ACTIONS["LaggardGpuLost"].subject(
        {"gpu": "", "pci_bus_id": "0000:3b:00"}) == "0000:3b:00"
    assert ALERT_ACTIONS["LaggardGpuXidCritical"].subject({"xid": "79", "gpu": "0"}) == "79/gpu0"
    assert ALERT_ACTIONS["LaggardJobHung"].subject(
        {"run": "r", "rank": "3", "kind": "device"}) == "r/rank3/device"
    assert ALERT_ACTIONS["LaggardGradientsCorrupt"].subject(
        {"run": "r", "rank": "2", "kind": "replica_mismatch"}) == "r/rank2/replica_mismatch"


def test_only_alerts_whose_end_means_a_well_node_give_it_back() -> None:
    releasing = {name for name, a in ALERT_ACTIONS.items() if a.release_on_resolve}
    assert releasing == {"LaggardGpuLost", "LaggardStragglerRank", "LaggardJobHung"}
