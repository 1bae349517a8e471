"""``laggard analyze`` rules for flight-recorder dumps (matched across ranks by
:mod:`laggard.detectors.flight_recorder`) and for ``torchfrtrace``'s printed report."""

from __future__ import annotations

from typing import Any

from laggard.analyze.findings import incident, location_host, ranks_text
from laggard.detectors.finding import Finding, Severity
from laggard.detectors.flight_recorder import (
    FrAnalysis,
    LaggingCollective,
    P2PStall,
    StuckCollective,
)
from laggard.parsers.flight_recorder import FrTraceIssue

_HUNG_CPU = ("no pending work in the group (last enqueued = last completed): its host side "
             "stopped issuing collectives (a Python thread holding the GIL, a data-loader or "
             "I/O stall, a rank stuck outside collectives); py-spy dump its process")


def _group(pg: str, desc: str) -> str:
    return f"PG {pg} ({desc})" if desc else f"PG {pg}"


def _shape(sizes: tuple[tuple[int, ...], ...], dtypes: tuple[str, ...]) -> str:
    shape = " x ".join("x".join(map(str, s)) for s in sizes) or "?"
    return f"{shape} {', '.join(dtypes) or '?'}"


def fr_findings(source: str, analysis: FrAnalysis, locations: dict[int, str]) -> list[Finding]:
    """Findings from dumps matched across ranks: ranks missing from a collective (hung on the
    CPU or not), ranks stuck in one on the device, point-to-point pairs that stall, desyncs."""
    out = [_lagging_finding(source, lag, analysis, locations, primary=i == 0)
           for i, lag in enumerate(analysis.lagging)]
    out += [_stuck_finding(source, st, locations) for st in analysis.stuck]
    out += [_p2p_finding(source, stall, analysis.verdict.kind_of(stall.stalled))
            for stall in analysis.p2p]
    out += [_silent_finding(source, c.rank) for c in analysis.verdict.culprits
            if c.kind == "silent" and not c.group]
    if analysis.verdict.undetermined:
        out.append(_undetermined_finding(source, analysis))
    for mm in analysis.mismatches:
        parts = "; ".join(f"{ranks_text(r)}: {s[0]} {s[1:] if len(s) > 1 else ''}"
                          for s, r in mm.signatures.items())
        out.append(incident(
            source=source, kind="collective_mismatch", severity=Severity.CRITICAL,
            subject=f"PG {mm.pg} seq {mm.seq}",
            evidence={"pg": mm.pg, "pg_desc": mm.pg_desc, "seq": mm.seq,
                      "signatures": [{"signature": repr(s), "ranks": list(r)}
                                     for s, r in mm.signatures.items()]},
            message=f"collective #{mm.seq} of {_group(mm.pg, mm.pg_desc)} has different ops, "
                    f"sizes or dtypes across ranks ({parts[:300]}): a desync, not a slow rank"))
    return out


