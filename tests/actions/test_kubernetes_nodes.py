"""Cordon + taint through the official kubernetes client, against an API server stand-in on
loopback that answers GET and PATCH of /api/v1/nodes/NAME as the API server does (it applies a
strategic-merge patch's top-level fields: the taint list is replaced whole, as for a real Node)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

kubernetes = pytest.importorskip("kubernetes", reason="pip install 'laggard[kubernetes]'")

from laggard.actions.kubernetes_nodes import (  # noqa: E402
    REASON_ANNOTATION,
    TAINT_KEY,
    KubernetesNodes,
)


class ApiServer:
    """Nodes by name, and the PATCH requests received (content type, body)."""

    def __init__(self) -> None:
        self.nodes: dict[str, dict[str, Any]] = {}
        self.patches: list[tuple[str, dict[str, Any]]] = []

    def node(self, name: str, *, unschedulable: bool = False,
             taints: list[dict[str, str]] | None = None) -> None:
        self.nodes[name] = {"apiVersion": "v1", "kind": "Node",
                            "metadata": {"name": name, "annotations": {}},
                            "spec": {"unschedulable": unschedulable, "taints": taints or []}}

    def handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _node(self) -> dict[str, Any] | None:
                prefix = "/api/v1/nodes/"
                name = self.path[len(prefix):] if self.path.startswith(prefix) else ""
                return server.nodes.get(name)

            def _reply(self, status: int, doc: Any) -> None:
                body = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # noqa: N802
                node = self._node()
                self._reply(200 if node else 404, node or {"kind": "Status", "code": 404})

            def do_PATCH(self) -> None:  # noqa: N802
                node = self._node()
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.patches.append((self.headers["Content-Type"], body))
                if node is None:
                    self._reply(404, {"kind": "Status", "code": 404})
                    return
                for key, value in body["metadata"]["annotations"].items():
                    if value is None:
                        node["metadata"]["annotations"].pop(key, None)
                    else:
                        node["metadata"]["annotations"][key] = value
                node["spec"].update(body["spec"])
                self._reply(200, node)

            def log_message(self, *args: object) -> None:
                pass

        return Handler


@pytest.fixture
def api() -> Iterator[tuple[Any, ApiServer]]:
    """A CoreV1Api of the official client talking to the stand-in."""
    state = ApiServer()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), state.handler())
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    config = kubernetes.client.Configuration(host=f"http://127.0.0.1:{httpd.server_address[1]}")
    yield kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(config)), state
    httpd.shutdown()


MAINTENANCE = {"key": "example.com/maintenance", "value": "fw", "effect": "NoSchedule"}


def test_dry_run_prints_the_exact_call_and_sends_nothing(api: tuple[Any, ApiServer]) -> None:
    core, state = api
    state.node("gpu-7", taints=[MAINTENANCE])
    decision = KubernetesNodes(api=core).quarantine("gpu-7", "laggard:gpu_lost:gpu1",
                                                    why="LaggardGpuLost firing")
    assert decision.outcome == "would_act"
    body = {"metadata": {"annotations": {REASON_ANNOTATION: "laggard:gpu_lost:gpu1"}},
            "spec": {"taints": [MAINTENANCE, {"effect": "NoSchedule", "key": TAINT_KEY,
                                              "value": "gpu_lost"}],
                     "unschedulable": True}}
    assert decision.detail == (f"CoreV1Api.patch_node(name='gpu-7', "
                               f"body={json.dumps(body, sort_keys=True)})")
    assert state.patches == []


def test_act_cordons_taints_and_release_undoes_only_laggards_part(
        api: tuple[Any, ApiServer]) -> None:
    core, state = api
    state.node("gpu-7", taints=[MAINTENANCE])
    nodes = KubernetesNodes(act=True, api=core)
    assert nodes.quarantine("gpu-7", "laggard:sdc:r/rank2/result_mismatch", why="x").acted
    content_type, _ = state.patches[0]
    assert content_type == "application/strategic-merge-patch+json"
    node = state.nodes["gpu-7"]
    assert node["spec"]["unschedulable"] is True
    assert node["spec"]["taints"] == [MAINTENANCE, {"key": TAINT_KEY, "value": "sdc",
                                                    "effect": "NoSchedule"}]
    assert nodes.held_reason("gpu-7") == "laggard:sdc:r/rank2/result_mismatch"
    again = nodes.quarantine("gpu-7", "laggard:sdc:r/rank2/result_mismatch", why="x")
    assert (again.outcome, len(state.patches)) == ("skipped", 1)
    assert nodes.release("gpu-7", why="resolved").acted
    assert node["spec"] == {"unschedulable": False, "taints": [MAINTENANCE]}
    assert REASON_ANNOTATION not in node["metadata"]["annotations"]


def test_a_node_cordoned_by_someone_else_is_left_alone(api: tuple[Any, ApiServer]) -> None:
    core, state = api
    state.node("gpu-8", unschedulable=True)
    nodes = KubernetesNodes(act=True, api=core)
    decision = nodes.quarantine("gpu-8", "laggard:gpu_lost:gpu0", why="x")
    assert (decision.outcome, decision.detail) == ("skipped",
                                                   "cordoned by someone else: left alone")
    release = nodes.release("gpu-8", why="x")
    assert release.outcome == "skipped" and "not quarantined by laggard" in release.detail
    assert state.patches == [] and state.nodes["gpu-8"]["spec"]["unschedulable"] is True


def test_an_unknown_node_is_a_failed_decision(api: tuple[Any, ApiServer]) -> None:
    core, _ = api
    decision = KubernetesNodes(act=True, api=core).quarantine("nope", "laggard:x:y", why="x")
    assert decision.outcome == "failed" and "404" in decision.detail
