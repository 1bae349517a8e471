"""``laggard analyze`` rules for collectives: watchdog timeouts compared across ranks and files,
desyncs, bring-up failures, NCCL network errors, and flight-recorder dumps matched across ranks."""

from __future__ import annotations

import os
import re
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from laggard.analyze.findings import (
    IncidentFinding,
    ranks_text,
    sources_text,
)
from laggard.detectors.finding import Severity
from laggard.detectors.flight_recorder import FrAnalysis
from laggard.parsers.flight_recorder import FrTraceIssue
from laggard.parsers.nccl_log import (
    IBV_WC_STATUS,
    NCCL_RESULTS,
    InitComplete,
    NcclLog,
    NcclWarning,
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


def nccl_findings(logs: list[tuple[str, NcclLog]]) -> list[IncidentFinding]:
    """Watchdog timeouts compared across ranks and files, desyncs, network errors."""
    out: list[IncidentFinding] = []
    out += _timeout_findings(logs)
    for source, log in logs:
        for m in log.mismatches:
            out.append(IncidentFinding(
                source, "collective_mismatch", Severity.CRITICAL, f"ranks {m.rank}, {m.other_rank}",
                {"rank": m.rank, "other_rank": m.other_rank, "this": m.this, "other": m.other},
                f"rank {m.rank} runs {m.this} while rank {m.other_rank} runs {m.other}: the ranks "
                f"issue different collectives (a code-path desync, not a slow rank)"))
        for d in log.desync:
            ranks = d.never_joined or d.joined_not_finished or d.finished_not_joined_next
            what = ("never joined any collective" if d.never_joined else
                    f"joined but did not finish collective #{d.seq}" if d.joined_not_finished
                    else f"finished #{d.seq} but did not join #{(d.seq or 0) + 1}")
            out.append(IncidentFinding(
                source, "collective_timeout", Severity.CRITICAL, f"{ranks_text(ranks)}",
                {"ranks": list(ranks), "seq": d.seq, "report": "TORCH_NCCL_DESYNC_DEBUG",
                 "never_joined": list(d.never_joined)},
                f"PyTorch's desync report: {ranks_text(ranks)} {what}"))
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
        out.append(IncidentFinding(
            source, "collective_timeout", Severity.CRITICAL, subject,
            {"ranks": ranks, "watchdog_stuck_seconds": seconds, "count": len(events)},
            f"the NCCL watchdog of {subject} got stuck"
            + (f" for {seconds} s" if seconds else "")
            + ": a CUDA/NCCL call blocked it, most often a GPU fault (look for Xids on that "
              "node) or a thread holding the GIL in a CUDA call; the process was killed"))
    out += _network_findings(logs)
    return out


def _timeout_findings(logs: list[tuple[str, NcclLog]]) -> list[IncidentFinding]:
    # (pg, rank, seq) -> status, to give each timeout its process group and progress
    status: dict[tuple[int | None, int | None], Any] = {}
    # Ranks that did not time out themselves still print their group's progress when told to
    # dump ("Received a dump signal ...") or periodically: the latest per (group, rank).
    bystanders: dict[str, dict[int, Any]] = defaultdict(dict)
    for _, log in logs:
        for p in log.progress:
            if p.work_seq is not None:
                status[(p.rank, p.work_seq)] = p
            elif p.pg is not None and p.rank is not None:
                bystanders[p.pg][p.rank] = p
    # Group by (seq, op) first: a rank whose progress line is missing (a cut excerpt) still
    # joins its peers; split by process group only when ranks name different groups.
    by_collective: dict[tuple, list[tuple[str, WatchdogTimeout]]] = defaultdict(list)
    for source, log in logs:
        for t in log.timeouts:
            by_collective[(t.seq, t.op)].append((source, t))
    groups: dict[tuple[str, int | None], list[tuple[str, WatchdogTimeout]]] = defaultdict(list)
    for (seq, _), items in by_collective.items():
        pgs = {status[(t.rank, seq)].pg for _, t in items
               if (t.rank, seq) in status and status[(t.rank, seq)].pg is not None}
        for source, t in items:
            p = status.get((t.rank, seq))
            if p is not None and p.pg is not None:
                pg = p.pg
            else:
                pg = next(iter(pgs)) if len(pgs) == 1 else "?"
            groups[(pg, seq)].append((source, t))
    out = []
    by_pg: dict[str, list[int]] = defaultdict(list)
    for (pg, seq) in groups:
        if seq is not None:
            by_pg[pg].append(seq)
    for (pg, seq), items in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] or -1)):
        inits = job_inits(logs, {os.path.dirname(source) for source, _ in items})
        # The default communicator spans the world: its size bounds the ranks to hear from.
        world_hint = max((i.nranks for i in inits), default=None)
        out += _one_timeout(pg, seq, items, status, by_pg, rank_locations(inits), world_hint,
                            bystanders.get(pg, {}))
    return out