def _lagging_finding(source: str, lag: LaggingCollective, analysis: FrAnalysis,
                     locations: dict[int, str], primary: bool) -> Finding:
    stragglers = list(analysis.stragglers)
    kinds = {r: analysis.verdict.kind_of(r) for r in lag.missing}
    verdicts = {str(r): "hung_cpu" if r in lag.hung_cpu else
                "skipped" if r in lag.skipped else
                "no_dump" if r in lag.no_dump else
                "device" if kinds[r] == "device" else "missing" for r in lag.missing}
    device = [r for r in lag.missing if kinds[r] == "device"]
    ev: dict[str, Any] = {
        "op": lag.op, "seq": lag.seq, "pg": lag.pg, "pg_desc": lag.pg_desc,
        "members": list(lag.members), "present": list(lag.present),
        "missing_ranks": list(lag.missing), "not_enqueued": list(lag.not_enqueued),
        "no_dump": list(lag.no_dump), "unknown": list(lag.unknown),
        "hung_cpu": list(lag.hung_cpu), "trailing": list(lag.trailing), "verdicts": verdicts,
        "skipped": list(lag.skipped),
        "kinds": {str(r): k for r, k in kinds.items()},
        "input_sizes": [list(s) for s in lag.input_sizes],
        "input_dtypes": list(lag.input_dtypes), "state": list(lag.state),
        "last_enqueued": {str(r): s[0] for r, s in sorted(lag.status.items())},
        "last_completed": {str(r): s[1] for r, s in sorted(lag.status.items())},
    }
    if primary:
        ev["likely_stragglers"] = stragglers
        ev["lagging_pgs"] = [x.pg for x in analysis.lagging]
    if any(r in locations for r in lag.missing):
        ev["locations"] = {str(r): locations[r] for r in lag.missing if r in locations}
    missing_status = ", ".join(f"rank {r} enq {lag.status[r][0]}/comp {lag.status[r][1]}"
                               for r in lag.missing if r in lag.status)
    what = (f"{lag.op} #{lag.seq} ({_shape(lag.input_sizes, lag.input_dtypes)})"
            if lag.op != "?" else f"collective #{lag.seq} (its entry left every ring buffer)")
    issued = ranks_text(lag.present) if lag.present else "the other members"
    msg = (f"{what} of {_group(lag.pg, lag.pg_desc)} was issued by {issued} but never by "
           f"{ranks_text(lag.missing)}" + (f" ({missing_status})" if missing_status else "")
           + (f"; no dump from {ranks_text(lag.no_dump)}: stopped or dead (its process "
              f"wrote nothing)" if lag.no_dump else ""))
    if lag.hung_cpu:
        msg += f"; {ranks_text(lag.hung_cpu)} has {_HUNG_CPU}"
    if lag.skipped:
        one = len(lag.skipped) == 1
        msg += (f"; {ranks_text(lag.skipped)} went past it without issuing it (it waits in a "
                f"later collective of another group, which the ranks waiting here never reach): "
                f"{'it' if one else 'they'} skipped it")
    if device:
        msg += (f"; {ranks_text(device)} {'is' if len(device) == 1 else 'are'} stuck on the "
                f"device: work {'its' if len(device) == 1 else 'their'} peers completed is "
                f"still pending there")
    if primary and stragglers:
        one = len(stragglers) == 1
        msg += (f". {ranks_text(stragglers).capitalize()} {'lags' if one else 'lag'} in "
                f"{len(analysis.lagging)} process group(s) "
                f"({', '.join(x.pg for x in analysis.lagging)}): "
                f"{'it is the likely straggler' if one else 'they are the likely stragglers'}; "
                f"look at {'its' if one else 'their'} "
                f"{('GPU and host' if one else 'GPUs and hosts') if analysis.device else 'process'}"
                f" first")
    return incident(
        source=source, kind="collective_timeout",
        severity=Severity.CRITICAL if primary else Severity.WARNING,
        subject=ranks_text(lag.missing), evidence=ev, message=msg,
        node=location_host(ev.get("locations", {})))


def _stuck_finding(source: str, st: StuckCollective, locations: dict[int, str]) -> Finding:
    ev: dict[str, Any] = {
        "op": st.op, "seq": st.seq, "pg": st.pg, "pg_desc": st.pg_desc,
        "members": list(st.members), "stuck_ranks": list(st.stuck),
        "completed_by": list(st.completed_by), "state": list(st.state),
        "input_sizes": [list(s) for s in st.input_sizes], "input_dtypes": list(st.input_dtypes),
        "last_enqueued": {str(r): s[0] for r, s in sorted(st.status.items())},
        "last_completed": {str(r): s[1] for r, s in sorted(st.status.items())},
    }
    if any(r in locations for r in st.stuck):
        ev["locations"] = {str(r): locations[r] for r in st.stuck if r in locations}
    status = ", ".join(f"rank {r} enq {st.status[r][0]}/comp {st.status[r][1]}" for r in st.stuck)
    return incident(
        source=source, kind="collective_stuck", severity=Severity.CRITICAL,
        subject=ranks_text(st.stuck), evidence=ev, node=location_host(ev.get("locations", {})),
        message=f"{st.op} #{st.seq} ({_shape(st.input_sizes, st.input_dtypes)}) of "
                f"{_group(st.pg, st.pg_desc)} was completed by {ranks_text(st.completed_by)} "
                f"but is still running on {ranks_text(st.stuck)} ({status}): stuck on the "
                f"device (a GPU fault or a hung NCCL kernel), not a slow host; look for Xids "
                f"on its node")


