"""From an alert to the node it is about, through Prometheus's HTTP API and the agent's
``/findings``.

The queries (Prometheus's ``GET /api/v1/query`` and ``GET /api/v1/targets``,
prometheus.io/docs/prometheus/latest/querying/api/):

- ``laggard_agent_info{instance="I"}``: the agent's ``node`` label (its ``--node`` flag, else
  its host name, the name Slurm and Kubernetes know it by);
- ``laggard_rank_info{run="R", rank="K"}``: the rank's ``node``;
- ``laggard_rank_info{run="R"}``: every node of a run (the per-job share guard);
- ``laggard_rank_info{node="N"}``: the runs on a node;
- the active targets: the scrape URL of instance I, whose ``/findings`` sits beside
  ``/metrics`` (agent/web.py). Under the Kubernetes manifests ``instance`` is the node's name,
  not an address, so the URL is never guessed from it.
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from laggard.actions.alert_actions import AlertAction

#: Seconds one HTTP request to Prometheus or an agent may take.
HTTP_TIMEOUT_S = 5.0


class LocateError(RuntimeError):
    """Prometheus or the agent could not be asked, or did not name a node (message says which)."""


@dataclass(frozen=True, slots=True)
class Target:
    """A node an alert is about.

    Attributes:
        node: the node's name.
        labels: what the alert's labels lack and the lookup found (``run``, ``rank`` of a
            corrupt-gradient finding), for the reason's subject.
    """

    node: str
    labels: Mapping[str, str] = field(default_factory=dict)


def _quote(value: str) -> str:
    """A PromQL string literal: JSON's escapes are a subset of PromQL's (Go's)."""
    return json.dumps(value)


class Locator:
    """Finds nodes through one Prometheus server.

    Args:
        prometheus_url: its base URL (``http://host:9090``); None: only alerts that carry a
            ``node`` label can be placed.
        timeout: seconds per request.
    """

    def __init__(self, prometheus_url: str | None, *, timeout: float = HTTP_TIMEOUT_S) -> None:
        self.prometheus_url = prometheus_url.rstrip("/") if prometheus_url else None
        self.timeout = timeout

    def targets(self, action: AlertAction, labels: Mapping[str, str]) -> list[Target]:
        """The nodes an alert is about.

        Raises:
            LocateError: a needed label is missing, a request failed, or nothing named a node.
        """
        if labels.get("node"):
            return [Target(labels["node"])]
        if action.locate == "instance":
            return [Target(self.agent_node(_need(labels, "instance")))]
        if action.locate == "rank":
            run, rank = _need(labels, "run"), _need(labels, "rank")
            return [Target(self.rank_node(run, rank))]
        if action.locate == "integrity":
            ranks = self.corrupt_ranks(_need(labels, "instance"), labels.get("kind"))
            if not ranks:
                raise LocateError(f"{labels['instance']}'s /findings names no corrupt rank")
            return [Target(self.rank_node(run, rank), {"run": run, "rank": rank})
                    for run, rank in ranks]
        raise LocateError(f"unknown way to locate: {action.locate}")

    def agent_node(self, instance: str) -> str:
        """The node of the agent scraped as ``instance``."""
        nodes = {r["metric"].get("node", "") for r in self.query(
            f"laggard_agent_info{{instance={_quote(instance)}}}")} - {""}
        return _one(nodes, f"laggard_agent_info of instance {instance}")

    def rank_node(self, run: str, rank: str) -> str:
        """The node of rank ``rank`` of run ``run``."""
        nodes = {r["metric"].get("node", "") for r in self.query(
            f"laggard_rank_info{{run={_quote(run)}, rank={_quote(rank)}}}")} - {""}
        return _one(nodes, f"laggard_rank_info of run {run} rank {rank}")

    def run_nodes(self, run: str) -> set[str]:
        """Every node with a rank of run ``run``."""
        return {r["metric"].get("node", "") for r in self.query(
            f"laggard_rank_info{{run={_quote(run)}}}")} - {""}

    def node_runs(self, node: str) -> set[str]:
        """Every run with a rank on ``node``."""
        return {r["metric"].get("run", "") for r in self.query(
            f"laggard_rank_info{{node={_quote(node)}}}")} - {""}

    def corrupt_ranks(self, instance: str, kind: str | None) -> list[tuple[str, str]]:
        """(run, rank) of every corrupt-gradient finding on the ``/findings`` of the agent
        scraped as ``instance``: detector ``integrity``, severity ``critical``, a rank, not
        cleared, of ``kind`` when given; in the order the agent lists them, each once."""
        url = self.scrape_url(instance)
        parts = urllib.parse.urlsplit(url)
        findings = _get_json(urllib.parse.urlunsplit(
            (parts.scheme, parts.netloc, "/findings", "", "")), self.timeout)
        if not isinstance(findings, list):
            raise LocateError(f"{instance}'s /findings is not a list")
        out: list[tuple[str, str]] = []
        for doc in findings:
            if not isinstance(doc, dict) or doc.get("detector") != "integrity":
                continue
            if doc.get("severity") != "critical" or doc.get("cleared") or doc.get("ended_at"):
                continue
            if kind and doc.get("kind") != kind or not isinstance(doc.get("rank"), int):
                continue
            pair = (str(doc.get("run", "")), str(doc["rank"]))
            if pair not in out:
                out.append(pair)
        return out

    def scrape_url(self, instance: str) -> str:
        """The scrape URL of the active target labelled ``instance``."""
        doc = self._api("/api/v1/targets", {"state": "active"})
        for target in doc.get("activeTargets", []):
            if target.get("labels", {}).get("instance") == instance:
                return str(target["scrapeUrl"])
        raise LocateError(f"no active Prometheus target with instance {instance}")

    def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant query's vector result."""
        doc = self._api("/api/v1/query", {"query": promql})
        if doc.get("resultType") != "vector":
            raise LocateError(f"{promql}: result type {doc.get('resultType')!r}")
        return list(doc.get("result", []))

    def _api(self, path: str, params: dict[str, str]) -> dict[str, Any]:
        if self.prometheus_url is None:
            raise LocateError("no --prometheus-url: only alerts with a node label can be placed")
        url = f"{self.prometheus_url}{path}?{urllib.parse.urlencode(params)}"
        doc = _get_json(url, self.timeout)
        if not isinstance(doc, dict) or doc.get("status") != "success":
            raise LocateError(f"{url}: {doc.get('error') if isinstance(doc, dict) else doc}")
        return dict(doc.get("data", {}))


def _get_json(url: str, timeout: float) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return json.load(response)
    except (OSError, ValueError) as exc:  # URLError, HTTPError, timeouts, bad JSON
        raise LocateError(f"{url}: {exc}") from None


def _need(labels: Mapping[str, str], name: str) -> str:
    value = labels.get(name, "")
    if not value:
        raise LocateError(f"the alert has no {name} label")
    return value


def _one(nodes: set[str], what: str) -> str:
    if len(nodes) != 1:
        found = "nodes " + ", ".join(sorted(nodes)) if nodes else "no node"
        raise LocateError(f"{what}: {found}")
    return nodes.pop()
