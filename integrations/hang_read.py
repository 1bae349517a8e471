"""Rank 0's read of one hang round: every node's key, and the own keys of ranks no fresh node
key speaks for, in batches, from the job's store.

Called by the store thread of :class:`~laggard.integrations.heartbeat.HeartbeatThreads` once per
interval while rank 0's training thread is quiet; hands rank -> key value to
:meth:`~laggard.integrations.hang_watch.HangWatch.observe`.

* **Node keys** ``hb/n/<leader>`` (:func:`~laggard.integrations.heartbeat_key.decode_node_key`)
  for every leader of the layout (:meth:`~laggard.integrations.heartbeat_node.NodeLayout.
  leaders`), read with ``multi_get`` in batches of :data:`READ_BATCH` keys (one request and one
  reply each; ``TCPStore``, ``PrefixStore`` and ``FileStore`` have it in torch 2.13; one call
  for 65,536 keys read 1,200 keys/s here, batches of 512 about 16,000:
  ``benchmarks/hang_round.py``). ``multi_get`` of a
  missing key would block until the timeout, so keys not yet seen are looked for with ``check``
  first, halving a batch that is not all there (:func:`find_existing`); at most
  :data:`MAX_CHECKS_PER_READ` checks per read, the rest looked for at the next.
* **Own keys** ``hb/<rank>`` of ranks that no node key lists, or whose node key has not changed
  for :attr:`RoundReader.stale_after` seconds (a leader that stopped: its members then write their
  own key, :mod:`laggard.integrations.heartbeat_node`), found and read the same way. Where a
  rank has both, the newer by its writer's wall clock is kept.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from laggard.integrations.hang_watch import HeartbeatStats
from laggard.integrations.heartbeat_key import BadKey, decode_node_key
from laggard.integrations.heartbeat_node import NodeLayout

__all__ = ["MAX_CHECKS_PER_READ", "READ_BATCH", "RoundReader", "find_existing",
           "node_key_name", "rank_key_name"]

#: Keys per ``multi_get`` and per first ``check`` (a reply of at most about 512 x 1.7 KB).
READ_BATCH = 512
#: ``check`` calls rank 0 makes in one read, at most (keys found once stay known).
MAX_CHECKS_PER_READ = 256


def node_key_name(leader: int) -> str:
    """The store key (under the run's prefix) a node's leader writes."""
    return f"hb/n/{leader}"


def rank_key_name(rank: int) -> str:
    """The store key (under the run's prefix) a rank writes itself (no leader, or a lost one)."""
    return f"hb/{rank}"


def find_existing(store: Any, names: list[str], checks: int) -> tuple[list[str], int]:
    """Which of ``names`` exist: ``check`` per batch of :data:`READ_BATCH`, halving a batch that
    is not all there.

    Args:
        store: a ``torch.distributed.Store`` (``check(list[str]) -> bool``: all exist).
        names: keys to look for; checks: ``check`` calls allowed.

    Returns:
        ``(found, checks left)``; names not reached within the allowance are not in found.
    """
    found: list[str] = []
    stack = [names[i:i + READ_BATCH] for i in range(0, len(names), READ_BATCH)][::-1]
    while stack and checks > 0:
        part = stack.pop()
        checks -= 1
        if store.check(part):
            found.extend(part)
        elif len(part) > 1:
            mid = len(part) // 2
            stack += [part[mid:], part[:mid]]
    return found, checks


class RoundReader:
    """Rank 0's reader of rounds (see the module docstring).

    Args:
        run: the run; layout: rank 0's node layout (the leaders to read).
        interval: seconds between two writes of a node key.
        stats: counted into (``bad_keys``, ``own_keys_read``).

    Attributes:
        stale_after: seconds a node key may stay unchanged (on rank 0's clock) before its
            ranks' own keys are looked for: two intervals and a second.
    """

    def __init__(self, *, run: str, layout: NodeLayout, interval: float,
                 stats: HeartbeatStats) -> None:
        self.run = run
        self.layout = layout
        self.stats = stats
        self.stale_after = 2.0 * interval + 1.0
        self._known_nodes: set[int] = set()
        self._known_ranks: set[int] = set()
        self._node_seen: dict[int, tuple[int, float]] = {}  # leader -> (beat, first seen)

    def read(self, store: Any, now: float) -> dict[int, bytes | None]:
        """One round: rank -> its key value (None: none found).

        Args:
            store: the run's prefixed store; now: rank 0's ``perf_counter``.

        Raises:
            whatever the store raises (the caller counts it and backs off).
        """
        checks = MAX_CHECKS_PER_READ
        leaders = [leader for leader in self.layout.leaders() if leader not in self._known_nodes]
        found, checks = find_existing(store, [node_key_name(x) for x in leaders], checks)
        self._known_nodes.update(int(name.rsplit("/", 1)[1]) for name in found)
        out: dict[int, bytes | None] = dict.fromkeys(range(self.layout.world_size))
        covered: set[int] = set()
        known = sorted(self._known_nodes)
        for leader, value in zip(known, self._get(store, map(node_key_name, known)),
                                 strict=True):
            try:
                node = decode_node_key(value, run=self.run, leader=leader)
            except BadKey:
                self.stats.bad_keys += 1
                continue
            seen = self._node_seen.get(leader)
            if seen is None or seen[0] != node.beat:
                self._node_seen[leader] = seen = (node.beat, now)
            fresh = now - seen[1] < self.stale_after
            for rank, key in node.keys.items():
                if 0 <= rank < self.layout.world_size:
                    out[rank] = key
                    if fresh:
                        covered.add(rank)
        uncovered = [r for r in range(self.layout.world_size) if r not in covered]
        new = [r for r in uncovered if r not in self._known_ranks]
        found, checks = find_existing(store, [rank_key_name(r) for r in new], checks)
        self._known_ranks.update(int(name.rsplit("/", 1)[1]) for name in found)
        own = [r for r in uncovered if r in self._known_ranks]
        for rank, value in zip(own, self._get(store, map(rank_key_name, own)), strict=True):
            self.stats.own_keys_read += 1
            out[rank] = newer(out[rank], value)
        return out

    @staticmethod
    def _get(store: Any, names: Iterable[str]) -> list[bytes]:
        keys = list(names)
        values: list[bytes] = []
        for i in range(0, len(keys), READ_BATCH):
            values.extend(bytes(v) for v in store.multi_get(keys[i:i + READ_BATCH]))
        return values


def newer(a: bytes | None, b: bytes) -> bytes:
    """Of two key values of one rank, the one its writer wrote last (its ``w``, wall clock,
    then its ``b``, write counter); an unreadable one loses (the watch counts it when it
    decodes it)."""
    if a is None:
        return b

    def order(value: bytes) -> tuple[float, float]:
        try:
            doc = json.loads(value)
            w, beat = doc.get("w"), doc.get("b")
            return (float(w) if isinstance(w, (int, float)) else -1.0,
                    float(beat) if isinstance(beat, (int, float)) else -1.0)
        except (ValueError, AttributeError, UnicodeDecodeError):
            return (-1.0, -1.0)

    return b if order(b) >= order(a) else a