def _p2p_finding(source: str, stall: P2PStall, kind: str | None) -> Finding:
    """A stalled pair. ``kind``: how the rules name the stalled rank (a rank stuck on the device
    in another group never posts its side either: that is the cause to say)."""
    side = "receive" if stall.stalled == stall.receiver else "send"
    why = (f"which never posted the matching {side}: it is stuck on the device (work its "
           f"peers completed is pending there)" if kind == "device"
           else f"which never posted the matching {side}")
    return incident(
        source=source, kind="p2p_stall", severity=Severity.CRITICAL,
        subject=f"rank {stall.stalled}",
        evidence={"pg": stall.pg, "pg_desc": stall.pg_desc, "sender": stall.sender,
                  "receiver": stall.receiver, "sends": stall.sends, "recvs": stall.recvs,
                  "waiting": stall.waiting, "stalled": stall.stalled, "op": stall.op,
                  "input_sizes": [list(s) for s in stall.input_sizes],
                  "input_dtypes": list(stall.input_dtypes)},
        message=f"point-to-point {stall.sender} -> {stall.receiver} in "
                f"{_group(stall.pg, stall.pg_desc)}: {stall.sends} send(s) against "
                f"{stall.recvs} receive(s); rank {stall.waiting} waits in {stall.op} "
                f"({_shape(stall.input_sizes, stall.input_dtypes)}; the op as recorded, in "
                f"group ranks) for rank {stall.stalled}, {why}")


def _undetermined_finding(source: str, analysis: FrAnalysis) -> Finding:
    """Ranks blocked outside every recorded collective in groups that carry send/recv the
    dumps do not list (gloo): who waits on whom cannot be told, and nobody is named."""
    verdict = analysis.verdict
    ranks = list(verdict.undetermined)
    one = len(ranks) == 1
    waiting = [r for r in verdict.waiting if r not in ranks]
    return incident(
        source=source, kind="p2p_stall", severity=Severity.WARNING,
        subject="send/recv not recorded",  # the blocked ranks are not the culprits: no subject
        evidence={"ranks": ranks, "waiting": waiting, "reason": "p2p_not_recorded"},
        message=f"{ranks_text(ranks).capitalize()} {'has' if one else 'have'} no recorded "
                f"collective pending and {'does' if one else 'do'} send/recv that the dumps do "
                f"not record (gloo records no point-to-point operation)"
                + (f"; {ranks_text(waiting)} wait{'s' if len(waiting) == 1 else ''} on "
                   f"{'it' if one else 'them'}" if waiting else "")
                + f": {'it' if one else 'they'} may wait in a receive whose send never came "
                  f"(or a send nobody receives), or be stopped outside communication; which "
                  f"peer did not post its side cannot be told from these dumps, so no rank is "
                  f"named (py-spy dump {'its' if one else 'their'} process)")


def _silent_finding(source: str, rank: int) -> Finding:
    return incident(
        source=source, kind="rank_silent", severity=Severity.WARNING, subject=f"rank {rank}",
        evidence={"rank": rank, "kind": "silent"},
        message=f"rank {rank} is a member of the job but left no dump: its state is unknown "
                f"(a process that died, or a dump that was not written)")


def fr_report_findings(source: str, issues: list[FrTraceIssue]) -> list[Finding]:
    """Findings from torchfrtrace's printed report."""
    out = []
    for issue in issues:
        if issue.kind == "not_all_joined":
            missing = ranks_text(issue.missing_ranks)
            out.append(incident(
                source=source, kind="collective_timeout", severity=Severity.CRITICAL,
                subject=missing,
                evidence={"collective": issue.collective, "entry": issue.entry,
                          "group": issue.group, "op": issue.op,
                          "missing_ranks": list(issue.missing_ranks),
                          "expected_ranks": issue.expected_ranks,
                          "input_sizes": issue.input_sizes, "state": issue.state},
                message=f"collective {issue.collective} ({issue.op}, group {issue.group}) was "
                        f"not joined by {missing} of {issue.expected_ranks}: {missing} never "
                        f"reached it (state {issue.state}); "
                        f"{'it is' if len(issue.missing_ranks) == 1 else 'they are'} the "
                        f"culprit"))
        else:
            out.append(incident(
                source=source, kind="collective_mismatch", severity=Severity.CRITICAL,
                subject="collective", evidence={"detail": issue.detail},
                message=f"torchfrtrace: {issue.detail}"))
    return out
