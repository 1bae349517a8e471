"""Deployment files: the systemd unit passes ``systemd-analyze verify`` and its command line is
one the agent accepts; the Kubernetes manifests pass the Kubernetes API schemas (offline, with
kubernetes-validate) and agree with each other and with the shipped rule files."""

from __future__ import annotations

import copy
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import budget

from laggard.cli import build_parser
from laggard.dashboards.catalog import RULE_FILES, RULES_DIR, prometheus_rule_text

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "deploy" / "systemd" / "laggard-agent.service"
K8S = REPO / "deploy" / "kubernetes"
TRAINING_JOB = K8S / "examples" / "training-job.yaml"
SOCKET = "/run/laggard/intake.sock"
#: Oldest Kubernetes release still commonly run, and the newest the validator knows.
K8S_VERSIONS = ("1.29.0", "1.37.0")
CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}


def _manifests() -> dict[str, dict[str, Any]]:
    docs = {}
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                docs[doc["kind"]] = doc
    return docs


def _unit_exec_start() -> list[str]:
    (line,) = [ln for ln in UNIT.read_text().splitlines() if ln.startswith("ExecStart=")]
    return shlex.split(line.removeprefix("ExecStart="))


def _agent_args(argv: list[str]) -> Any:
    return build_parser(argv).parse_args(argv)


def _laggard_binary() -> str:
    found = shutil.which("laggard") or str(Path(sys.executable).parent / "laggard")
    assert Path(found).exists(), "laggard console script not installed"
    return found


# -- systemd -----------------------------------------------------------------------------------

needs_systemd_analyze = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None,
    reason="systemd-analyze missing (Debian package systemd)",
)


def _verify(unit_text: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    # verify checks that ExecStart's binary exists: point it at the laggard installed here.
    unit = tmp_path / UNIT.name
    unit.write_text(unit_text.replace(_unit_exec_start()[0], _laggard_binary()))
    return subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True,
                          text=True, timeout=budget(60))


