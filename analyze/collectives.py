"""``laggard analyze`` rules for NCCL logs: watchdog timeouts compared across ranks and files,
desyncs, bring-up failures and NCCL network errors (flight-recorder dumps are
:mod:`laggard.analyze.flight_recorder`)."""

from __future__ import annotations

import os
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from laggard.analyze.findings import (
    incident,
    location_host,
    ranks_text,
    sources_text,
)
from laggard.detectors.finding import Finding, Severity
from laggard.parsers.nccl_log import (
    IBV_WC_STATUS,
    NCCL_RESULTS,
    InitComplete,
    NcclLog,
    NcclWarning,
    ProgressStatus,
    WatchdogTimeout,
)


def pci_from_nccl_bus_id(bus_id: str) -> str | None:
    """NCCL's ``busId`` (hex of ``domain bus dev func`` without separators: ``e7000``) to
    ``dddd:bb:dd``."""
    if not re.fullmatch(r"[0-9a-fA-F]{1,12}", bus_id):
        return None
    s = bus_id.lower().zfill(9)
    return f"{s[:-5][-4:].zfill(4)}:{s[-5:-3]}:{s[-3:-1]}"


def rank_locations(inits: Iterable[InitComplete]) -> dict[int, str]:
    """Global rank -> ``host GPU dddd:bb:dd (cudaDev N)`` from the largest communicator's
    ``Init COMPLETE`` lines (its ranks are the global ranks)."""
    inits = list(inits)
    if not inits:
        return {}
    world = max(i.nranks for i in inits)
    where = {}
    for i in inits:
        if i.nranks == world:
            pci = pci_from_nccl_bus_id(i.bus_id or "")
            where[i.rank] = f"{i.host} GPU {pci or i.bus_id} (cudaDev {i.cuda_dev})"
    return where


def job_inits(logs: list[tuple[str, NcclLog]], directories: Iterable[str]) \
        -> list[InitComplete]:
    """``Init COMPLETE`` lines that may describe the job of files in ``directories``.

    Logs are joined across files by directory (one job's rank logs live together), and only
    where that directory's watchdog timeouts are all about one collective: a directory mixing
    several jobs' logs would otherwise lend one job's world size and hosts to another.
    """
    wanted = set(directories)
    collectives: dict[str, set] = defaultdict(set)
    for source, log in logs:
        collectives[os.path.dirname(source)].update((t.seq, t.op) for t in log.timeouts)
    if any(len(collectives[d]) > 1 for d in wanted):
        return []
    return [i for source, log in logs if os.path.dirname(source) in wanted for i in log.inits]


def _world_size(op: str | None, numel_in: int | None, numel_out: int | None) -> int | None:
    if not op or not numel_in or not numel_out:
        return None
    name = op.upper()
    if "REDUCE_SCATTER" in name and numel_in % numel_out == 0:
        return numel_in // numel_out
    if "ALLGATHER" in name.replace("_", "") and numel_out % numel_in == 0:
        return numel_out // numel_in
    return None


