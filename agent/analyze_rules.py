"""Rules of ``laggard analyze``: parsed artifacts in, findings out. Pure; no file I/O.

Each ``*_findings`` function takes what one parser produced (or, for collectives, what every
file of that kind produced, so ranks are compared across files) and returns
:class:`IncidentFinding` objects (the agent's detectors use :class:`~laggard.detectors.finding.
Finding`; an incident report names a subject and a source file instead of rank/node/gpu fields).
"""

from __future__ import annotations

import datetime
import os
import re
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from laggard.collectors.dcgm_exposition import DcgmGpu, Exposition
from laggard.collectors.flight_recorder import FrAnalysis, FrTraceIssue
from laggard.collectors.infiniband_listing import IbPort
from laggard.collectors.kernel_log import SXidEvent, XidEvent
from laggard.collectors.nccl_inspector import InspectorRecord, InspectorStream
from laggard.collectors.nccl_log import (
    IBV_WC_STATUS,
    NCCL_RESULTS,
    InitComplete,
    NcclLog,
    NcclWarning,
    WatchdogTimeout,
)
from laggard.collectors.nccl_tests import GIB, NcclTestsResult
from laggard.collectors.nvidia_smi import SmiGpu, reasons_from_bitmask
from laggard.detectors import xid_catalog
from laggard.detectors.finding import Severity

KINDS = ("xid", "sxid", "gpu_lost", "collective_timeout", "collective_mismatch",
         "nccl_network_error", "busbw", "clock_event", "ib_port", "netdev")
_RANK_ORDER = {Severity.CRITICAL: 0, Severity.WARNING: 1, Severity.INFO: 2}
#: Most distinct pids/processes listed per Xid group.
MAX_LISTED = 10