def _one_timeout(pg: str, seq: int | None, items: list[tuple[str, WatchdogTimeout]],
                 status: dict, by_pg: dict[str, list[int]], locations: dict[int, str],
                 world_hint: int | None, bystanders: dict[int, Any]) -> list[IncidentFinding]:
    source = sources_text(s for s, _ in items)
    per_rank: dict[int, WatchdogTimeout] = {}
    for _, t in items:
        if t.rank is not None:
            per_rank.setdefault(t.rank, t)
    timeouts = [t for _, t in items]
    first = timeouts[0]
    signatures: dict[tuple, list[int]] = defaultdict(list)
    for rank, t in per_rank.items():
        signatures[(t.op, t.numel_in, t.numel_out, t.tensor_shape)].append(rank)
    pg_text = f"PG {pg}" if pg != "?" else "its process group"
    out = []
    if len(signatures) > 1:
        parts = "; ".join(f"{ranks_text(r)}: {s[0]} NumelIn={s[1]} NumelOut={s[2]}"
                          for s, r in signatures.items())
        out.append(IncidentFinding(
            source, "collective_mismatch", Severity.CRITICAL, f"{pg_text} seq {seq}",
            {"pg": pg, "seq": seq, "signatures": [
                {"op": s[0], "numel_in": s[1], "numel_out": s[2], "tensor_shape": s[3],
                 "ranks": sorted(r)} for s, r in signatures.items()]},
            f"collective #{seq} of {pg_text} differs across ranks ({parts}): the ranks are "
            f"desynchronised (different code paths or shapes), not slow"))
        return out  # a desync: no rank is "behind", naming a straggler would mislead
    ranks = sorted(per_rank)
    elapsed = {r: per_rank[r].elapsed_ms for r in ranks}
    enq = {r: status[(r, seq)].last_enqueued for r in ranks if (r, seq) in status}
    comp = {r: status[(r, seq)].last_completed for r in ranks if (r, seq) in status}
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
    behind = ahead = []
    if enq and len(set(enq.values())) > 1:
        low, high = min(enq.values()), max(enq.values())
        behind = sorted(r for r, e in enq.items() if e == low)
        ahead = sorted(r for r, e in enq.items() if e == high)
    lower_seq_in_pg = seq is not None and any(s < seq for s in by_pg.get(pg, []))
    bring_up = seq == 1 or (comp and min(comp.values()) == -1)
    ev: dict[str, Any] = {
        "op": first.op, "seq": seq, "pg": pg, "timeout_ms": first.timeout_ms,
        "elapsed_ms": {str(r): ms for r, ms in elapsed.items()},
        "numel_in": first.numel_in, "numel_out": first.numel_out, "ranks": ranks,
        "last_enqueued": {str(r): v for r, v in enq.items()},
        "last_completed": {str(r): v for r, v in comp.items()},
        "ahead": ahead, "behind": behind, "not_reporting": silent, "world_size": world,
        "progress_only_ranks": progress_only,
        "bring_up": bool(bring_up),
    }
    if locations:
        ev["locations"] = {str(r): locations[r] for r in sorted(set(ranks) | set(silent))
                           if r in locations}
    span = (f"{min(elapsed.values())}-{max(elapsed.values())} ms" if elapsed else "?")
    head = (f"{first.op} #{seq} of {pg_text} timed out ({first.timeout_ms} ms) on "
            f"{ranks_text(ranks)} after {span}")
    if bring_up:
        culprit = "bring-up failure"
        tail = ("it hung on the first collective: a bring-up failure (NCCL could not connect "
                "the ranks: check the network interfaces, firewalls and that every rank "
                "started), not a slow rank")
    elif behind:
        culprit = f"{ranks_text(behind)}"
        tail = (f"{ranks_text(behind)} are behind (last enqueued {min(enq.values())} vs "
                f"{max(enq.values())} on {ranks_text(ahead)}): they are the stragglers")
    elif lower_seq_in_pg:
        culprit = f"{ranks_text(ranks)}"
        tail = "other ranks of this group timed out on an earlier collective"
    else:
        culprit = f"{ranks_text(silent)}" if silent else f"{pg_text} seq {seq}"
        stuck = (f" (last completed {min(comp.values())})" if comp and
                 len(set(comp.values())) == 1 else "")
        tail = (f"every reporting rank is stuck on it{stuck}, so the straggler is not among "
                f"them" + (f": look at {ranks_text(silent)}, which did not report "
                           f"(world size {world_note})" if silent else ""))
    if seq is None:
        culprit = f"{ranks_text(ranks)}"
    ev["culprit"] = culprit
    out.append(IncidentFinding(source, "collective_timeout", Severity.CRITICAL, culprit, ev,
                       f"{head}; {tail}"))
    return out