def nccl_findings(logs: list[tuple[str, NcclLog]]) -> list[Finding]:
    """Watchdog timeouts compared across ranks and files, desyncs, network errors."""
    out: list[Finding] = []
    out += _timeout_findings(logs)
    for source, log in logs:
        for m in log.mismatches:
            out.append(incident(
                source=source, kind="collective_mismatch", severity=Severity.CRITICAL,
                subject=f"ranks {m.rank}, {m.other_rank}",
                evidence={"rank": m.rank, "other_rank": m.other_rank, "this": m.this,
                          "other": m.other},
                message=f"rank {m.rank} runs {m.this} while rank {m.other_rank} runs {m.other}: "
                        f"the ranks "
                f"issue different collectives (a code-path desync, not a slow rank)"))
        for d in log.desync:
            ranks = d.never_joined or d.joined_not_finished or d.finished_not_joined_next
            what = ("never joined any collective" if d.never_joined else
                    f"joined but did not finish collective #{d.seq}" if d.joined_not_finished
                    else f"finished #{d.seq} but did not join #{(d.seq or 0) + 1}")
            out.append(incident(
                source=source, kind="collective_timeout", severity=Severity.CRITICAL,
                subject=f"{ranks_text(ranks)}",
                evidence={"ranks": list(ranks), "seq": d.seq, "report": "TORCH_NCCL_DESYNC_DEBUG",
                 "never_joined": list(d.never_joined)},
                message=f"PyTorch's desync report: {ranks_text(ranks)} {what}"))
    out += _bring_up_findings(logs)
    stuck: dict[str, list] = defaultdict(list)
    for source, log in logs:
        stuck[source] += log.stuck
    for source, events in sorted(stuck.items()):
        if not events:
            continue
        ranks = sorted({e.rank for e in events if e.rank is not None})
        seconds = max((e.seconds for e in events if e.seconds is not None), default=None)
        subject = ranks_text(ranks) if ranks else "watchdog"
        out.append(incident(
            source=source, kind="collective_timeout", severity=Severity.CRITICAL,
            subject=subject,
            evidence={"ranks": ranks, "watchdog_stuck_seconds": seconds, "count": len(events)},
            message=f"the NCCL watchdog of {subject} got stuck"
            + (f" for {seconds} s" if seconds else "")
            + ": a CUDA/NCCL call blocked it, most often a GPU fault (look for Xids on that "
              "node) or a thread holding the GIL in a CUDA call; the process was killed"))
    out += _network_findings(logs)
    return out


def _timeout_findings(logs: list[tuple[str, NcclLog]]) -> list[Finding]:
    status, bystanders = _progress_index(logs)
    groups = _timeout_groups(logs, status)
    seqs_by_pg: dict[str, list[int]] = defaultdict(list)
    for (pg, seq) in groups:
        if seq is not None:
            seqs_by_pg[pg].append(seq)
    out = []
    for (pg, seq), items in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] or -1)):
        source = sources_text(s for s, _ in items)
        per_rank: dict[int, WatchdogTimeout] = {}
        for _, t in items:
            if t.rank is not None:
                per_rank.setdefault(t.rank, t)
        desync = _desync_finding(source, pg, seq, per_rank)
        if desync is not None:
            out.append(desync)  # a desync: no rank is "behind", naming a straggler would mislead
            continue
        inits = job_inits(logs, {os.path.dirname(s) for s, _ in items})
        view = _timeout_view(pg, seq, items[0][1], per_rank, status, bystanders.get(pg, {}),
                             world_hint=max((i.nranks for i in inits), default=None))
        lower_seq_in_pg = seq is not None and any(s < seq for s in seqs_by_pg.get(pg, []))
        out.append(_timeout_finding(source, view, rank_locations(inits), lower_seq_in_pg))
    return out


def _progress_index(logs: list[tuple[str, NcclLog]]) \
        -> tuple[dict[tuple[int | None, int], ProgressStatus], dict[str, dict[int, Any]]]:
    """(rank, seq) -> the progress line printed beside that rank's timeout; and, per group, the
    latest progress of ranks that did not time out themselves (they print it when told to dump,
    ``Received a dump signal ...``, or periodically)."""
    status: dict[tuple[int | None, int], ProgressStatus] = {}
    bystanders: dict[str, dict[int, Any]] = defaultdict(dict)
    for _, log in logs:
        for p in log.progress:
            if p.work_seq is not None:
                status[(p.rank, p.work_seq)] = p
            elif p.pg is not None and p.rank is not None:
                bystanders[p.pg][p.rank] = p
    return status, bystanders


