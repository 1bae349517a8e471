"""Cross-rank analysis of flight-recorder dumps: which ranks fell behind, which disagree.

Matching follows PyTorch's ``fr_trace`` analyser: collectives are matched across ranks by
(process group, ``collective_seq_id``); point-to-point entries are left out. A member rank
that has no entry for a sequence number is classified from its own ``pg_status``: completed
(``last_completed >= seq``), never enqueued (``last_enqueued < seq``: it is behind), or unknown.

The dumps are read by :mod:`laggard.parsers.flight_recorder`.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from laggard.parsers.flight_recorder import VARIABLE_SIZE_OPS, FlightRecorderDump, FrEntry

__all__ = ["FrAnalysis", "LaggingCollective", "SizeMismatch", "analyze_dumps"]

@dataclass(frozen=True, slots=True)
class LaggingCollective:
    """The first collective of a group that some member ranks never issued.

    Attributes:
        pg, pg_desc: the group; ``members``: its ranks.
        seq: the collective's sequence number; ``op``, ``input_sizes``, ``input_dtypes``: as
            recorded by the ranks that issued it; ``state``: their states.
        present: ranks that issued it; ``not_enqueued``: members whose ``last_enqueued < seq``;
            ``no_dump``: members without a dump; ``unknown``: members with a dump but no status.
        status: rank -> (last_enqueued, last_completed) for members whose status is known.
        time_created_ns: earliest creation time among the ranks that issued it.
    """

    pg: str
    pg_desc: str
    members: tuple[int, ...]
    seq: int
    op: str
    input_sizes: tuple[tuple[int, ...], ...]
    input_dtypes: tuple[str, ...]
    state: tuple[str, ...]
    present: tuple[int, ...]
    not_enqueued: tuple[int, ...]
    no_dump: tuple[int, ...]
    unknown: tuple[int, ...]
    status: dict[int, tuple[int, int]]
    time_created_ns: int | None

    @property
    def missing(self) -> tuple[int, ...]:
        """Members known not to have issued it: behind, or without a dump."""
        return tuple(sorted(set(self.not_enqueued) | set(self.no_dump)))


@dataclass(frozen=True, slots=True)
class SizeMismatch:
    """Ranks at the same (group, seq) with different ops, shapes or dtypes (a desync)."""

    pg: str
    pg_desc: str
    seq: int
    signatures: dict[tuple, tuple[int, ...]]


@dataclass(slots=True)
class FrAnalysis:
    """Result of :func:`analyze_dumps`.

    Attributes:
        lagging: first lagging collective per group, earliest-created first.
        mismatches: desyncs found.
        stragglers: ranks behind in the most groups (empty when none is behind).
        lag_count: rank -> number of groups it is behind in.
        ranks: ranks with a dump.
    """

    lagging: list[LaggingCollective] = field(default_factory=list)
    mismatches: list[SizeMismatch] = field(default_factory=list)
    stragglers: tuple[int, ...] = ()
    lag_count: dict[int, int] = field(default_factory=dict)
    ranks: tuple[int, ...] = ()


def analyze_dumps(dumps: Iterable[FlightRecorderDump], *,
                  absent_dumps_lag: bool = True) -> FrAnalysis:
    """Match collectives across ranks by (group, sequence number).

    Dumps without a rank are ignored for matching (nothing to compare them with).

    Args:
        dumps: one per rank.
        absent_dumps_lag: count a member rank without a dump as missing the collective (right
            for a job's complete dump set; the node agent, which sees only its node's ranks,
            passes False).
    """
    by_rank = {d.rank: d for d in dumps if d.rank is not None}
    groups: dict[str, tuple[str, tuple[int, ...]]] = {}
    for d in by_rank.values():
        for name, (desc, members) in d.groups.items():
            if members and name not in groups:
                groups[name] = (desc, members)
    # (pg, seq) -> rank -> entries (several for a coalesced group)
    table: dict[tuple[str, int], dict[int, list[FrEntry]]] = defaultdict(lambda: defaultdict(list))
    for rank, d in by_rank.items():
        for e in d.entries:
            if not e.is_p2p and e.seq > 0:
                table[(e.pg, e.seq)][rank].append(e)
    result = FrAnalysis(ranks=tuple(sorted(by_rank)))
    first_lag: dict[str, LaggingCollective] = {}
    mismatched: set[str] = set()
    for (pg, seq), per_rank in sorted(table.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        desc, members = groups.get(pg, ("", ()))
        if not desc:
            desc = next(iter(per_rank.values()))[0].pg_desc
        mismatch = _mismatch(pg, desc, seq, per_rank)
        if mismatch is not None and pg not in mismatched:
            mismatched.add(pg)
            result.mismatches.append(mismatch)
        if pg in first_lag or not members:
            continue
        lag = _lagging(pg, desc, members, seq, per_rank, by_rank, absent_dumps_lag)
        if lag is not None and lag.missing:
            first_lag[pg] = lag
    result.lagging = sorted(first_lag.values(),
                            key=lambda lag: (lag.time_created_ns or 0, lag.pg))
    counts = Counter(r for lag in result.lagging for r in lag.missing)
    result.lag_count = dict(counts)
    if counts:
        top = max(counts.values())
        result.stragglers = tuple(sorted(r for r, n in counts.items() if n == top))
    return result


def _mismatch(pg: str, desc: str, seq: int,
              per_rank: dict[int, list[FrEntry]]) -> SizeMismatch | None:
    signatures: dict[tuple, list[int]] = defaultdict(list)
    for rank, entries in per_rank.items():
        ops = tuple(sorted(e.op for e in entries))
        if all(e.op in VARIABLE_SIZE_OPS for e in entries):
            sig: tuple = (ops,)
        else:
            sig = tuple(sorted(e.signature for e in entries))
        signatures[sig].append(rank)
    if len(signatures) < 2:
        return None
    return SizeMismatch(pg, desc, seq, {s: tuple(sorted(r)) for s, r in signatures.items()})


def _lagging(pg: str, desc: str, members: tuple[int, ...], seq: int,
             per_rank: dict[int, list[FrEntry]], by_rank: dict[int, FlightRecorderDump],
             absent_dumps_lag: bool) -> LaggingCollective | None:
    present = tuple(sorted(per_rank))
    not_enqueued: list[int] = []
    no_dump: list[int] = []
    unknown: list[int] = []
    status: dict[int, tuple[int, int]] = {}
    for rank in members:
        dump = by_rank.get(rank)
        st = dump.status.get(pg) if dump else None
        if st is not None:
            status[rank] = (st.last_enqueued, st.last_completed)
        if rank in per_rank:
            continue
        if dump is None:
            (no_dump if absent_dumps_lag else unknown).append(rank)
        elif st is None:
            unknown.append(rank)
        elif st.last_enqueued < seq:
            not_enqueued.append(rank)
    if not not_enqueued and not no_dump:
        return None
    first = [e for entries in per_rank.values() for e in entries]
    sample = first[0]
    created = [e.time_created_ns for e in first if e.time_created_ns is not None]
    return LaggingCollective(
        pg=pg, pg_desc=desc, members=members, seq=seq, op=sample.op,
        input_sizes=sample.input_sizes, input_dtypes=sample.input_dtypes,
        state=tuple(sorted({e.state for e in first})), present=present,
        not_enqueued=tuple(not_enqueued), no_dump=tuple(no_dump), unknown=tuple(unknown),
        status=status, time_created_ns=min(created) if created else None,
    )