@needs_systemd_analyze
def test_systemd_unit_verifies_clean(tmp_path: Path) -> None:
    result = _verify(UNIT.read_text(), tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout + result.stderr == ""


@needs_systemd_analyze
def test_systemd_analyze_rejects_a_broken_unit(tmp_path: Path) -> None:
    broken = UNIT.read_text().replace("DynamicUser=yes", "DynamicUser=perhaps")
    result = _verify(broken, tmp_path)
    assert result.returncode != 0
    assert "DynamicUser" in result.stderr or "perhaps" in result.stderr


def test_systemd_exec_start_is_a_command_line_the_agent_accepts() -> None:
    argv = [a for a in _unit_exec_start()[1:] if a != "$LAGGARD_AGENT_ARGS"]
    assert _unit_exec_start()[-1] == "$LAGGARD_AGENT_ARGS"
    args = _agent_args(argv)
    assert args.listen_address == ":9477"
    # The Unix socket in the unit's RuntimeDirectory; no UDP intake (nothing on a port).
    assert args.intake_socket == SOCKET
    assert args.intake_address == ""
    unit = UNIT.read_text()
    assert "\nRuntimeDirectory=laggard\n" in unit
    assert "\nRuntimeDirectoryMode=0755\n" in unit


# -- Kubernetes --------------------------------------------------------------------------------


def test_manifests_hold_the_expected_objects() -> None:
    assert set(_manifests()) == {"Namespace", "DaemonSet", "Service", "ServiceMonitor",
                                 "PrometheusRule"}


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_core_manifests_pass_the_kubernetes_schemas(version: str) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    for kind, doc in _manifests().items():
        if kind not in CRD_KINDS:
            kubernetes_validate.validate(doc, version, strict=True)


def test_the_validator_rejects_a_broken_daemonset() -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    broken = copy.deepcopy(_manifests()["DaemonSet"])
    broken["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "9477"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSIONS[-1], strict=True)
    broken = copy.deepcopy(_manifests()["DaemonSet"])
    broken["spec"]["template"]["spec"]["hostNetwrok"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSIONS[-1], strict=True)


def test_daemonset_mounts_what_the_collectors_read_and_passes_valid_flags() -> None:
    pod = _manifests()["DaemonSet"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    host_paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    mounts = {m["mountPath"]: host_paths[m["name"]] for m in container["volumeMounts"]}
    # Read-only but for the socket's directory, where the agent makes its socket.
    writable = [m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")]
    assert writable == ["/run/laggard"]
    # $(VAR) is expanded by the kubelet from the downward API; any address will do to parse.
    argv = [a.replace("$(NODE_IP)", "192.0.2.10").replace("$(NODE_NAME)", "gpu-node-1")
            for a in container["args"]]
    args = _agent_args(argv)
    assert mounts[args.sysfs_root] == "/sys"
    assert mounts[args.proc_root] == "/proc"
    assert mounts[getattr(args, "path.kmsg")] == "/dev/kmsg"
    assert args.listen_address == "192.0.2.10:9477"
    # The intake: the socket in the hostPath directory, nothing on the node's IP; host PID so
    # the kernel's sender pids are those of /host/proc.
    assert args.intake_socket == SOCKET and mounts["/run/laggard"] == "/run/laggard"
    assert args.intake_address == ""
    assert pod["hostPID"] is True
    assert {p["name"] for p in container["ports"]} == {"metrics"}
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert pod["hostNetwork"] is True


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_training_job_example_mounts_the_agents_socket(version: str) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    job = yaml.safe_load(TRAINING_JOB.read_text())
    kubernetes_validate.validate(job, version, strict=True)
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    host_paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    mounts = {m["mountPath"]: host_paths[m["name"]] for m in container["volumeMounts"]}
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["LAGGARD_INTAKE"] == SOCKET
    # the pod's mount is the agent's socket directory on the host
    agent_pod = _manifests()["DaemonSet"]["spec"]["template"]["spec"]
    agent_dirs = {v["hostPath"]["path"] for v in agent_pod["volumes"]}
    assert mounts[str(Path(SOCKET).parent)] in agent_dirs
    assert "hostNetwork" not in pod  # a plain pod: the socket needs no host network


def test_service_and_service_monitor_select_the_agent_pods() -> None:
    docs = _manifests()
    daemonset, service, monitor = docs["DaemonSet"], docs["Service"], docs["ServiceMonitor"]
    pod_labels = daemonset["spec"]["template"]["metadata"]["labels"]
    assert daemonset["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert service["spec"]["selector"].items() <= pod_labels.items()
    container_ports = {p["name"] for p in
                       daemonset["spec"]["template"]["spec"]["containers"][0]["ports"]}
    service_ports = {p["name"]: p for p in service["spec"]["ports"]}
    assert service_ports["metrics"]["targetPort"] in container_ports
    service_labels = service["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service_labels.items()
    namespace = docs["Namespace"]["metadata"]["name"]
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [namespace]
    assert {d["metadata"].get("namespace") for k, d in docs.items() if k != "Namespace"} == {
        namespace}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in service_ports
    # The scrape job's name is the Service's jobLabel value: the LaggardAgentDown alert's job.
    assert service_labels[monitor["spec"]["jobLabel"]] == "laggard"
    assert 'up{job="laggard"}' in (RULES_DIR / "laggard-alerts.yml").read_text()
    assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"],
            "targetLabel": "instance"} in endpoint["relabelings"]


def test_prometheus_rule_is_generated_from_the_rule_files() -> None:
    assert (K8S / "prometheusrule.yaml").read_text() == prometheus_rule_text(), (
        "regenerate: laggard dashboards --out DIR, then copy DIR/rules/"
        "laggard-prometheusrule.yaml to deploy/kubernetes/prometheusrule.yaml")
    groups = _manifests()["PrometheusRule"]["spec"]["groups"]
    shipped = [g for name in RULE_FILES
               for g in yaml.safe_load((RULES_DIR / name).read_text())["groups"]]
    assert groups == shipped


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool missing")
def test_prometheus_rule_groups_pass_promtool(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump({"groups": _manifests()["PrometheusRule"]["spec"]["groups"]}))
    result = subprocess.run(["promtool", "check", "rules", str(rules)], capture_output=True,
                            text=True, timeout=budget(60))
    assert result.returncode == 0, result.stdout + result.stderr
