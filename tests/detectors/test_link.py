"""The link detector and group waits, on synthetic windows (real runs: the cluster demo)."""

from __future__ import annotations

import numpy as np

from laggard.detectors.finding import Finding
from laggard.detectors.link import LinkDetector, LinkWindow, group_waits


def update(det: LinkDetector, **window) -> list[Finding]:
    return det.update(LinkWindow(**window))


def test_the_member_with_the_shortest_time_arrived_last_and_the_others_waited_for_it():
    # rank 2 arrives 30 ms late each step; the transfer itself takes 10 ms
    d = np.array([[0.040, 0.041, 0.039], [0.041, 0.040, 0.040], [0.010, 0.011, 0.010]])
    gw = group_waits(np.array([0, 1, 2]), d)
    assert gw.arrived_last.tolist() == [0, 0, 3] and gw.steps == 3
    assert gw.transfer_seconds == np.median([0.010, 0.011, 0.010])
    assert gw.wait_seconds[2] == 0 and gw.wait_seconds[0] > 0.025


def test_steps_with_missing_or_bad_values_are_skipped():
    d = np.array([[0.02, np.nan, 0.02, -1.0], [0.01, 0.01, 0.01, 0.01]])
    assert group_waits(np.array([0, 1]), d).steps == 2
    empty = group_waits(np.array([0, 1]), np.full((2, 3), np.nan))
    assert empty.steps == 0 and np.isnan(empty.transfer_seconds)


def _edges(rng, ranks=4, slow_node=None, nodes=None):
    edges = 0.001 + rng.normal(0, 5e-5, ranks)
    if slow_node is not None:
        for r in range(ranks):
            if nodes[r] == slow_node or nodes[(r + 1) % ranks] == slow_node:
                edges[r] = 0.010  # both edges touching the node
    return edges


def test_a_node_with_slow_incoming_and_outgoing_edges_is_named_after_m_of_n_windows():
    rng = np.random.default_rng(0)
    nodes = ["node0", "node1", "node2", "node3"]
    det = LinkDetector()
    raised = []
    for w in range(12):
        slow = "node1" if w >= 4 else None
        for f in update(det, step=w, edge_seconds=_edges(rng, slow_node=slow, nodes=nodes),
                            nodes=nodes):
            raised.append((w, f))
    (w, f), = raised
    assert w == 6 and f.kind == "link" and f.node == "node1" and f.rank == 1
    assert f.detector == "link" and f.evidence["peers"] == [0, 2]
    assert f.evidence["slowdown"] > 5


def test_a_healthy_job_and_one_slow_edge_name_nothing_and_it_clears():
    rng = np.random.default_rng(1)
    nodes = ["a", "b", "c"]
    det = LinkDetector()
    for w in range(20):
        edges = _edges(rng, ranks=3)
        if w % 2:
            edges[0] = 0.02  # one edge only: not a node's link
        assert update(det, step=w, edge_seconds=edges, nodes=nodes) == []
    for w in range(20, 25):
        update(det, step=w, edge_seconds=_edges(rng, 3, "b", nodes), nodes=nodes)
    assert "b" in det.active
    cleared = []
    for w in range(25, 31):
        cleared += update(det, step=w, edge_seconds=_edges(rng, ranks=3), nodes=nodes)
    assert [(f.cleared, f.evidence["reason"]) for f in cleared] == [(True, "recovered")]
    assert not det.active


def test_bad_probe_times_are_counted_and_too_few_edges_compare_nothing():
    det = LinkDetector()
    assert update(det, step=0, edge_seconds=np.array([np.nan, -1, 0.001]),
                      nodes=["a", "b", "c"]) == []
    assert det.stats == {"windows": 1, "too_few_edges": 1, "invalid_edges": 2}


def test_two_nodes_cannot_say_which_end_of_their_link_is_slow():
    # 2 nodes x 2 ranks: both cross-node edges (1->2, 3->0) touch both nodes
    nodes = ["node0", "node0", "node1", "node1"]
    det = LinkDetector()
    for w in range(8):
        edges = np.array([0.001, 0.010, 0.001, 0.010])
        assert update(det, step=w, edge_seconds=edges, nodes=nodes) == []


def test_with_several_ranks_per_node_the_node_is_named():
    nodes = ["n0", "n0", "n1", "n1", "n2", "n2"]
    det = LinkDetector()
    found = []
    for w in range(5):  # n1's link: edges 1->2 (in) and 3->4 (out) slow; 5->0 fast
        found += update(det, step=w, edge_seconds=np.array([1e-3, 9e-3, 1e-4, 9e-3, 1e-4, 1e-3]),
                            nodes=nodes)
    assert [(f.node, f.rank, f.evidence["peers"]) for f in found] == [("n1", 2, [1, 4])]
