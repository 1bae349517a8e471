"""Peer groups: which ranks do the same work, so that a rank is compared only with them.

A 3-D parallel job (torchtitan's and Megatron's ``pp x dp x tp`` meshes) does not give every rank
the same work: pipeline stages differ by design (the first holds the embedding, the last the loss
head), and a whole-job median would call the heavy stage's ranks stragglers and hide a slow rank
of the light one. The ranks that *do* the same work are those that differ only in their
data-parallel coordinates: each holds a replica (or a shard) of the same layers and processes a
different batch. Those form a peer group; the straggler detector compares each rank with its own
group (:class:`laggard.detectors.group_straggler.PeerGroupStraggler`), and the stage-balance
detector compares the groups (:mod:`laggard.detectors.stage_balance`).

Which mesh dimensions are data parallel (:data:`PEER_DIM_NAMES`, the names torchtitan's
``ParallelDims`` and the DeviceMesh tutorials use): ``dp``, ``dp_replicate`` (HSDP's replicas),
``dp_shard`` (FSDP's shards), and the flattened ``dp_cp`` / ``dp_shard_cp``; and ``cp`` (context
parallel: every rank runs the same layers on its share of the sequence; torchtitan's causal
load balancing gives each rank a head and a tail chunk, so their work is equal; a job that shards
causal attention without it should pass ``peer_dims`` without ``"cp"``). Every other dimension
(``pp``, ``tp``, ``ep``, ``etp`` and any name not in that set) separates groups: an unknown
dimension is assumed to change the work, since a smaller group can only cost a comparison,
whereas a group of unlike ranks raises false stragglers. The ``pp`` coordinate is the group's
pipeline stage.

No torch here (detectors are pure): :meth:`PeerGroups.from_mesh` reads a DeviceMesh's ``mesh``
(the tensor of global ranks) and ``mesh_dim_names`` only, so any object with those two works.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

#: Mesh dimension names treated as data parallel (module docstring): ranks differing only in
#: these do the same work.
PEER_DIM_NAMES: frozenset[str] = frozenset(
    {"dp", "dp_replicate", "dp_shard", "dp_cp", "dp_shard_cp", "cp"})
#: The mesh dimension whose coordinate is a group's pipeline stage.
STAGE_DIM_NAME = "pp"
#: ``PeerGroups.source`` values.
SOURCES = ("mesh", "config", "all")

__all__ = ["PEER_DIM_NAMES", "SOURCES", "STAGE_DIM_NAME", "PeerGroups"]


@dataclass(frozen=True, slots=True)
class PeerGroups:
    """A partition of a job's ranks into peer groups: ranks that do the same work per step.

    Build it with :meth:`all`, :meth:`from_lists` or :meth:`from_mesh`; the constructor checks
    whatever it is given.

    Attributes:
        groups: G tuples of global ranks, each sorted ascending; together exactly
            ``range(world_size)``, each rank in one group.
        names: G names: the group's non-data-parallel mesh coordinates (``"pp=0"``,
            ``"pp=1,tp=0"``), ``"group 0"`` ... for lists, ``"all"`` for the whole job.
        stages: G pipeline stages (the mesh's ``pp`` coordinate), None where there is none.
        source: ``"mesh"``, ``"config"`` or ``"all"``.

    Raises:
        ValueError: an empty partition or group, a rank that is not a non-negative int, a rank
            in two groups, a rank of ``range(world_size)`` in none, unsorted groups, names or
            stages of the wrong length, duplicate names, or an unknown ``source``.
    """

    groups: tuple[tuple[int, ...], ...]
    names: tuple[str, ...]
    stages: tuple[int | None, ...]
    source: str

    def __post_init__(self) -> None:
        if not self.groups:
            raise ValueError("peer groups: at least one group is needed")
        if self.source not in SOURCES:
            raise ValueError(f"peer groups: source must be one of {SOURCES}, got {self.source!r}")
        if len(self.names) != len(self.groups) or len(self.stages) != len(self.groups):
            raise ValueError("peer groups: one name and one stage per group")
        if len(set(self.names)) != len(self.names):
            raise ValueError(f"peer groups: duplicate group names {list(self.names)}")
        seen: dict[int, int] = {}
        for index, group in enumerate(self.groups):
            if not group:
                raise ValueError(f"peer groups: group {index} is empty")
            for rank in group:
                if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
                    raise ValueError(f"peer groups: group {index} has {rank!r}, not a rank "
                                     "(a non-negative int)")
                if rank in seen:
                    raise ValueError(f"peer groups: rank {rank} is in group {seen[rank]} and "
                                     f"group {index}; a rank belongs to one group")
                seen[rank] = index
            if list(group) != sorted(group):
                raise ValueError(f"peer groups: group {index} is not sorted: {list(group)}")
        missing = sorted(set(range(len(seen))) - set(seen))
        if missing:
            raise ValueError(f"peer groups: ranks {missing[:8]} of range({len(seen)}) are in no "
                             "group (the groups must cover every rank of the job)")

    @property
    def world_size(self) -> int:
        """Ranks in the job (the sum of the group sizes)."""
        return sum(len(g) for g in self.groups)

    @property
    def is_all(self) -> bool:
        """True when there is one group holding every rank (today's whole-job comparison)."""
        return len(self.groups) == 1

    def group_of(self, rank: int) -> int:
        """The index (into ``groups``, ``names``, ``stages``) of ``rank``'s group.

        Raises:
            ValueError: ``rank`` is not in ``range(world_size)``.
        """
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is not in range({self.world_size})")
        for g, group in enumerate(self.groups):
            if rank in group:
                return g
        raise AssertionError("unreachable: the groups cover range(world_size)")

    def peers_of(self, rank: int) -> tuple[int, ...]:
        """The ranks of ``rank``'s group, itself included (sorted).

        Raises:
            ValueError: ``rank`` is not in ``range(world_size)``.
        """
        return self.groups[self.group_of(rank)]

    def describe(self, index: int) -> str:
        """A group in words: ``"pipeline stage 1 (pp=1: ranks 2, 3)"`` for a stage,
        ``"peer group group 0 (ranks 0, 1)"`` otherwise (at most 8 ranks listed)."""
        ranks = self.groups[index]
        listed = ", ".join(str(r) for r in ranks[:8]) + (", ..." if len(ranks) > 8 else "")
        stage = self.stages[index]
        if stage is not None:
            return f"pipeline stage {stage} ({self.names[index]}: ranks {listed})"
        return f"peer group {self.names[index]} (ranks {listed})"

    # -- builders ----------------------------------------------------------------------------

    @classmethod
    def all(cls, world_size: int) -> PeerGroups:
        """One group of every rank (the default: every rank compared with every other).

        Raises:
            ValueError: ``world_size`` < 1.
        """
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be an int >= 1, got {world_size!r}")
        return cls(groups=(tuple(range(world_size)),), names=("all",), stages=(None,),
                   source="all")

    @classmethod
    def from_lists(cls, groups: Sequence[Sequence[int]], world_size: int) -> PeerGroups:
        """Peer groups given explicitly (``TrainingMonitor.Config(peer_groups=...)``).

        Args:
            groups: G sequences of global ranks (any order within a group; groups are kept in
                the order given), named ``"group 0"``, ``"group 1"``...
            world_size: ranks in the job; the groups must cover ``range(world_size)`` exactly.

        Raises:
            ValueError: not a sequence of sequences of ints, overlapping groups, a rank out of
                ``range(world_size)``, or ranks of the job in no group.
        """
        if isinstance(groups, (str, bytes)) or not isinstance(groups, Sequence):
            raise ValueError(f"peer_groups must be a sequence of rank lists, got {groups!r}")
        parsed: list[tuple[int, ...]] = []
        for index, group in enumerate(groups):
            if isinstance(group, (str, bytes)) or not isinstance(group, Sequence):
                raise ValueError(f"peer group {index} must be a sequence of ranks, got {group!r}")
            for rank in group:
                if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)):
                    raise ValueError(f"peer group {index} has {rank!r}, not an int rank")
            ints = tuple(sorted(int(r) for r in group))
            if len(set(ints)) != len(ints):
                raise ValueError(f"peer group {index} lists a rank twice: {list(group)}")
            out_of_range = [r for r in ints if not 0 <= r < world_size]
            if out_of_range:
                raise ValueError(f"peer group {index} has ranks {out_of_range[:8]} outside "
                                 f"range({world_size})")
            parsed.append(ints)
        out = cls(groups=tuple(parsed), names=tuple(f"group {i}" for i in range(len(parsed))),
                  stages=(None,) * len(parsed), source="config")
        if out.world_size != world_size:
            raise ValueError(f"peer groups cover {out.world_size} ranks, the job has "
                             f"{world_size}")
        return out

    @classmethod
    def from_mesh(cls, mesh: Any, world_size: int, *,
                  peer_dims: Collection[str] | None = None) -> PeerGroups:
        """Peer groups from a ``torch.distributed.device_mesh.DeviceMesh`` of the whole job.

        Ranks sharing every coordinate except the data-parallel dimensions (``peer_dims``,
        default :data:`PEER_DIM_NAMES`) form a group, named by those coordinates in mesh order
        (``"pp=1,tp=0"``; ``"all"`` when every dimension is data parallel) and ordered by them;
        the ``pp`` coordinate is its stage.

        Args:
            mesh: the job's world mesh (``init_device_mesh``'s result, not a sub-mesh such as
                ``mesh["dp"]``): its ``mesh`` attribute is the ``(d0, d1, ...)`` int tensor (or
                array) of global ranks, ``mesh_dim_names`` one name per dimension.
            world_size: ranks in the job.
            peer_dims: the dimension names that are data parallel; default
                :data:`PEER_DIM_NAMES`.

        Raises:
            ValueError: the mesh has no ``mesh``/``mesh_dim_names``, no names or the wrong
                number, duplicate names, or its ranks are not exactly ``range(world_size)``.
        """
        names = getattr(mesh, "mesh_dim_names", None)
        ranks_of = getattr(mesh, "mesh", None)
        if ranks_of is None:
            raise ValueError(f"{type(mesh).__name__} is not a DeviceMesh (no 'mesh' attribute)")
        try:
            ranks = np.asarray(ranks_of.tolist() if hasattr(ranks_of, "tolist") else ranks_of)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"the mesh's ranks cannot be read: {exc}") from None
        if not names:
            raise ValueError("the device mesh has no mesh_dim_names: build it with "
                             "init_device_mesh(..., mesh_dim_names=('pp', 'dp', ...)) so laggard "
                             "can tell data-parallel dimensions from the others")
        names = tuple(str(n) for n in names)
        if ranks.ndim != len(names):
            raise ValueError(f"the mesh has {ranks.ndim} dimensions but {len(names)} names "
                             f"{list(names)}")
        if len(set(names)) != len(names):
            raise ValueError(f"the mesh's dimension names repeat: {list(names)}")
        if ranks.dtype.kind not in "iu" or sorted(ranks.ravel().tolist()) != list(
                range(world_size)):
            raise ValueError(f"the mesh's ranks are not range({world_size}) (it holds "
                             f"{ranks.size} ranks): pass the job's whole mesh, not a sub-mesh")
        data_parallel = PEER_DIM_NAMES if peer_dims is None else frozenset(peer_dims)
        split = [d for d, name in enumerate(names) if name not in data_parallel]
        if not split:
            return cls(groups=(tuple(range(world_size)),), names=("all",), stages=(None,),
                       source="mesh")
        by_key: dict[tuple[int, ...], list[int]] = {}
        for coords in np.ndindex(*ranks.shape):
            key = tuple(coords[d] for d in split)
            by_key.setdefault(key, []).append(int(ranks[coords]))
        keys = sorted(by_key)
        stage_at = split.index(names.index(STAGE_DIM_NAME)) if STAGE_DIM_NAME in names and \
            names.index(STAGE_DIM_NAME) in split else None
        return cls(
            groups=tuple(tuple(sorted(by_key[k])) for k in keys),
            names=tuple(",".join(f"{names[d]}={k[i]}" for i, d in enumerate(split))
                        for k in keys),
            stages=tuple(None if stage_at is None else int(k[stage_at]) for k in keys),
            source="mesh",
        )
