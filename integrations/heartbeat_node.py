"""A node's local hang exchange: each rank hands its hang key to its node's local leader (local
rank 0) over a Unix datagram socket; the leader writes one store key for its node's ranks.

Why: every rank writing its own key into the job's one store server costs one write per rank
per round; the job's write budget (``Config.hang_store_writes_per_second``, 500) then stretches
a round to 33 s at 16,384 ranks. With one key per node (8 ranks) the same budget gives a round
of 4.1 s at 16,384 ranks and 16.4 s at 65,536 (``benchmarks/hang_round.py`` measures it).

* :class:`NodeLayout`: which ranks share a node and who leads it, from ``$LOCAL_RANK`` and
  ``$LOCAL_WORLD_SIZE`` (set by ``torchrun``, which gives a node's ranks consecutive numbers,
  ``group_rank x local_world_size + local_rank``); without them each rank is a node of its own.
* :class:`NodeLink`: the rank's datagram socket in Linux's abstract namespace (no file, gone
  with the process), named by the job and the rank (:func:`link_address`): ranks send their key
  to the leader's; the leader answers each with a one-byte ack as soon as it has read it (before
  its store write, so a slow store never reads as a lost leader).
* :class:`NodeCollector`: the leader's latest key per member, checked with
  :func:`~laggard.integrations.heartbeat_key.decode_key` (another run's, another node's, a
  garbled datagram is counted, never forwarded).

**A hung leader.** A leader whose process stops (a fault, ``SIGSTOP``, a native call holding the
GIL) stops acking; a member that has had no ack for two intervals and one ``store_seconds``
(``HeartbeatThreads.fallback_after``) writes its own key ``hb/<rank>`` to the store each
interval until acks come back; rank 0 reads such keys for the ranks of a node whose key has
stopped changing, and keeps each rank's newest key (by its writer's wall clock). The leader is
then read as silent, its members as what they are: victims are never named culprits for their
leader's silence. A member whose socket cannot be made, or whose leader has never answered
(ranks of a node in separate network namespaces, a launcher that numbers a node's ranks
otherwise), writes its own key at the per-rank interval, as every rank did before node keys.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from laggard.integrations.heartbeat_key import MAX_NODE_RANKS, BadKey, decode_key

__all__ = ["ACK", "NodeCollector", "NodeLayout", "NodeLink", "job_tag", "link_address"]

#: The leader's answer to a member's key.
ACK = b"a"
#: Datagrams read from the socket in one drain, at most (a node's ranks send one per interval).
MAX_DRAIN = 4 * MAX_NODE_RANKS
#: errno values of a send that says the peer's socket is gone (no process bound to the name).
_PEER_GONE = {errno.ECONNREFUSED, errno.ENOENT}


@dataclass(frozen=True, slots=True)
class NodeLayout:
    """Where one rank sits: its node's leader and size.

    Attributes:
        rank, world_size: the rank and the job's size.
        leader: its node's local rank 0 (``rank - local_rank``).
        size: ranks per node (``$LOCAL_WORLD_SIZE``); 1: every rank a node of its own.
    """

    rank: int
    world_size: int
    leader: int
    size: int

    @classmethod
    def of(cls, rank: int, world_size: int, local_rank: int | None,
           local_world_size: int | None) -> NodeLayout:
        """The layout from the local rank and size; a rank its own node when either is
        missing or inconsistent (``local_rank`` outside ``[0, size)``, a leader below 0, more
        than :data:`~laggard.integrations.heartbeat_key.MAX_NODE_RANKS` ranks a node)."""
        if (local_rank is None or local_world_size is None or not 0 < local_world_size
                <= MAX_NODE_RANKS or not 0 <= local_rank < local_world_size
                or rank - local_rank < 0):
            return cls(rank=rank, world_size=world_size, leader=rank, size=1)
        return cls(rank=rank, world_size=world_size, leader=rank - local_rank,
                   size=local_world_size)

    @classmethod
    def from_env(cls, rank: int, world_size: int, local_rank: int | None = None,
                 environ: Mapping[str, str] | None = None) -> NodeLayout:
        """:meth:`of` with ``$LOCAL_RANK`` / ``$LOCAL_WORLD_SIZE`` where not given (a value
        that is not an integer counts as missing)."""
        env = os.environ if environ is None else environ

        def number(name: str) -> int | None:
            try:
                return int(env[name])
            except (KeyError, ValueError):
                return None

        return cls.of(rank, world_size, number("LOCAL_RANK") if local_rank is None
                      else local_rank, number("LOCAL_WORLD_SIZE"))

    @property
    def is_leader(self) -> bool:
        """Whether this rank writes its node's key."""
        return self.rank == self.leader

    @property
    def members(self) -> range:
        """The node's ranks, the leader first."""
        return range(self.leader, min(self.leader + self.size, self.world_size))

    @property
    def nodes(self) -> int:
        """Nodes in the job, taking every node to hold ``size`` ranks (torchrun's layout)."""
        return math.ceil(self.world_size / self.size)

    def leaders(self) -> range:
        """Every node's leader, by the same reading."""
        return range(0, self.world_size, self.size)


