"""deploy/kubernetes/node-problem-detector/: the manifests pass the Kubernetes API schemas
(kubernetes-validate, offline), the custom plugin monitor config is one NPD accepts (its field
names and checks, from kubernetes/node-problem-detector pkg/custompluginmonitor/types), and its
rule, run as NPD runs it (path + args, NPD's environment), gives NPD's exit statuses."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import budget, wait_for

from laggard.actions.healthcheck import MAX_MESSAGE_CHARS
from laggard.actions.healthcheck_flags import AGENT_URL_ENV
from laggard.cli import build_parser
from laggard.demo.harness import free_port

REPO = Path(__file__).resolve().parents[2]
NPD = REPO / "deploy" / "kubernetes" / "node-problem-detector"
AGENT_DAEMONSET = REPO / "deploy" / "kubernetes" / "daemonset.yaml"
K8S_VERSIONS = ("1.29.0", "1.37.0")

# NPD's JSON field names (config.go: CustomPluginConfig, pluginGlobalConfig; types.go:
# CustomRule; pkg/types: Condition's type, reason, message).
TOP_KEYS = {"plugin", "pluginConfig", "source", "conditions", "rules", "metricsReporting"}
PLUGIN_CONFIG_KEYS = {"invoke_interval", "timeout", "max_output_length", "concurrency",
                      "enable_message_change_based_condition_update", "skip_initial_status"}
RULE_KEYS = {"type", "condition", "reason", "path", "args", "timeout", "invoke_interval"}
CONDITION_KEYS = {"type", "reason", "message"}
# Go's time.ParseDuration, for the plain forms a config uses ("60s", "1m30s", "500ms").
GO_DURATION = re.compile(r"^(\d+(ns|us|ms|s|m|h))+$")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def _seconds(duration: str) -> float:
    assert GO_DURATION.match(duration), duration
    return sum(float(n) * _UNIT_SECONDS[u] for n, u in re.findall(r"(\d+)(ns|us|ms|s|m|h)",
                                                                    duration))


def _docs() -> list[dict[str, Any]]:
    return [doc for path in sorted(NPD.glob("*.yaml"))
            for doc in yaml.safe_load_all(path.read_text()) if doc]


def _kind(kind: str) -> dict[str, Any]:
    (doc,) = [d for d in _docs() if d["kind"] == kind]
    return doc


def _plugin_config() -> tuple[str, dict[str, Any]]:
    (name, text), = _kind("ConfigMap")["data"].items()
    return name, json.loads(text)


def _container() -> dict[str, Any]:
    (container,) = _kind("DaemonSet")["spec"]["template"]["spec"]["containers"]
    return container


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_manifests_pass_the_kubernetes_schemas(version: str) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    docs = _docs()
    assert {d["kind"] for d in docs} == {"ConfigMap", "DaemonSet", "ServiceAccount",
                                         "ClusterRoleBinding"}
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_plugin_config_is_one_npd_accepts() -> None:
    _, config = _plugin_config()
    assert set(config) <= TOP_KEYS and config["plugin"] == "custom"
    plugin = config["pluginConfig"]
    assert set(plugin) <= PLUGIN_CONFIG_KEYS
    assert all(set(c) == CONDITION_KEYS for c in config["conditions"])
    conditions = {c["type"] for c in config["conditions"]}
    for rule in config["rules"]:
        assert set(rule) <= RULE_KEYS
        # NPD's Validate: a rule's timeout within the global one; a permanent rule's condition
        # has a default.
        assert _seconds(rule["timeout"]) <= _seconds(plugin["timeout"])
        assert rule["type"] == "permanent" and rule["condition"] in conditions
    assert _seconds(plugin["invoke_interval"]) >= _seconds(plugin["timeout"])
    # NPD cuts the line at max_output_length: the healthcheck's whole line fits.
    assert plugin["max_output_length"] >= MAX_MESSAGE_CHARS


def test_the_rule_runs_laggard_healthcheck_with_flags_it_accepts() -> None:
    _, config = _plugin_config()
    (rule,) = config["rules"]
    assert Path(rule["path"]).name == "laggard"
    args = build_parser(rule["args"]).parse_args(rule["args"])
    assert args.command == "healthcheck" and not args.slurm
    # Two requests within their timeout each, plus the interpreter's start, within NPD's.
    assert 2 * args.timeout < _seconds(rule["timeout"])


def test_the_daemonset_mounts_the_config_and_points_the_plugin_at_the_agent() -> None:
    name, _ = _plugin_config()
    container = _container()
    (flag,) = [a for a in container["args"] if a.startswith("--config.custom-plugin-monitor=")]
    path = Path(flag.split("=", 1)[1])
    (mount,) = container["volumeMounts"]
    assert Path(mount["mountPath"]) == path.parent and path.name == name
    volumes = {v["name"]: v for v in _kind("DaemonSet")["spec"]["template"]["spec"]["volumes"]}
    assert volumes[mount["name"]]["configMap"]["name"] == _kind("ConfigMap")["metadata"]["name"]
    env = [e["name"] for e in container["env"]]
    url = next(e["value"] for e in container["env"] if e["name"] == AGENT_URL_ENV)
    # The kubelet expands $(NODE_IP) only from a variable defined before it.
    assert env.index("NODE_IP") < env.index(AGENT_URL_ENV)
    agent = yaml.safe_load(AGENT_DAEMONSET.read_text())
    (agent_container,) = agent["spec"]["template"]["spec"]["containers"]
    (port,) = agent_container["ports"]
    assert url == f"http://$(NODE_IP):{port['containerPort']}"
    assert "--web.listen-address=$(NODE_IP):9477" in agent_container["args"]
    assert _kind("DaemonSet")["spec"]["template"]["spec"]["hostNetwork"] is True
    binding = _kind("ClusterRoleBinding")
    (subject,) = binding["subjects"]
    assert subject["name"] == _kind("ServiceAccount")["metadata"]["name"] == (
        _kind("DaemonSet")["spec"]["template"]["spec"]["serviceAccountName"])


def _run_rule(agent_url: str) -> subprocess.CompletedProcess:
    """The rule as NPD runs it: its path (here, this venv's console script) and args, NPD's
    environment with LAGGARD_AGENT_URL."""
    _, config = _plugin_config()
    (rule,) = config["rules"]
    laggard = shutil.which("laggard") or str(Path(sys.executable).parent / "laggard")
    return subprocess.run([laggard, *rule["args"]], capture_output=True, text=True,
                          env={**os.environ, AGENT_URL_ENV: agent_url},
                          timeout=budget(_seconds(rule["timeout"])), check=False)


def test_the_rule_run_as_npd_runs_it_reports_a_lost_gpu_and_an_absent_agent(
        agent_factory, tmp_path: Path) -> None:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S+0000", time.gmtime(time.time() - 30))
    log = tmp_path / "kern.log"
    log.write_text(f"{stamp} node01 kernel: NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', "
                   "name=<unknown>, GPU has fallen off the bus.\n")
    agent = agent_factory("--collector.interval", "0.2", "--path.kmsg", str(log),
                          "--collector.nvml.fake-gpus", "2",
                          "--collector.nvml.fake-gpus-scenario", "steady")
    url = f"http://127.0.0.1:{agent.port}"
    assert wait_for(lambda: 'laggard_gpu_lost{gpu="",pci_bus_id="0000:91:00"} 1.0'
                    in agent.scrape(), 10)
    done = _run_rule(url)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout == "PROBLEM: GPU 0000:91:00 lost (+1 more)\n"
    absent = _run_rule(f"http://127.0.0.1:{free_port()}")
    assert absent.returncode == 2 and absent.stdout.startswith("UNKNOWN: agent unreachable")
