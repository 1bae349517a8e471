"""``laggard analyze`` rules for links and bandwidth: nccl-tests and NCCL Inspector bus bandwidth,
InfiniBand ports, network interfaces."""

from __future__ import annotations

import statistics
from collections import defaultdict

from laggard.analyze.findings import (
    incident,
    ranks_text,
)
from laggard.detectors.finding import Finding, Severity
from laggard.parsers.exposition import Exposition
from laggard.parsers.infiniband_listing import IbPort
from laggard.parsers.nccl_inspector import InspectorRecord, InspectorStream
from laggard.parsers.nccl_tests import GIB, NcclTestsResult

#: A size counts as "at the plateau" once busbw reaches this share of the peak.
PLATEAU_FRACTION = 0.9


def nccl_tests_findings(source: str, result: NcclTestsResult) -> list[Finding]:
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
    return [incident(
        source=source, kind="busbw", severity=severity,
        subject=result.test or "nccl-tests",
        evidence=ev,
        message=msg)]


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def inspector_findings(source: str, records: list[InspectorRecord],
                       streams: list[InspectorStream]) -> list[Finding]:
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
        out.append(incident(
            source=source, kind="busbw", severity=Severity.INFO,
            subject=f"{op} on {comm}",
            evidence=ev,
            message=f"NCCL Inspector: {len(rs)} {op} on communicator {comm} "
                    f"({ranks_text(ranks)} of "
            f"{n_ranks or '?'}): busbw median "
            f"{ev['busbw_gbps_median']} GB/s (min {ev['busbw_gbps_min']}, max "
            f"{ev['busbw_gbps_max']})"))
    return out


def inspector_prom_findings(source: str, exposition: Exposition) -> list[Finding]:
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
        out.append(incident(
            source=source, kind="busbw", severity=Severity.INFO,
            subject=f"{op} {size} on {s.labels.get('node', '?')} {gpu}",
            evidence={"op": op, "message_size": size, "busbw_gbps": s.value, "gpu": gpu,
             "exec_time_us": times.get((op, size, gpu)), "nranks": s.labels.get("nranks"),
             "comm_name": s.labels.get("comm_name"), "algo_proto": s.labels.get("algo_proto"),
             "node": s.labels.get("node")},
            message=f"NCCL Inspector: {op} of {size} on {s.labels.get('node', '?')} {gpu}: busbw "
            f"{s.value:g} GB/s, {times.get((op, size, gpu), '?')} us"))
    return out


def ib_findings(source: str, ports: list[IbPort]) -> list[Finding]:
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
        out.append(incident(
            source=source, kind="ib_port", severity=severity,
            subject=f"{p.device} port {p.port}",
            evidence=ev,
            message=f"{p.device} port {p.port} ({p.rate or 'rate ?'}, {p.link_layer or '?'}): "
            + "; ".join(parts)
            + ("; reseat or replace the cable/transceiver and check the switch port"
               if severity is not Severity.INFO else "")))
    return out


_NETDEV_FAULTS = ("errs", "fifo", "frame", "carrier", "colls")


def netdev_findings(source: str, devices: dict[str, dict[str, int]],
                    taken_at: str | None = None) -> list[Finding]:
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
        out.append(incident(
            source=source, kind="netdev", severity=Severity.WARNING if faults else Severity.INFO,
            subject=dev,
            evidence=ev,
            message=f"{dev}: {what} (counters since boot"
            f"{', snapshot ' + taken_at if taken_at else ''})"))
    return out