def job_tag(run: str, environ: Mapping[str, str] | None = None) -> str:
    """A short name of this job for its socket names: a hash of the run and the rendezvous
    (``$TORCHELASTIC_RUN_ID``, ``$MASTER_ADDR``, ``$MASTER_PORT``), so two jobs on one host do
    not share sockets."""
    env = os.environ if environ is None else environ
    parts = [run] + [env.get(k, "") for k in ("TORCHELASTIC_RUN_ID", "MASTER_ADDR",
                                                "MASTER_PORT")]
    return hashlib.sha1("\0".join(parts).encode()).hexdigest()[:16]


def link_address(job: str, rank: int) -> bytes:
    """The abstract-namespace address of a rank's socket (a leading NUL byte: no file)."""
    return b"\0" + f"laggard-hb/{job}/{rank}".encode()


class NodeLink:
    """One rank's non-blocking datagram socket for the node exchange.

    Args:
        job: :func:`job_tag`; rank: this rank (its socket's name).

    Raises:
        OSError: the socket cannot be made or bound (no abstract namespace, the name taken).
    """

    def __init__(self, job: str, rank: int) -> None:
        self.job = job
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            self.sock.setblocking(False)
            self.sock.bind(link_address(job, rank))
        except OSError:
            self.sock.close()
            raise

    def send(self, rank: int, payload: bytes) -> bool:
        """Send ``payload`` to ``rank``'s socket; False when its queue is full (``EAGAIN``: a
        leader that stopped reading).

        Raises:
            ConnectionRefusedError, FileNotFoundError: no socket of that name (the peer's
                process is gone); other ``OSError``.
        """
        try:
            self.sock.sendto(payload, link_address(self.job, rank))
        except BlockingIOError:
            return False
        return True

    def drain(self) -> list[bytes]:
        """The datagrams waiting, at most :data:`MAX_DRAIN`; never blocks."""
        out: list[bytes] = []
        while len(out) < MAX_DRAIN:
            try:
                out.append(self.sock.recv(65536))
            except (BlockingIOError, InterruptedError):
                break
        return out

    def close(self) -> None:
        """Close the socket (its name is free again)."""
        self.sock.close()


def peer_gone(exc: OSError) -> bool:
    """Whether a send's error says no process holds the peer's socket."""
    return exc.errno in _PEER_GONE


class NodeCollector:
    """The leader's latest key per member rank.

    Args:
        run: the run (another run's key is bad input); members: the node's ranks.

    Attributes:
        bad: datagrams refused (garbled, another run's, a rank outside the node).
    """

    def __init__(self, run: str, members: range) -> None:
        self.run = run
        self.members = members
        self.bad = 0
        self._latest: dict[int, tuple[tuple[float, int], bytes]] = {}

    def take(self, datagrams: list[bytes]) -> set[int]:
        """Keep each member's newest key (by its wall time, then its write counter); returns
        the ranks heard from."""
        heard: set[int] = set()
        for payload in datagrams:
            try:
                doc = json.loads(payload)
                rank = doc["k"] if isinstance(doc, dict) else None
                if not isinstance(rank, int) or rank not in self.members:
                    raise BadKey(f"rank {rank!r} is not of this node")
                key = decode_key(payload, run=self.run, rank=rank)
            except (BadKey, ValueError, KeyError, UnicodeDecodeError):
                self.bad += 1
                continue
            heard.add(rank)
            before = self._latest.get(rank)
            order = (key.snapshot.wall, key.beat)
            if before is None or order >= before[0]:
                self._latest[rank] = (order, payload)
        return heard

    def keys(self) -> dict[int, bytes]:
        """rank -> its latest key."""
        return {rank: payload for rank, (_, payload) in self._latest.items()}