def _bring_up_findings(logs: list[tuple[str, NcclLog]]) -> list[IncidentFinding]:
    out = []
    waiting: dict[int | None, list[tuple[str, Any]]] = defaultdict(list)
    for source, log in logs:
        for b in log.bring_up:
            if b.expected is not None:
                out.append(IncidentFinding(
                    source, "collective_timeout", Severity.CRITICAL, "bring-up failure",
                    {"bring_up": True, "joined": b.joined, "expected": b.expected},
                    f"bring-up failure: only {b.joined} of {b.expected} ranks reached the "
                    f"rendezvous store; the others never started or cannot reach MASTER_ADDR"))
            else:
                waiting[b.root].append((source, b))
    for root, items in sorted(waiting.items(), key=lambda kv: kv[0] if kv[0] is not None else -1):
        ranks = sorted({b.rank for _, b in items if b.rank is not None})
        errors = sorted({b.error for _, b in items if b.error})
        out.append(IncidentFinding(
            sources_text(s for s, _ in items), "collective_timeout", Severity.CRITICAL,
            f"rank {root}",
            {"bring_up": True, "root": root, "waiting_ranks": ranks, "errors": errors},
            f"bring-up failure: {ranks_text(ranks)} could not fetch NCCL's unique id from rank "
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


def _network_findings(logs: list[tuple[str, NcclLog]]) -> list[IncidentFinding]:
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
    out = []
    for (host, dev, peer, status, vendor, direction), items in sorted(
            ib.items(), key=lambda kv: str(kv[0])):
        warnings = [w for _, w in items]
        ports = sorted({w.peer_port for w in warnings if w.peer_port is not None})
        results = sorted({w.result for w in warnings if w.result is not None})
        status_name = IBV_WC_STATUS.get(status, f"status {status}")
        meaning = _WC_MEANING.get(status, "see ibv_poll_cq(3)")
        result_text = ", ".join(f"{r} ({NCCL_RESULTS.get(r, '?')})" for r in results)
        hcas = sorted({w.hca for w in warnings if w.hca})
        out.append(IncidentFinding(
            sources_text(s for s, _ in items), "nccl_network_error", Severity.CRITICAL,
            f"{host} GPU {dev} <-> {peer}",
            {"host": host, "device": dev, "peer": peer, "peer_ports": ports, "count": len(items),
             "wc_status": status, "wc_status_name": status_name, "vendor_err": vendor,
             "direction": direction, "nccl_result": results, "hca": hcas,
             "pid": warnings[0].pid},
            f"{len(items)} InfiniBand completion error(s) on {host} GPU {dev}"
            f"{' (' + direction + ')' if direction else ''} with peer {peer}"
            f"{' ports ' + ', '.join(map(str, ports)) if ports else ''}: status {status} "
            f"{status_name} ({meaning}), vendor err {vendor}"
            f"{'; NCCL returned ' + result_text if result_text else ''}; suspect the link "
            f"between {host}'s NIC{' ' + ', '.join(hcas) if hcas else ''} and {peer}"))
    errors: dict[str, list[tuple[str, Any]]] = defaultdict(list)
    for source, log in logs:
        for e in log.errors:
            if "network" in e.what or "system error" in e.what or e.result == "ncclRemoteError":
                errors[e.what].append((source, e))
    for what, items in sorted(errors.items()):
        ranks = sorted({e.rank for _, e in items if e.rank is not None})
        versions = sorted({e.nccl_version for _, e in items if e.nccl_version})
        out.append(IncidentFinding(
            sources_text(s for s, _ in items), "nccl_network_error", Severity.CRITICAL,
            ranks_text(ranks) if ranks else "NCCL",
            {"error": what, "ranks": ranks, "count": len(items), "nccl_version": versions,
             "where": items[0][1].where},
            f"NCCL error on {ranks_text(ranks) if ranks else 'a rank'}: {what} (NCCL "
            f"{', '.join(versions) or '?'}); a peer died or the network failed: the first rank "
            f"to fail, or an NCCL WARN NET line, names the link"))
    for (host, dev, _template), items in sorted(other.items(), key=lambda kv: str(kv[0])):
        w = items[0][1]
        out.append(IncidentFinding(
            sources_text(s for s, _ in items), "nccl_network_error", Severity.WARNING,
            f"{host} GPU {dev}",
            {"host": host, "device": dev, "count": len(items), "message": w.message[:300],
             "source_line": w.source, "nccl_result": w.result},
            f"{len(items)}x NCCL network warning on {host} GPU {dev}: {w.message[:200]}"))
    return out


def fr_findings(source: str, analysis: FrAnalysis,
                locations: dict[int, str]) -> list[IncidentFinding]:
    """Findings from dumps matched across ranks."""
    out = []
    stragglers = list(analysis.stragglers)
    for i, lag in enumerate(analysis.lagging):
        primary = i == 0
        shape = " x ".join("x".join(map(str, s)) for s in lag.input_sizes) or "?"
        dtype = ", ".join(lag.input_dtypes) or "?"
        ev: dict[str, Any] = {
            "op": lag.op, "seq": lag.seq, "pg": lag.pg, "pg_desc": lag.pg_desc,
            "members": list(lag.members), "present": list(lag.present),
            "missing_ranks": list(lag.missing), "not_enqueued": list(lag.not_enqueued),
            "no_dump": list(lag.no_dump), "unknown": list(lag.unknown),
            "input_sizes": [list(s) for s in lag.input_sizes],
            "input_dtypes": list(lag.input_dtypes),
            "state": list(lag.state),
            "last_enqueued": {str(r): s[0] for r, s in sorted(lag.status.items())},
            "last_completed": {str(r): s[1] for r, s in sorted(lag.status.items())},
        }
        if primary:
            ev["likely_stragglers"] = stragglers
            ev["lagging_pgs"] = [x.pg for x in analysis.lagging]
        where = [locations[r] for r in lag.missing if r in locations]
        if where:
            ev["locations"] = {str(r): locations[r] for r in lag.missing if r in locations}
        missing_status = ", ".join(
            f"rank {r} enq {lag.status[r][0]}/comp {lag.status[r][1]}"
            for r in lag.missing if r in lag.status)
        msg = (f"{lag.op} #{lag.seq} ({shape} {dtype}) of PG {lag.pg} ({lag.pg_desc}) was "
               f"issued by {ranks_text(lag.present)} but never by "
               f"{ranks_text(lag.missing)}" + (f" ({missing_status})" if missing_status else "")
               + (f"; no dump from {ranks_text(lag.no_dump)}" if lag.no_dump else ""))
        if primary and stragglers:
            msg += (f". {ranks_text(stragglers).capitalize()} lag in {len(analysis.lagging)} "
                    f"process group(s) ({', '.join(x.pg for x in analysis.lagging)}): they are the "
                    f"likely stragglers; look at their GPUs and hosts first")
        out.append(IncidentFinding(source, "collective_timeout",
                           Severity.CRITICAL if primary else Severity.WARNING,
                           f"{ranks_text(lag.missing)}", ev, msg))
    for mm in analysis.mismatches:
        parts = "; ".join(f"{ranks_text(r)}: {s[0]} {s[1:] if len(s) > 1 else ''}"
                          for s, r in mm.signatures.items())
        out.append(IncidentFinding(
            source, "collective_mismatch", Severity.CRITICAL, f"PG {mm.pg} seq {mm.seq}",
            {"pg": mm.pg, "pg_desc": mm.pg_desc, "seq": mm.seq,
             "signatures": [{"signature": repr(s), "ranks": list(r)}
                            for s, r in mm.signatures.items()]},
            f"collective #{mm.seq} of PG {mm.pg} ({mm.pg_desc}) has different ops, sizes or "
            f"dtypes across ranks ({parts[:300]}): a desync, not a slow rank"))
    return out


def fr_report_findings(source: str, issues: list[FrTraceIssue]) -> list[IncidentFinding]:
    """Findings from torchfrtrace's printed report."""
    out = []
    for issue in issues:
        if issue.kind == "not_all_joined":
            missing = ranks_text(issue.missing_ranks)
            out.append(IncidentFinding(
                source, "collective_timeout", Severity.CRITICAL, f"{missing}",
                {"collective": issue.collective, "entry": issue.entry, "group": issue.group,
                 "op": issue.op, "missing_ranks": list(issue.missing_ranks),
                 "expected_ranks": issue.expected_ranks, "input_sizes": issue.input_sizes,
                 "state": issue.state},
                f"collective {issue.collective} ({issue.op}, group {issue.group}) was not "
                f"joined by {missing} of {issue.expected_ranks}: {missing} never "
                f"reached it (state {issue.state}); "
                f"{'it is' if len(issue.missing_ranks) == 1 else 'they are'} the culprit"))
        else:
            out.append(IncidentFinding(source, "collective_mismatch", Severity.CRITICAL,
                               "collective", {"detail": issue.detail},
                               f"torchfrtrace: {issue.detail}"))
    return out
