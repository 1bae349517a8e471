"""The agent's HTTP side on prometheus_client's own server: /metrics, /findings, /, 404."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.exposition import ThreadingWSGIServer

from laggard.agent.context import FindingLog
from laggard.agent.web import make_app, make_http_server


@pytest.fixture
def served():
    registry = CollectorRegistry()
    Gauge("laggard_test_value", "A value.", registry=registry).set(3)
    findings = FindingLog()
    server = make_http_server("127.0.0.1", 0, make_app(registry, findings))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server, findings
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def _get(server, path: str) -> tuple[int, str, bytes]:
    url = f"http://127.0.0.1:{server.server_port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.headers["Content-Type"], response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read()


def test_the_server_is_prometheus_clients_and_logs_no_request(served, capsys):
    server, _ = served
    assert isinstance(server, ThreadingWSGIServer) and server.daemon_threads
    status, _, body = _get(server, "/metrics")
    assert status == 200 and b"laggard_test_value 3.0" in body
    captured = capsys.readouterr()
    assert "GET /metrics" not in captured.err + captured.out  # the silent handler


def test_paths_beside_metrics(served):
    server, findings = served
    findings.add({"detector": "straggler", "kind": "compute", "severity": "warning",
                  "rank": 3, "step": 10, "message": "slow", "evidence": {"x": float("nan")}})
    status, content_type, body = _get(server, "/findings")
    assert status == 200 and content_type == "application/json"
    [finding] = json.loads(body)  # strict JSON: NaN became null
    assert finding["rank"] == 3 and finding["evidence"]["x"] is None
    status, content_type, body = _get(server, "/")
    assert status == 200 and content_type.startswith("text/html") and b"metrics" in body
    status, _, body = _get(server, "/metric")
    assert status == 404 and body == b"404 page not found\n"