def _timeout_groups(logs: list[tuple[str, NcclLog]],
                    status: dict[tuple[int | None, int], ProgressStatus]) \
        -> dict[tuple[str, int | None], list[tuple[str, WatchdogTimeout]]]:
    """Timeouts grouped by (process group, sequence number).

    Grouped by sequence number first, whatever the op: two ranks on the same number with
    different ops are a desync, not two timeouts. A timeout's group is the one its own
    ``[PG ...]`` prefix names, else its progress line's, else the only group its peers on that
    number name (a line without the prefix, or a cut excerpt, still joins them), else ``?``.
    """
    by_seq: dict[int | None, list[tuple[str, WatchdogTimeout]]] = defaultdict(list)
    for source, log in logs:
        for t in log.timeouts:
            by_seq[t.seq].append((source, t))
    groups: dict[tuple[str, int | None], list[tuple[str, WatchdogTimeout]]] = defaultdict(list)
    for seq, items in by_seq.items():
        named = {t: _named_pg(t, status) for _, t in items}
        known = {pg for pg in named.values() if pg is not None}
        for source, t in items:
            pg = named[t] or (next(iter(known)) if len(known) == 1 else "?")
            groups[(pg, seq)].append((source, t))
    return groups


def _named_pg(t: WatchdogTimeout, status: dict[tuple[int | None, int], ProgressStatus]) \
        -> str | None:
    if t.pg is not None:
        return t.pg
    p = status.get((t.rank, t.seq)) if t.seq is not None else None
    return p.pg if p is not None else None


def _desync_finding(source: str, pg: str, seq: int | None,
                    per_rank: dict[int, WatchdogTimeout]) -> Finding | None:
    """A finding when the ranks timed out on the same number with different ops or sizes."""
    signatures: dict[tuple, list[int]] = defaultdict(list)
    for rank, t in per_rank.items():
        signatures[(t.op, t.numel_in, t.numel_out, t.tensor_shape)].append(rank)
    if len(signatures) < 2:
        return None
    pg_text = f"PG {pg}" if pg != "?" else "its process group"
    parts = "; ".join(f"{ranks_text(r)}: {s[0]} NumelIn={s[1]} NumelOut={s[2]}"
                      for s, r in signatures.items())
    return incident(
        source=source, kind="collective_mismatch", severity=Severity.CRITICAL,
        subject=f"{pg_text} seq {seq}",
        evidence={"pg": pg, "seq": seq, "signatures": [
            {"op": s[0], "numel_in": s[1], "numel_out": s[2], "tensor_shape": s[3],
             "ranks": sorted(r)} for s, r in signatures.items()]},
        message=f"collective #{seq} of {pg_text} differs across ranks ({parts}): the ranks are "
                f"desynchronised (different code paths or shapes), not slow")


@dataclass(slots=True)
class _TimeoutView:
    """One collective's timeout as every rank reported it, with the group's progress."""

    pg: str
    seq: int | None
    first: WatchdogTimeout
    ranks: list[int]
    elapsed: dict[int, int | None]
    enq: dict[int, int]
    comp: dict[int, int]
    progress_only: list[int]
    world: int | None
    world_note: str | None
    silent: list[int]
    behind: list[int]
    ahead: list[int]

    @property
    def pg_text(self) -> str:
        return f"PG {self.pg}" if self.pg != "?" else "its process group"


