"""The dashboards and rule files laggard ships, and how they are written to disk.

``dashboards/generated/`` holds the rendered copies committed to the repository (a test keeps
them equal to what the builders produce); ``dashboards/rules/`` holds the Prometheus rule files.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders.dashboard import Dashboard
from laggard.dashboards import communication, job_overview, network, node_gpus
from laggard.dashboards.panels import to_json

PACKAGE_DIR = Path(__file__).resolve().parent
GENERATED_DIR = PACKAGE_DIR / "generated"
RULES_DIR = PACKAGE_DIR / "rules"
#: Rule files, in the order ``rule_files:`` should list them.
RULE_FILES = ("laggard-recording.yml", "laggard-alerts.yml")
#: Name of the Grafana dashboard provisioning file written beside the dashboards.
PROVISIONING_FILE = "laggard-dashboards.yaml"
#: The rule files wrapped for the Prometheus Operator (``deploy/kubernetes/`` has a copy).
PROMETHEUS_RULE_FILE = "laggard-prometheusrule.yaml"
#: Where the committed provisioning file tells Grafana to look (the Debian/RPM layout).
DEFAULT_PROVISIONING_PATH = "/var/lib/grafana/dashboards/laggard"

#: uid -> builder, in the order Grafana's folder lists them.
BUILDERS: dict[str, Callable[[], Dashboard]] = {
    job_overview.UID: job_overview.build,
    node_gpus.UID: node_gpus.build,
    network.UID: network.build,
    communication.UID: communication.build,
}


def render_dashboards() -> dict[str, dict[str, Any]]:
    """Build every dashboard.

    Returns:
        file name (``<uid>.json``) -> dashboard JSON model.
    """
    return {f"{uid}.json": to_json(build()) for uid, build in BUILDERS.items()}


def dashboard_text(model: dict[str, Any]) -> str:
    """The file content of one dashboard: sorted, indented JSON with a final newline."""
    return json.dumps(model, indent=2, sort_keys=True) + "\n"


def provisioning_text(dashboards_path: str) -> str:
    """Grafana's dashboard provisioning file for a folder of laggard dashboards.

    Args:
        dashboards_path: the folder holding the ``.json`` files, as Grafana will see it.

    Format: Grafana's "Provision dashboards" documentation (``apiVersion: 1``, one ``file``
    provider).
    """
    return (
        "# laggard dashboards for Grafana: copy to /etc/grafana/provisioning/dashboards/\n"
        "apiVersion: 1\n"
        "providers:\n"
        "  - name: laggard\n"
        "    orgId: 1\n"
        "    folder: laggard\n"
        "    type: file\n"
        "    disableDeletion: false\n"
        "    allowUiUpdates: false\n"
        "    updateIntervalSeconds: 60\n"
        "    options:\n"
        f"      path: {json.dumps(dashboards_path)}\n"
        "      foldersFromFilesStructure: false\n"
    )


def render_files(provisioning_path: str, rules: bool = True) -> dict[str, str]:
    """Every file ``laggard dashboards`` writes: relative path -> text.

    Args:
        provisioning_path: dashboards folder named in the provisioning file.
        rules: add the Prometheus rule files, under ``rules/``.
    """
    files = {name: dashboard_text(model) for name, model in render_dashboards().items()}
    files[PROVISIONING_FILE] = provisioning_text(provisioning_path)
    if rules:
        for name in RULE_FILES:
            files[f"rules/{name}"] = (RULES_DIR / name).read_text(encoding="utf-8")
        files[f"rules/{PROMETHEUS_RULE_FILE}"] = prometheus_rule_text()
    return files


def prometheus_rule_text(namespace: str = "laggard") -> str:
    """The rule files as one Prometheus Operator ``PrometheusRule`` manifest (YAML text).

    The groups are the rule files' own, in :data:`RULE_FILES` order, so Kubernetes and plain
    Prometheus evaluate the same rules.
    """
    import yaml  # the dashboards extra brings it; only this function needs it

    groups = []
    for name in RULE_FILES:
        groups += yaml.safe_load((RULES_DIR / name).read_text(encoding="utf-8"))["groups"]
    manifest = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "laggard",
            "namespace": namespace,
            "labels": {"app.kubernetes.io/part-of": "laggard"},
        },
        "spec": {"groups": groups},
    }

    class _BlockDumper(yaml.SafeDumper):
        pass

    def _str(dumper: yaml.SafeDumper, text: str) -> yaml.Node:
        style = "|" if "\n" in text else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)

    _BlockDumper.add_representer(str, _str)
    body = yaml.dump(manifest, Dumper=_BlockDumper, sort_keys=False, width=100)
    return (f"# Generated from dashboards/rules/ by laggard dashboards: do not edit by hand.\n"
            f"{body}")
