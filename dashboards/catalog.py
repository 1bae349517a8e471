"""The dashboards and rule files laggard ships, and how they are written to disk.

``dashboards/generated/`` holds the rendered copies committed to the repository and installed
with the package (a test keeps them equal to what the builders produce); ``dashboards/rules/``
holds the Prometheus rule files. The builders need grafana-foundation-sdk, which needs Python
3.11+: without it, :func:`dashboard_files` falls back to the packaged copies.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

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

#: uid -> module with the builder (``build()``), in the order Grafana's folder lists them.
DASHBOARDS: dict[str, str] = {
    "laggard-job-overview": "laggard.dashboards.job_overview",
    "laggard-node-gpus": "laggard.dashboards.node_gpus",
    "laggard-network": "laggard.dashboards.network",
    "laggard-communication": "laggard.dashboards.communication",
}


def render_dashboards() -> dict[str, dict[str, Any]]:
    """Build every dashboard with the builders.

    Returns:
        file name (``<uid>.json``) -> dashboard JSON model.

    Raises:
        ImportError: grafana-foundation-sdk is not installed (or this Python is older than 3.11).
    """
    from laggard.dashboards.panels import to_json

    models = {}
    for uid, module_name in DASHBOARDS.items():
        module = importlib.import_module(module_name)
        assert module.UID == uid, module_name
        models[f"{uid}.json"] = to_json(module.build())
    return models


def dashboard_files() -> tuple[dict[str, str], bool]:
    """The dashboards' file contents, and whether the builders made them.

    Returns:
        (file name -> JSON text, True) from the builders, or (the packaged copies, False) when
        grafana-foundation-sdk cannot be imported.
    """
    try:
        models = render_dashboards()
    except ImportError:
        names = [f"{uid}.json" for uid in DASHBOARDS]
        return {name: (GENERATED_DIR / name).read_text(encoding="utf-8") for name in names}, False
    return {name: dashboard_text(model) for name, model in models.items()}, True


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


def render_files(provisioning_path: str, rules: bool = True,
                 dashboards: dict[str, str] | None = None) -> dict[str, str]:
    """Every file ``laggard dashboards`` writes: relative path -> text.

    Args:
        provisioning_path: dashboards folder named in the provisioning file.
        rules: add the Prometheus rule files, under ``rules/``.
        dashboards: the dashboards' files; by default those the builders make.

    Raises:
        ImportError: PyYAML missing (the PrometheusRule manifest needs it).
    """
    files = dict(dashboards) if dashboards is not None else {
        name: dashboard_text(model) for name, model in render_dashboards().items()}
    files[PROVISIONING_FILE] = provisioning_text(provisioning_path)
    if rules:
        for name in RULE_FILES:
            files[f"rules/{name}"] = (RULES_DIR / name).read_text(encoding="utf-8")
        files[f"rules/{PROMETHEUS_RULE_FILE}"] = prometheus_rule_text()
    return files


def rule_groups() -> list[dict[str, Any]]:
    """The rule files' groups, in :data:`RULE_FILES` order: what a single server evaluates.

    Raises:
        ImportError: PyYAML missing.
    """
    import yaml  # the dashboards extra brings it; only the rule renderers need it

    groups: list[dict[str, Any]] = []
    for name in RULE_FILES:
        groups += yaml.safe_load((RULES_DIR / name).read_text(encoding="utf-8"))["groups"]
    return groups


def block_yaml(doc: Any) -> str:
    """``doc`` as YAML, multi-line strings (rule expressions) as ``|`` blocks, keys in order.

    Raises:
        ImportError: PyYAML missing.
    """
    import yaml

    class _BlockDumper(yaml.SafeDumper):
        pass

    def _str(dumper: yaml.SafeDumper, text: str) -> yaml.Node:
        style = "|" if "\n" in text else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)

    _BlockDumper.add_representer(str, _str)
    return yaml.dump(doc, Dumper=_BlockDumper, sort_keys=False, width=100)


def prometheus_rule_text(namespace: str = "laggard") -> str:
    """The rule files as one Prometheus Operator ``PrometheusRule`` manifest (YAML text).

    The groups are the rule files' own, in :data:`RULE_FILES` order, so Kubernetes and plain
    Prometheus evaluate the same rules.
    """
    manifest = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "laggard",
            "namespace": namespace,
            "labels": {"app.kubernetes.io/part-of": "laggard"},
        },
        "spec": {"groups": rule_groups()},
    }
    return (f"# Generated from dashboards/rules/ by laggard dashboards: do not edit by hand.\n"
            f"{block_yaml(manifest)}")
