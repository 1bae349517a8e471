"""Slow links and the rank others wait for, named from inside the job, from durations only.

Two inputs, both gathered by the training monitor once per window:

* **per process group, each member's per-step collective seconds** (issue to completion, its own
  clock). The members of a synchronous collective finish at about the same moment, so in each
  step the member with the *shortest* time arrived last (nobody was waited for), that time is
  the group's own transfer time, and each other member's excess over it is its wait for the
  last peer (:func:`group_waits`). No timestamp of one host is compared with another's.
* **each rank's link probe**: the round trip of a fixed payload to its successor on a ring of
  the gather group, timed on the sender's clock (``laggard.integrations.link_probe``). Edge
  ``r -> r+1`` is slow when both of its ends' links carry the payload slowly; a node whose
  incoming *and* outgoing edges are slow has the slow link (:class:`LinkDetector`). A collective
  cannot tell this apart by itself: in a ring every member waits for the slowest edge alike.

A compute straggler arrives last without a slow edge; a slow link shows slow edges on one node
while no rank's compute stands out: the two causes are told apart.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from laggard.detectors.finding import Finding, Severity

DETECTOR = "link"


@dataclass(kw_only=True, slots=True)
class LinkWindow:
    """The link detector's input for one window.

    Attributes:
        step: last step of the window.
        edge_seconds: (R,) float64, rank r's probe round trip to rank (r+1) mod R, seconds
            (the window record's ``link_probe_seconds``).
        nodes: (R,) node name of each rank.
        groups: ``(label, GroupWait)`` per watched process group, for the evidence.
    """

    step: int
    edge_seconds: np.ndarray
    nodes: Sequence[str]
    groups: list[tuple[str, GroupWait]] | None = None


@dataclass(slots=True)
class GroupWait:
    """Who waited for whom in one process group over one window.

    Attributes:
        ranks: (M,) int64 global ranks of the members, in group order.
        arrived_last: (M,) int64, steps in which each member arrived last (shortest time).
        wait_seconds: (M,) float64, median per-step wait for the last peer, seconds.
        transfer_seconds: median per-step transfer time of the group (the last arriver's own
            collective time), seconds; NaN with no usable step.
        steps: steps every member reported.
    """

    ranks: np.ndarray
    arrived_last: np.ndarray
    wait_seconds: np.ndarray
    transfer_seconds: float
    steps: int


def group_waits(ranks: np.ndarray, durations: np.ndarray) -> GroupWait:
    """Arrived-last counts, waits and transfer time of one group from per-step durations.

    Args:
        ranks: (M,) global ranks of the members.
        durations: (M, K) float64 per-step summed collective seconds of each member; steps with
            a NaN, infinite, negative or zero value for any member are skipped.

    Returns:
        :class:`GroupWait`.
    """
    d = np.asarray(durations, dtype=np.float64)
    members = d.shape[0]
    # a step counts when every member ran the group's collectives (a step without any says
    # nothing about who was waited for)
    valid = np.all(np.isfinite(d) & (d > 0), axis=0) if d.size else np.zeros(0, bool)
    d = d[:, valid]
    if d.shape[1] == 0 or members == 0:
        return GroupWait(np.asarray(ranks), np.zeros(members, np.int64),
                         np.full(members, np.nan), math.nan, 0)
    last = d.min(axis=0)
    return GroupWait(
        ranks=np.asarray(ranks, dtype=np.int64),
        arrived_last=np.bincount(d.argmin(axis=0), minlength=members).astype(np.int64),
        wait_seconds=np.median(d - last, axis=1),
        transfer_seconds=float(np.median(last)),
        steps=int(d.shape[1]),
    )


class LinkDetector:
    """Names a node whose link is slow from the per-rank ring-probe times, M of N windows.

    Attributes:
        active: node -> the link finding currently raised for it.
        stats: ``windows``, ``too_few_edges`` (windows with under ``min_edges`` valid probes),
            ``invalid_edges`` (NaN, negative or infinite probe times skipped).
    """

    @dataclass(kw_only=True, slots=True)
    class Config:
        """Thresholds of the link detector."""

        slow_ratio: float = 2.0
        """An edge is slow when its probe takes this many times the reference edge's (the
        median of the fastest R - 2): the same
        factor ``laggard cluster-demo``'s end-of-run link check uses (under half the rate)."""

        min_excess_seconds: float = 2e-3
        """... and at least this much longer (a loopback edge of microseconds is not slow)."""

        raise_windows: int = 3
        """M: raise when slow in M of the last N windows."""

        persistence_windows: int = 5
        """N: windows considered; a finding clears after N windows without it."""

        min_edges: int = 3
        """Fewest valid edges for a median to compare against."""

        def __post_init__(self) -> None:
            if self.slow_ratio <= 1:
                raise ValueError("slow_ratio must be > 1")
            if not 1 <= self.raise_windows <= self.persistence_windows:
                raise ValueError("need 1 <= raise_windows <= persistence_windows")
            if self.min_edges < 3:
                raise ValueError("min_edges must be >= 3")

    #: The ``detector`` of its findings.
    name = DETECTOR

    def __init__(self, config: LinkDetector.Config | None = None) -> None:
        self.config = config or LinkDetector.Config()
        self.active: dict[str, Finding] = {}
        self.stats: dict[str, int] = dict.fromkeys(
            ("windows", "too_few_edges", "invalid_edges"), 0)
        self._history: list[set[str]] = []  # slow nodes of the last N windows
        self._evidence: dict[str, dict[str, Any]] = {}

    def update(self, window: LinkWindow) -> list[Finding]:
        """Take one window of probe times; return findings raised or cleared.

        Returns:
            New findings (kind ``link``) and cleared ones (``cleared=True``).
        """
        self.stats["windows"] += 1
        step, nodes, groups = window.step, list(window.nodes), window.groups
        edges = np.asarray(window.edge_seconds, dtype=np.float64).ravel()
        bad = ~(np.isfinite(edges) & (edges >= 0))
        self.stats["invalid_edges"] += int(bad.sum())
        slow_nodes: set[str] = set()
        ranks = edges.size
        if ranks - bad.sum() >= self.config.min_edges and len(nodes) == ranks:
            # A slow node's link slows its two edges of the ring (in and out), so the reference
            # is the median of the fastest R - 2 edges: the median of all would be a slow edge
            # itself in a three-node job.
            valid = np.sort(edges[~bad])
            median = float(np.median(valid[: max(1, valid.size - 2)]))
            with np.errstate(invalid="ignore"):
                slow = ~bad & (edges >= self.config.slow_ratio * median) & (
                    edges - median >= self.config.min_excess_seconds)
            slow_nodes = self._nodes_of(slow, nodes, edges, median, groups)
        else:
            self.stats["too_few_edges"] += 1
        n = self.config.persistence_windows
        self._history = (self._history + [slow_nodes])[-n:]
        findings = []
        for node in sorted(self.active):
            if not any(node in h for h in self._history):
                findings.append(_cleared(self.active.pop(node), step))
        for node in sorted(slow_nodes):
            windows = sum(node in h for h in self._history)
            if node not in self.active and windows >= self.config.raise_windows:
                finding = self._finding(node, step, windows)
                self.active[node] = finding
                findings.append(finding)
        return findings

    def _nodes_of(self, slow: np.ndarray, nodes: list[str], edges: np.ndarray, median: float,
                  groups: list[tuple[str, GroupWait]] | None) -> set[str]:
        """Nodes on both a slow incoming and a slow outgoing edge of the ring."""
        ranks = len(nodes)
        found: set[str] = set()
        for r in np.flatnonzero(slow).tolist():
            succ = (r + 1) % ranks
            node = nodes[succ]
            # The node of succ has a slow incoming edge; is one of its outgoing ones slow too?
            out = [s for s in range(ranks) if nodes[s] == node and slow[s]]
            if not out or node == nodes[r]:
                continue
            if not self._fast_elsewhere(node, slow, nodes):
                continue  # every cross-node edge touches it: which end is slow is unknowable
            found.add(node)
            peers = sorted({r, *[(s + 1) % ranks for s in out]})
            member = [s for s in range(ranks) if nodes[s] == node]
            self._evidence[node] = {
                "rank": member[0],
                "peers": peers,
                "group": "ring of the monitor's gather group",
                "edge_seconds": {f"{r}->{succ}": round(float(edges[r]), 6),
                                 **{f"{s}->{(s + 1) % ranks}": round(float(edges[s]), 6)
                                    for s in out}},
                "median_edge_seconds": round(median, 6),
                "groups": _group_evidence(groups, member),
            }
        return found

    @staticmethod
    def _fast_elsewhere(node: str, slow: np.ndarray, nodes: list[str]) -> bool:
        """A cross-node edge touching neither end ``node`` is fast: the other links are fine,
        so the slow edges are ``node``'s (with two nodes, nothing says which end is slow)."""
        ranks = len(nodes)
        return any(not slow[r] and node not in (nodes[r], nodes[(r + 1) % ranks])
                   and nodes[r] != nodes[(r + 1) % ranks] for r in range(ranks))

    def _finding(self, node: str, step: int, windows: int) -> Finding:
        ev = dict(self._evidence[node])
        ratio = max(ev["edge_seconds"].values()) / max(ev["median_edge_seconds"], 1e-9)
        ev.update(windows_over=windows, windows=self.config.persistence_windows,
                  slowdown=round(ratio, 3))
        return Finding(
            detector=DETECTOR, kind="link", severity=Severity.WARNING,
            rank=int(ev["rank"]), node=node, step=step, evidence=ev,
            message=(f"{node}'s network link is slow: payloads to and from it take "
                     f"{ratio:.1f}x the median link's time (peers {ev['peers']}), while no "
                     "rank's compute stands out: check that node's NIC, cable and switch port"),
        )


def _group_evidence(groups: list[tuple[str, GroupWait]] | None,
                    member: list[int]) -> list[dict[str, Any]]:
    """Per watched group: how often the node's ranks arrived last, and the group's transfer."""
    out = []
    for label, gw in groups or []:
        mask = np.isin(gw.ranks, member)
        if not mask.any():
            continue
        out.append({"group": label, "ranks": gw.ranks.tolist(),
                    "arrived_last": int(gw.arrived_last[mask].sum()), "steps": gw.steps,
                    "transfer_seconds": None if math.isnan(gw.transfer_seconds)
                    else round(gw.transfer_seconds, 6)})
    return out


def _cleared(finding: Finding, step: int) -> Finding:
    return finding.clear(step=step, reason="recovered", severity=Severity.INFO,
                         message=f"{finding.node}'s link is no longer slow")


__all__ = ["GroupWait", "LinkDetector", "LinkWindow", "group_waits"]
