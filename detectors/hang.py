"""Who holds a hung job up: one set of rules for flight-recorder dumps and live heartbeats.

A synchronous job that stops is held up by a few ranks; every other rank waits for them in a
collective. Both views laggard has of a job, a flight-recorder dump per rank after the fact
(:mod:`laggard.detectors.flight_recorder`) and a heartbeat per rank while it hangs
(:class:`laggard.wire.Heartbeat`), reduce to the same state: per rank and per process group, how
far the rank has *issued* and *completed* the group's collectives, and what it has pending.
:func:`classify_hang` reads that state by the format's semantics (``../shared/ENVIRONMENT.md``,
"Flight-recorder dumps of multi-group jobs"), per group, never by the shape of one dump set:

* **missing** (never arrived): a member whose issued count is behind the group's highest has
  not issued the next collective the others issued. With no pending work in the group it is
  hung on the CPU (a Python thread holding the GIL, a blocked data loader, a rank stuck outside
  collectives).
* **device** (stuck on the device): a member that issued as far as the others, whose peers
  completed a collective it has not.
* **silent**: a rank that stopped reporting (no heartbeat while its process lives, no dump).
* P2P (pipeline) groups are compared per (sender, receiver) pair only: P2P sequence numbers
  count per pair and their completion is not a watermark.

The rules are implemented by the hang issue (#24); this module fixes the shapes both readers
build on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

__all__ = ["CULPRIT_KINDS", "GroupState", "HangCulprit", "HangVerdict", "PendingWork",
           "RankState", "classify_hang"]

#: What held a group up, per rank: never issued, stuck on the device, stopped reporting.
CULPRIT_KINDS = ("missing", "device", "silent")
CulpritKind = Literal["missing", "device", "silent"]


@dataclass(frozen=True, slots=True)
class PendingWork:
    """One collective a rank issued and has not completed.

    Attributes:
        seq: its sequence number in the group (per pair for P2P).
        op: the op (``allreduce``, ``all_to_all``, ``send``...).
        input_sizes, input_dtypes: what the flight recorder lists for it (empty from heartbeats).
        state: ``scheduled`` or ``started`` (flight recorder); ``issued`` from heartbeats.
    """

    seq: int
    op: str
    input_sizes: tuple[tuple[int, ...], ...] = ()
    input_dtypes: tuple[str, ...] = ()
    state: str = "issued"


@dataclass(frozen=True, slots=True)
class GroupState:
    """One rank's progress in one process group, or in one P2P pair of it.

    Attributes:
        group: the group's key, the same on every member (a PG name, a tracer label).
        issued: sequence number of the last collective the rank issued (0: none).
        completed: highest ``n`` such that collectives ``1..n`` completed on the rank.
        desc: the group's description (``dp``, ``tp``, ``default_pg``...), for messages.
        members: the group's ranks, when the source names them (global ranks).
        pending: the issued, not completed collectives the source lists.
        peer: for a P2P pair, the other rank; None for a collective group.
        op: the last issued op, when ``pending`` does not say.
    """

    group: str
    issued: int
    completed: int
    desc: str = ""
    members: tuple[int, ...] | None = None
    pending: tuple[PendingWork, ...] = ()
    peer: int | None = None
    op: str | None = None


@dataclass(frozen=True, slots=True)
class RankState:
    """What one rank reported: its groups, and for heartbeats its liveness and phase.

    Attributes:
        rank: global rank.
        groups: its progress per group and P2P pair.
        silent_seconds: seconds since its last heartbeat (None: a dump, or a fresh heartbeat).
        alive: whether its process exists (None: unknown).
        step: the step its training thread is in; ``phase`` and ``phase_seconds``: where and for
            how long (heartbeats only).
    """

    rank: int
    groups: tuple[GroupState, ...] = ()
    silent_seconds: float | None = None
    alive: bool | None = None
    step: int | None = None
    phase: str | None = None
    phase_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class HangCulprit:
    """One rank that holds a group up, and how.

    Attributes:
        rank: the rank; ``kind``: one of :data:`CULPRIT_KINDS`.
        group, desc: the group it holds up; ``seq`` and ``op``: the collective it never issued
            (missing) or never completed (device); None for a silent rank with no group state.
        peer: for a P2P pair, the rank waiting on it.
        waiting: the ranks of the group that issued (or completed) what this one did not.
    """

    rank: int
    kind: CulpritKind
    group: str = ""
    desc: str = ""
    seq: int | None = None
    op: str | None = None
    peer: int | None = None
    waiting: tuple[int, ...] = ()


@dataclass(slots=True)
class HangVerdict:
    """Every culprit found, by rank and group; empty when nothing holds a group up.

    Attributes:
        culprits: one entry per (rank, group) held up, ordered by rank then group.
        groups_checked: groups (and P2P pairs) read.
    """

    culprits: list[HangCulprit] = field(default_factory=list)
    groups_checked: int = 0

    @property
    def ranks(self) -> tuple[int, ...]:
        """The culprit ranks, each once, sorted."""
        return tuple(sorted({c.rank for c in self.culprits}))


def classify_hang(ranks: Mapping[int, RankState], *,
                  world_size: int | None = None) -> HangVerdict:
    """Name the ranks that hold the job's groups up.

    Args:
        ranks: rank -> its state; a rank of the world missing from the mapping reported nothing
            (no dump, no heartbeat ever).
        world_size: ranks in the job, when known (a rank below it and absent from ``ranks`` is
            named silent).

    Returns:
        The verdict; empty for a job where every member of every group is level.
    """
    raise NotImplementedError("the hang rules land with issue 24")