def _timeout_view(pg: str, seq: int | None, first: WatchdogTimeout,
                  per_rank: dict[int, WatchdogTimeout],
                  status: dict[tuple[int | None, int], ProgressStatus],
                  bystanders: dict[int, Any], world_hint: int | None) -> _TimeoutView:
    ranks = sorted(per_rank)
    enq = {r: status[(r, seq)].last_enqueued for r in ranks
           if seq is not None and (r, seq) in status}
    comp = {r: status[(r, seq)].last_completed for r in ranks
            if seq is not None and (r, seq) in status}
    progress_only = sorted(r for r in bystanders if r not in per_rank)
    for r in progress_only:
        enq[r], comp[r] = bystanders[r].last_enqueued, bystanders[r].last_completed
    world = _world_size(first.op, first.numel_in, first.numel_out)
    world_note = f"{world}, from NumelIn/NumelOut" if world else None
    # A subgroup's size is not the world's: the init hint only bounds the default group.
    if world is None and world_hint and pg in ("?", "0") and (not ranks or max(ranks) < world_hint):
        world, world_note = world_hint, f"{world_hint}, from NCCL's Init COMPLETE lines"
    if world is None and ranks:
        world_note = f"at least {max(ranks) + 1}, from the highest rank seen"
    heard = set(ranks) | set(progress_only)
    silent = sorted(set(range(world)) - heard) if world else (
        sorted(set(range(max(heard) + 1)) - heard) if heard else [])
    behind: list[int] = []
    ahead: list[int] = []
    if enq and len(set(enq.values())) > 1:
        low, high = min(enq.values()), max(enq.values())
        behind = sorted(r for r, e in enq.items() if e == low)
        ahead = sorted(r for r, e in enq.items() if e == high)
    return _TimeoutView(pg=pg, seq=seq, first=first, ranks=ranks,
                        elapsed={r: per_rank[r].elapsed_ms for r in ranks}, enq=enq, comp=comp,
                        progress_only=progress_only, world=world, world_note=world_note,
                        silent=silent, behind=behind, ahead=ahead)


def _culprit_ranks(view: _TimeoutView, lower_seq_in_pg: bool) -> list[int]:
    """The ranks at fault in one timed-out collective, the subject :func:`_culprit` names: the
    ranks behind; else, without a sequence number or when the group timed out earlier, the
    reporting ranks; else the ranks that did not report (none for a bring-up failure)."""
    if view.seq == 1 or bool(view.comp and min(view.comp.values()) == -1):
        return []
    if view.seq is None or (not view.behind and lower_seq_in_pg):
        return list(view.ranks)
    return list(view.behind or view.silent)


def _culprit(view: _TimeoutView, lower_seq_in_pg: bool) -> tuple[str, str, bool]:
    """(subject, explanation, bring_up) for one timed-out collective."""
    enq, comp = view.enq, view.comp
    bring_up = view.seq == 1 or bool(comp and min(comp.values()) == -1)
    if bring_up:
        return ("bring-up failure" if view.seq is not None else ranks_text(view.ranks),
                "it hung on the first collective: a bring-up failure (NCCL could not connect "
                "the ranks: check the network interfaces, firewalls and that every rank "
                "started), not a slow rank", True)
    ranks = _culprit_ranks(view, lower_seq_in_pg)
    culprit = (ranks_text(ranks) if ranks or view.seq is None
               else f"{view.pg_text} seq {view.seq}")
    if view.behind:
        return (culprit, f"{ranks_text(view.behind)} are behind (last enqueued "
                         f"{min(enq.values())} vs {max(enq.values())} on "
                         f"{ranks_text(view.ahead)}): they are the stragglers", False)
    if lower_seq_in_pg:
        return culprit, "other ranks of this group timed out on an earlier collective", False
    stuck = (f" (last completed {min(comp.values())})" if comp and len(set(comp.values())) == 1
             else "")
    silent = view.silent
    return (culprit, f"every reporting rank is stuck on it{stuck}, so the straggler is not "
                     f"among them" + (f": look at {ranks_text(silent)}, which did not report "
                                      f"(world size {view.world_note})" if silent else ""), False)