@dataclass(slots=True)
class IncidentFinding:
    """One line of ``laggard analyze``'s report.

    Attributes:
        source: file(s) it was read from.
        kind: one of :data:`KINDS`.
        severity: info / warning / critical.
        subject: what is at fault (``GPU 0000:9b:00``, ``ranks 9, 14``, ``mlx5_1 port 1``).
        evidence: the numbers (JSON-serialisable).
        message: one line a person can act on.
    """

    source: str
    kind: str
    severity: Severity
    subject: str
    evidence: dict[str, Any]
    message: str

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` form."""
        return {"source": self.source, "kind": self.kind, "severity": self.severity.value,
                "subject": self.subject, "evidence": self.evidence, "message": self.message}


def sort_findings(findings: Iterable[IncidentFinding]) -> list[IncidentFinding]:
    """Most severe first, then by kind, subject and source (stable, deterministic)."""
    return sorted(findings, key=lambda f: (_RANK_ORDER[f.severity], KINDS.index(f.kind),
                                           f.subject, f.source))


def ranks_text(ranks: Iterable[int]) -> str:
    """``[0, 3, 4]`` -> ``"ranks 0, 3, 4"``, ``[3]`` -> ``"rank 3"``; long runs are kept whole
    (they are the point)."""
    unique = sorted(set(ranks))
    if not unique:
        return "no rank"
    return ("rank " if len(unique) == 1 else "ranks ") + ", ".join(map(str, unique))


def sources_text(sources: Iterable[str]) -> str:
    """Join the files a finding came from; more than 4 are summarised."""
    unique = sorted(set(sources))
    if len(unique) > 4:
        return ", ".join(unique[:3]) + f" and {len(unique) - 3} more"
    return ", ".join(unique)


# --------------------------------------------------------------------------- kernel log


_RM_INIT = re.compile(
    r"NVRM: GPU (?P<pci>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-9a-fA-F]): "
    r"RmInitAdapter failed! \((?P<code>[^)]*)\)")


_GPU_UUID = re.compile(r"NVRM: GPU at PCI:(?P<pci>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}): "
                       r"(?P<uuid>GPU-[0-9a-fA-F-]+)")


@dataclass(slots=True)
class _XidGroup:
    count: int = 0
    first: float | None = None
    last: float | None = None
    first_uptime: float | None = None
    last_uptime: float | None = None
    pids: Counter = field(default_factory=Counter)
    messages: list[str] = field(default_factory=list)
    fatal_token: str | None = None


@dataclass(slots=True)
class KernelEvidence:
    """Xid/SXid events of one kernel log, aggregated as they stream in (bounded memory)."""

    xids: dict[tuple[int, str], _XidGroup] = field(default_factory=dict)
    sxids: dict[tuple[int, str], dict[str, Any]] = field(default_factory=dict)
    rm_init_failures: dict[str, dict[str, Any]] = field(default_factory=dict)
    uuids: dict[str, str] = field(default_factory=dict)  # pci -> GPU UUID, when the log says

    def add(self, event: XidEvent | SXidEvent) -> None:
        """Count one parser event."""
        if isinstance(event, XidEvent):
            group = self.xids.setdefault((event.xid, event.pci_bus_id), _XidGroup())
            group.count += 1
            if event.timestamp is not None:
                group.first = event.timestamp if group.first is None else group.first
                group.last = event.timestamp
            if event.uptime_seconds is not None:
                if group.first_uptime is None:
                    group.first_uptime = event.uptime_seconds
                group.last_uptime = event.uptime_seconds
            if len(group.pids) < MAX_LISTED or (event.pid, event.process) in group.pids:
                group.pids[(event.pid, event.process)] += 1
            if len(group.messages) < 3 and event.message not in group.messages:
                group.messages.append(event.message)
            group.fatal_token = event.fatal_token or group.fatal_token
            return
        key = (event.sxid, event.pci_bus_id)
        sx = self.sxids.setdefault(key, {"count": 0, "links": [], "severity": None,
                                         "device": event.device, "message": event.message,
                                         "uptime": event.uptime_seconds})
        sx["count"] += 1
        if event.link is not None and len(sx["links"]) < 64:
            sx["links"].append(event.link)
        sx["severity"] = sx["severity"] or event.severity

    def add_line(self, line: str) -> None:
        """Look at one raw line for what the Xid parser does not report: RmInitAdapter
        failures, and the ``NVRM: GPU at PCI:... GPU-<uuid>`` line printed before an Xid."""
        if "GPU at PCI:" in line and (u := _GPU_UUID.search(line)):
            if len(self.uuids) < 1024:
                self.uuids[u["pci"].lower()] = u["uuid"]
        if "RmInitAdapter" in line and (m := _RM_INIT.search(line)):
            entry = self.rm_init_failures.setdefault(m["pci"].lower(),
                                                     {"count": 0, "codes": []})
            entry["count"] += 1
            if m["code"] not in entry["codes"]:
                entry["codes"].append(m["code"])


def _iso(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    return datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).isoformat(
        timespec="seconds")


def kernel_findings(source: str, evidence: KernelEvidence) -> list[IncidentFinding]:
    """Xid groups (by code and GPU), SXid groups (by code and switch), lost GPUs."""
    out = []
    for (xid, pci), g in sorted(evidence.xids.items()):
        info = xid_catalog.lookup(xid, g.messages[0] if g.messages else "", g.fatal_token)
        pids = [{"pid": pid, "process": proc, "count": n}
                for (pid, proc), n in g.pids.most_common()]
        known = [p for p in pids if p["pid"] is not None or p["process"] is not None]
        ev: dict[str, Any] = {
            "xid": xid, "name": info.name, "pci_bus_id": pci, "count": g.count,
            "action": info.action.value, "first": _iso(g.first), "last": _iso(g.last),
            "first_uptime_seconds": g.first_uptime, "last_uptime_seconds": g.last_uptime,
            "messages": g.messages,
        }
        if pci in evidence.uuids:
            ev["uuid"] = evidence.uuids[pci]
        if known:
            ev["pid"] = known[0]["pid"]
            ev["process"] = known[0]["process"]
            ev["processes"] = known
        who = "; ".join(f"{p['process'] or '?'} (pid {p['pid'] if p['pid'] is not None else '?'})"
                        f"{' x' + str(p['count']) if p['count'] > 1 else ''}" for p in known)
        out.append(IncidentFinding(
            source, "xid", info.severity, f"GPU {pci}", ev,
            f"{g.count}x Xid {xid} ({info.name}: {info.description}) on GPU {pci}"
            f"{', ' + who if who else ''}; action: {info.action.value.replace('_', ' ')}"))
        if xid == 79:
            out.append(_gpu_lost(source, pci, "fell off the bus (Xid 79)",
                                 {"xid": 79, "count": g.count}))
    for (sxid, pci), sx in sorted(evidence.sxids.items()):
        fatal = (sx["severity"] or "").lower() == "fatal"
        links = sorted(set(sx["links"]))
        out.append(IncidentFinding(
            source, "sxid", Severity.CRITICAL if fatal else Severity.WARNING,
            f"NVSwitch {pci}",
            {"sxid": sxid, "pci_bus_id": pci, "device": sx["device"], "count": sx["count"],
             "links": links, "severity": sx["severity"], "message": sx["message"]},
            f"{sx['count']}x SXid {sxid} ({sx['severity'] or 'severity not printed'}) on "
            f"{sx['device'] or 'NVSwitch'} {pci}"
            f"{', link ' + ', '.join(map(str, links)) if links else ''}: {sx['message']}; "
            f"{'the NVLink fabric is degraded: drain the node' if fatal else 'watch the link'}"))
    for pci, entry in sorted(evidence.rm_init_failures.items()):
        out.append(_gpu_lost(source, pci[:-2] if pci.count(".") else pci,
                             f"failed to initialise ({entry['count']}x RmInitAdapter failed, "
                             f"{', '.join(entry['codes'])})",
                             {"rm_init_adapter_failures": entry["count"],
                              "codes": entry["codes"], "pci_bus_id_full": pci}))
    return out


def _gpu_lost(source: str, pci: str, what: str, ev: dict[str, Any]) -> IncidentFinding:
    return IncidentFinding(source, "gpu_lost", Severity.CRITICAL, f"GPU {pci}",
                   {"pci_bus_id": pci, **ev},
                   f"GPU {pci} {what}: it is unusable until the node is rebooted or the GPU "
                   f"reset; drain the node and check the PCIe link, power and the GPU")


# --------------------------------------------------------------------------- NCCL logs


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


# --------------------------------------------------------------------------- flight recorder


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


# --------------------------------------------------------------------------- bandwidth


#: A size counts as "at the plateau" once busbw reaches this share of the peak.
PLATEAU_FRACTION = 0.9


def nccl_tests_findings(source: str, result: NcclTestsResult) -> list[IncidentFinding]:
    """Peak busbw, busbw at 1 GiB, sizes below the plateau after reaching it, wrong results."""
    peak = result.peak
    if peak is None:
        return []
    at_gib = result.row_at(GIB)
    ranks = result.nranks or result.inferred_nranks
    rows = result.rows
    ramp = next((r for r in rows if r.best_busbw >= PLATEAU_FRACTION * peak.best_busbw), peak)
    dips = [r for r in rows if r.size_bytes > ramp.size_bytes
            and r.best_busbw < PLATEAU_FRACTION * peak.best_busbw]
    short = [r.size_bytes for r in rows if r.best_busbw < PLATEAU_FRACTION * peak.best_busbw]
    wrong = result.wrong_total
    severity = Severity.INFO
    if dips:
        severity = Severity.WARNING
    if wrong or result.out_of_bounds:
        severity = Severity.CRITICAL
    ev = {
        "test": result.test, "ranks": ranks, "hosts": sorted({d.host for d in result.devices}),
        "peak_busbw_gbps": peak.best_busbw, "peak_size_bytes": peak.size_bytes,
        "busbw_1gib_gbps": at_gib.busbw if at_gib else None,
        "busbw_1gib_inplace_gbps": at_gib.inplace_busbw if at_gib else None,
        "avg_busbw_gbps": result.avg_busbw, "plateau_from_bytes": ramp.size_bytes,
        "short_of_peak_sizes": short, "dips_after_plateau": [r.size_bytes for r in dips],
        "wrong": wrong, "out_of_bounds": result.out_of_bounds, "sizes": len(rows),
    }
    gib_text = (f"{at_gib.busbw:g} GB/s at 1 GiB (in-place {at_gib.inplace_busbw:g})"
                if at_gib and at_gib.inplace_busbw is not None else
                f"{at_gib.busbw:g} GB/s at 1 GiB" if at_gib else "1 GiB not run")
    msg = (f"{result.test or 'nccl-tests'} on {ranks or '?'} ranks: peak busbw "
           f"{peak.best_busbw:g} GB/s at {_size(peak.size_bytes)}, {gib_text}; reaches "
           f"{PLATEAU_FRACTION:.0%} of peak from {_size(ramp.size_bytes)}")
    if dips:
        msg += f"; drops below it again at {', '.join(_size(r.size_bytes) for r in dips)}"
    if wrong:
        msg += f"; {wrong} WRONG results: data corruption on some rank"
    if result.avg_busbw is not None:
        msg += f" (the trailer's average {result.avg_busbw:g} GB/s is over all sizes)"
    return [IncidentFinding(source, "busbw", severity, result.test or "nccl-tests", ev, msg)]


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def inspector_findings(source: str, records: list[InspectorRecord],
                       streams: list[InspectorStream]) -> list[IncidentFinding]:
    """Bus bandwidth per communicator and op from NCCL Inspector records."""
    groups: dict[tuple, list[InspectorRecord]] = defaultdict(list)
    for r in records:
        groups[(r.comm_name or r.comm_id or "?", r.op, r.n_ranks, r.nnodes)].append(r)
    dropped = sum(s.dropped for s in streams)
    mismatched = sum(s.count_mismatches for s in streams)
    out = []
    for (comm, op, n_ranks, nnodes), rs in sorted(groups.items(), key=lambda kv: str(kv[0])):
        bw = [r.busbw_gbs for r in rs if r.busbw_gbs is not None]
        ranks = sorted({r.rank for r in rs if r.rank is not None})
        ev = {"comm": comm, "op": op, "n_ranks": n_ranks, "nnodes": nnodes, "ranks": ranks,
              "records": len(rs), "busbw_gbps_median": statistics.median(bw) if bw else None,
              "busbw_gbps_min": min(bw) if bw else None,
              "busbw_gbps_max": max(bw) if bw else None,
              "exec_time_us_max": max(r.exec_time_us for r in rs),
              "msg_size_bytes_max": max(r.msg_size_bytes for r in rs),
              "dropped_records": dropped, "marker_count_mismatches": mismatched,
              "hosts": sorted({r.hostname for r in rs if r.hostname})}
        out.append(IncidentFinding(
            source, "busbw", Severity.INFO, f"{op} on {comm}", ev,
            f"NCCL Inspector: {len(rs)} {op} on communicator {comm} ({ranks_text(ranks)} of "
            f"{n_ranks or '?'}): busbw median "
            f"{ev['busbw_gbps_median']} GB/s (min {ev['busbw_gbps_min']}, max "
            f"{ev['busbw_gbps_max']})"))
    return out


def inspector_prom_findings(source: str, exposition: Exposition) -> list[IncidentFinding]:
    """Bus bandwidth per op and size bucket from Inspector's Prometheus textfile."""
    times = {}
    for s in exposition.samples:
        if s.name.endswith("exec_time_microseconds"):
            op = s.labels.get("collective") or s.labels.get("p2p_operation") or "?"
            times[(op, s.labels.get("message_size"), s.labels.get("gpu"))] = s.value
    out = []
    for s in exposition.samples:
        if not s.name.endswith("bus_bandwidth_gbs"):
            continue
        op = s.labels.get("collective") or s.labels.get("p2p_operation") or "?"
        size, gpu = s.labels.get("message_size"), s.labels.get("gpu")
        out.append(IncidentFinding(
            source, "busbw", Severity.INFO, f"{op} {size} on {s.labels.get('node', '?')} {gpu}",
            {"op": op, "message_size": size, "busbw_gbps": s.value, "gpu": gpu,
             "exec_time_us": times.get((op, size, gpu)), "nranks": s.labels.get("nranks"),
             "comm_name": s.labels.get("comm_name"), "algo_proto": s.labels.get("algo_proto"),
             "node": s.labels.get("node")},
            f"NCCL Inspector: {op} of {size} on {s.labels.get('node', '?')} {gpu}: busbw "
            f"{s.value:g} GB/s, {times.get((op, size, gpu), '?')} us"))
    return out


# --------------------------------------------------------------------------- GPU state


#: Clock-event reasons that slow a busy GPU, with how bad each is.
_REASON_SEVERITY = {
    "hw_slowdown": Severity.CRITICAL, "hw_thermal": Severity.CRITICAL,
    "hw_power_brake": Severity.CRITICAL, "sw_thermal": Severity.WARNING,
    "sw_power_cap": Severity.WARNING, "sync_boost": Severity.INFO,
}


def clock_event_findings(source: str, gpus: list[SmiGpu]) -> list[IncidentFinding]:
    """One finding per GPU with a throttling clock-event reason active."""
    out = []
    for gpu in gpus:
        active = gpu.active_reasons
        slowing = [r for r in active if r in _REASON_SEVERITY]
        if not slowing:
            continue
        severity = min((_REASON_SEVERITY[r] for r in slowing), key=_RANK_ORDER.__getitem__)
        name = gpu.pci_bus_id or "(bus id not in the excerpt)"
        ev = {"pci_bus_id": gpu.pci_bus_id, "product": gpu.product_name, "reasons": slowing,
              "active": active, "sm_clock_mhz": gpu.sm_clock_mhz,
              "sm_clock_max_mhz": gpu.sm_clock_max_mhz, "temperature_c": gpu.temperature_c,
              "power_draw_w": gpu.power_draw_w, "power_limit_w": gpu.power_limit_w,
              "performance_state": gpu.performance_state}
        state = ", ".join(x for x in (
            f"SM {gpu.sm_clock_mhz:g} of {gpu.sm_clock_max_mhz:g} MHz"
            if gpu.sm_clock_mhz is not None and gpu.sm_clock_max_mhz else None,
            f"{gpu.temperature_c:g} C" if gpu.temperature_c is not None else None,
            f"{gpu.power_draw_w:g} W of {gpu.power_limit_w:g} W"
            if gpu.power_draw_w is not None and gpu.power_limit_w else None) if x)
        note = ""
        if gpu.sm_clock_mhz and gpu.sm_clock_max_mhz and gpu.sm_clock_mhz >= gpu.sm_clock_max_mhz:
            note = "; the SM clock is at its maximum, so the flags contradict the clocks " \
                   "(reported as printed)"
        out.append(IncidentFinding(
            source, "clock_event", severity, f"GPU {name}", ev,
            f"GPU {name}{' (' + gpu.product_name + ')' if gpu.product_name else ''}: clock "
            f"event reasons active: {', '.join(slowing)}{'; ' + state if state else ''}{note}"))
    return out


def dcgm_findings(source: str, gpus: list[DcgmGpu]) -> list[IncidentFinding]:
    """Xids and clock-event reasons that dcgm-exporter reported."""
    out = []
    for g in gpus:
        name = g.pci_bus_id or f"{g.gpu}" + (f" ({g.uuid})" if g.uuid else "")
        xid = g.get("last_xid")
        if xid:
            info = xid_catalog.lookup(int(xid))
            pci = _short_pci(g.pci_bus_id) if g.pci_bus_id else None
            out.append(IncidentFinding(
                source, "xid", info.severity, f"GPU {pci or name}",
                {"xid": int(xid), "name": info.name, "pci_bus_id": pci, "count": 1,
                 "gpu": g.gpu, "uuid": g.uuid, "action": info.action.value,
                 "note": "DCGM_FI_DEV_XID_ERRORS holds the last Xid, not a count"},
                f"DCGM reports Xid {int(xid)} ({info.name}) on GPU {name}; action: "
                f"{info.action.value.replace('_', ' ')}"))
        mask = g.get("clock_event_reasons")
        if mask:
            smi = SmiGpu(pci_bus_id=g.pci_bus_id or f"index {g.gpu}",
                         reasons=reasons_from_bitmask(int(mask)),
                         temperature_c=g.get("temperature_c"), power_draw_w=g.get("power_w"),
                         sm_clock_mhz=g.get("sm_clock_mhz"))
            out += clock_event_findings(source, [smi])
    return out


def _short_pci(pci: str) -> str:
    # "00000000:75:00.0" -> "0000:75:00"
    parts = pci.lower().split(":")
    if len(parts) == 3:
        return f"{parts[0][-4:]}:{parts[1]}:{parts[2].split('.')[0]}"
    return pci.lower()


# --------------------------------------------------------------------------- network


def ib_findings(source: str, ports: list[IbPort]) -> list[IncidentFinding]:
    """Ports down (critical), links that went down (warning), other error counters (info)."""
    out = []
    for p in ports:
        errors = p.errors
        down = p.is_up is False
        if not down and not errors:
            continue
        severity = (Severity.CRITICAL if down else Severity.WARNING if errors.get("link_downed")
                    else Severity.INFO)
        ev = {"device": p.device, "port": p.port, "state": p.state, "phys_state": p.phys_state,
              "rate": p.rate, "link_layer": p.link_layer, "errors": errors,
              "port_xmit_wait": p.counters.get("port_xmit_wait"),
              "port_rcv_data_bytes": p.counters["port_rcv_data"] * 4
              if "port_rcv_data" in p.counters else None}
        parts = []
        if down:
            parts.append(f"port is {p.state or '?'}/{p.phys_state or '?'}")
        if errors.get("link_downed"):
            n = errors["link_downed"]
            parts.append(f"link went down {n} time(s)"
                         + (" (the 8-bit counter is saturated)" if n == 255 else ""))
        rest = {k: v for k, v in errors.items() if k != "link_downed"}
        if rest:
            parts.append("error counters " + ", ".join(f"{k}={v}" for k, v in rest.items()))
        out.append(IncidentFinding(
            source, "ib_port", severity, f"{p.device} port {p.port}", ev,
            f"{p.device} port {p.port} ({p.rate or 'rate ?'}, {p.link_layer or '?'}): "
            + "; ".join(parts)
            + ("; reseat or replace the cable/transceiver and check the switch port"
               if severity is not Severity.INFO else "")))
    return out


_NETDEV_FAULTS = ("errs", "fifo", "frame", "carrier", "colls")


def netdev_findings(source: str, devices: dict[str, dict[str, int]],
                    taken_at: str | None = None) -> list[IncidentFinding]:
    """Interfaces with errors (warning) or drops (info) in ``/proc/net/dev``."""
    out = []
    for dev, c in sorted(devices.items()):
        faults = {k: v for k, v in c.items() if v and any(k.endswith("_" + f)
                                                         for f in _NETDEV_FAULTS)}
        drops = {k: v for k, v in c.items() if v and k.endswith("_drop")}
        if not faults and not drops:
            continue
        ev = {"device": dev, **{k: v for k, v in c.items()
                                if k.split("_", 1)[1] in ("bytes", "packets", "errs", "drop",
                                                          "multicast", "fifo", "frame")},
              "taken_at": taken_at}
        what = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in {**faults, **drops}.items())
        out.append(IncidentFinding(
            source, "netdev", Severity.WARNING if faults else Severity.INFO, dev, ev,
            f"{dev}: {what} (counters since boot"
            f"{', snapshot ' + taken_at if taken_at else ''})"))
    return out
