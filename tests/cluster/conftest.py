"""Skip the cluster tests, with the reason, where network namespaces cannot be made."""

from __future__ import annotations

import functools

import pytest
from support import budget

from laggard.demo.netns import EmulatedCluster, LinkShape, NamespaceError


@functools.cache
def _namespaces_unavailable() -> str | None:
    """None when a 1-node cluster can be created and removed here, else why not."""
    try:
        with EmulatedCluster(1, LinkShape(rate_bps=0, delay_s=0),
                             handle_signals=False) as cluster:
            done = cluster.run(cluster.nodes[0], ["true"], timeout=budget(10))
            if done.returncode != 0:
                return f"`ip netns exec` fails here: {done.stderr.strip()}"
            return None
    except NamespaceError as exc:
        return f"network namespaces cannot be made here: {exc}"


@pytest.fixture
def need_namespaces() -> None:
    """Skip the test where this process cannot create network namespaces."""
    reason = _namespaces_unavailable()
    if reason:
        pytest.skip(reason)