def _timeout_finding(source: str, view: _TimeoutView, locations: dict[int, str],
                     lower_seq_in_pg: bool) -> Finding:
    culprit, tail, bring_up = _culprit(view, lower_seq_in_pg)
    first = view.first
    ev: dict[str, Any] = {
        "op": first.op, "seq": view.seq, "pg": view.pg, "timeout_ms": first.timeout_ms,
        "elapsed_ms": {str(r): ms for r, ms in view.elapsed.items()},
        "numel_in": first.numel_in, "numel_out": first.numel_out, "ranks": view.ranks,
        "last_enqueued": {str(r): v for r, v in view.enq.items()},
        "last_completed": {str(r): v for r, v in view.comp.items()},
        "ahead": view.ahead, "behind": view.behind, "not_reporting": view.silent,
        "world_size": view.world, "progress_only_ranks": view.progress_only,
        "bring_up": bring_up, "culprit": culprit,
    }
    node = None
    if locations:
        ev["locations"] = {str(r): locations[r] for r in sorted(set(view.ranks) | set(view.silent))
                           if r in locations}
        culprits = {str(r): locations[r] for r in _culprit_ranks(view, lower_seq_in_pg)
                    if r in locations}
        if culprits:
            ev["culprit_locations"] = culprits
            node = location_host(culprits)
    values = [ms for ms in view.elapsed.values() if ms is not None]
    span = f"{min(values)}-{max(values)} ms" if values else "?"
    head = (f"{first.op} #{view.seq} of {view.pg_text} timed out ({first.timeout_ms} ms) on "
            f"{ranks_text(view.ranks)} after {span}")
    return incident(source=source, kind="collective_timeout", severity=Severity.CRITICAL,
                    subject=culprit, evidence=ev, message=f"{head}; {tail}", node=node)


def _bring_up_findings(logs: list[tuple[str, NcclLog]]) -> list[Finding]:
    out = []
    waiting: dict[int | None, list[tuple[str, Any]]] = defaultdict(list)
    for source, log in logs:
        for b in log.bring_up:
            if b.expected is not None:
                out.append(incident(
                    source=source, kind="collective_timeout", severity=Severity.CRITICAL,
                    subject="bring-up failure",
                    evidence={"bring_up": True, "joined": b.joined, "expected": b.expected},
                    message=f"bring-up failure: only {b.joined} of {b.expected} ranks reached the "
                    f"rendezvous store; the others never started or cannot reach MASTER_ADDR"))
            else:
                waiting[b.root].append((source, b))
    for root, items in sorted(waiting.items(), key=lambda kv: kv[0] if kv[0] is not None else -1):
        ranks = sorted({b.rank for _, b in items if b.rank is not None})
        errors = sorted({b.error for _, b in items if b.error})
        out.append(incident(
            source=sources_text(s for s, _ in items),
            kind="collective_timeout", severity=Severity.CRITICAL,
            subject=f"rank {root}",
            evidence={"bring_up": True, "root": root, "waiting_ranks": ranks, "errors": errors},
            message=f"bring-up failure: {ranks_text(ranks)} could not fetch NCCL's unique id "
                    f"from rank "
            f"{root} through the c10d store ({'; '.join(errors) or 'no error text'}): rank "
            f"{root} crashed or hung before creating the communicator, or the store at "
            f"MASTER_ADDR is unreachable; read rank {root}'s log first"))
    return out


_WC_MEANING = {
    12: "transport retry counter exceeded: the peer stopped acknowledging (link, switch or "
        "remote HCA down or flapping)",
    13: "receiver-not-ready retries exceeded: the peer posted no receive buffer in time",
    5: "work request flushed: the queue pair had already failed",
    10: "remote access error: bad memory key or registration on the peer",
    20: "response timeout",
}


def _network_findings(logs: list[tuple[str, NcclLog]]) -> list[Finding]:
    """NCCL's network trouble in the logs: InfiniBand completion errors (per link), NCCL
    errors that a network failure causes, and other NET/socket warnings."""
    ib: dict[tuple, list[tuple[str, NcclWarning]]] = defaultdict(list)
    other: dict[tuple, list[tuple[str, NcclWarning]]] = defaultdict(list)
    for source, log in logs:
        for w in log.warnings:
            if w.wc_status is not None:
                ib[(w.host, w.device, w.peer, w.wc_status, w.vendor_err, w.direction)].append(
                    (source, w))
            elif "NET/" in w.message or "socket" in w.message.lower():
                template = re.sub(r"\d+", "N", w.message)[:160]
                other[(w.host, w.device, template)].append((source, w))
    out = [_ib_completion_finding(key, items)
           for key, items in sorted(ib.items(), key=lambda kv: str(kv[0]))]
    out += _nccl_error_findings(logs)
    out += [_net_warning_finding(host, dev, items)
            for (host, dev, _template), items in sorted(other.items(), key=lambda kv: str(kv[0]))]
    return out


def _ib_completion_finding(key: tuple, items: list[tuple[str, NcclWarning]]) -> Finding:
    """One link's InfiniBand work-completion errors (``ibv_poll_cq`` status, vendor error)."""
    host, dev, peer, status, vendor, direction = key
    warnings = [w for _, w in items]
    ports = sorted({w.peer_port for w in warnings if w.peer_port is not None})
    results = sorted({w.result for w in warnings if w.result is not None})
    status_name = IBV_WC_STATUS.get(status, f"status {status}")
    meaning = _WC_MEANING.get(status, "see ibv_poll_cq(3)")
    result_text = ", ".join(f"{r} ({NCCL_RESULTS.get(r, '?')})" for r in results)
    hcas = sorted({w.hca for w in warnings if w.hca})
    return incident(
        source=sources_text(s for s, _ in items),
        kind="nccl_network_error", severity=Severity.CRITICAL,
        subject=f"{host} GPU {dev} <-> {peer}", node=host,
        evidence={"host": host, "device": dev, "peer": peer, "peer_ports": ports,
                  "count": len(items), "wc_status": status, "wc_status_name": status_name,
                  "vendor_err": vendor, "direction": direction, "nccl_result": results,
                  "hca": hcas, "pid": warnings[0].pid},
        message=f"{len(items)} InfiniBand completion error(s) on {host} GPU {dev}"
        f"{' (' + direction + ')' if direction else ''} with peer {peer}"
        f"{' ports ' + ', '.join(map(str, ports)) if ports else ''}: status {status} "
        f"{status_name} ({meaning}), vendor err {vendor}"
        f"{'; NCCL returned ' + result_text if result_text else ''}; suspect the link "
        f"between {host}'s NIC{' ' + ', '.join(hcas) if hcas else ''} and {peer}")


def _nccl_error_findings(logs: list[tuple[str, NcclLog]]) -> list[Finding]:
    """NCCL errors a network failure causes (``ncclRemoteError``, system errors), per error."""
    errors: dict[str, list[tuple[str, Any]]] = defaultdict(list)
    for source, log in logs:
        for e in log.errors:
            if "network" in e.what or "system error" in e.what or e.result == "ncclRemoteError":
                errors[e.what].append((source, e))
    out = []
    for what, items in sorted(errors.items()):
        ranks = sorted({e.rank for _, e in items if e.rank is not None})
        versions = sorted({e.nccl_version for _, e in items if e.nccl_version})
        out.append(incident(
            source=sources_text(s for s, _ in items),
            kind="nccl_network_error", severity=Severity.CRITICAL,
            subject=ranks_text(ranks) if ranks else "NCCL",
            evidence={"error": what, "ranks": ranks, "count": len(items),
                      "nccl_version": versions, "where": items[0][1].where},
            message=f"NCCL error on {ranks_text(ranks) if ranks else 'a rank'}: {what} (NCCL "
            f"{', '.join(versions) or '?'}); a peer died or the network failed: the first rank "
            f"to fail, or an NCCL WARN NET line, names the link"))
    return out


def _net_warning_finding(host: Any, dev: Any, items: list[tuple[str, NcclWarning]]) -> Finding:
    """Repeats of one NET/socket warning on one GPU (numbers folded to tell repeats apart)."""
    w = items[0][1]
    return incident(
        source=sources_text(s for s, _ in items),
        kind="nccl_network_error", severity=Severity.WARNING,
        subject=f"{host} GPU {dev}", node=host,
        evidence={"host": host, "device": dev, "count": len(items), "message": w.message[:300],
                  "source_line": w.source, "nccl_result": w.result},
        message=f"{len(items)}x NCCL network warning on {host} GPU {dev}: {w.message[:200]}")
