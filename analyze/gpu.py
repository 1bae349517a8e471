"""``laggard analyze`` rules for GPUs: Xids and SXids from kernel logs (with NVIDIA's catalog
severity and action), lost GPUs, clock-event reasons from nvidia-smi and dcgm-exporter."""

from __future__ import annotations

import datetime
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from laggard.analyze.findings import (
    SEVERITY_ORDER,
    incident,
)
from laggard.detectors import xid_catalog
from laggard.detectors.finding import Finding, Severity
from laggard.parsers.kernel_log import SXidEvent, XidEvent
from laggard.parsers.nvidia_smi import SmiGpu, reasons_from_bitmask

if TYPE_CHECKING:  # a type only: the exposition parser imports prometheus_client (~0.1 s)
    from laggard.parsers.exposition import DcgmGpu

#: Most distinct pids/processes listed per Xid group.
MAX_LISTED = 10

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
    """Xid/SXid events of one kernel log, aggregated as they stream in (bounded memory).

    Keys carry the host the line names (``""`` where it names none: plain ``dmesg``): an
    aggregated log's two hosts with a GPU at the same bus id are two GPUs.

    Attributes:
        xids: ``(xid, host, pci_bus_id)`` -> the group's counts, times, processes, messages.
        sxids: ``(sxid, host, switch pci_bus_id)`` -> counts, links, severity, device.
        rm_init_failures: ``(host, pci_bus_id with function)`` -> count and codes.
        uuids: ``(host, pci_bus_id)`` -> GPU UUID, where the log prints it.
    """

    xids: dict[tuple[int, str, str], _XidGroup] = field(default_factory=dict)
    sxids: dict[tuple[int, str, str], dict[str, Any]] = field(default_factory=dict)
    rm_init_failures: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    uuids: dict[tuple[str, str], str] = field(default_factory=dict)

    def add(self, event: XidEvent | SXidEvent) -> None:
        """Count one parser event."""
        host = event.host or ""
        if isinstance(event, XidEvent):
            group = self.xids.setdefault((event.xid, host, event.pci_bus_id), _XidGroup())
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
        key = (event.sxid, host, event.pci_bus_id)
        sx = self.sxids.setdefault(key, {"count": 0, "links": [], "severity": None,
                                         "device": event.device, "message": event.message,
                                         "uptime": event.uptime_seconds})
        sx["count"] += 1
        if event.link is not None and len(sx["links"]) < 64:
            sx["links"].append(event.link)
        sx["severity"] = sx["severity"] or event.severity

    def add_line(self, line: str, host: str | None = None) -> None:
        """Look at one raw line for what the Xid parser does not report: RmInitAdapter
        failures, and the ``NVRM: GPU at PCI:... GPU-<uuid>`` line printed before an Xid.

        Args:
            line: the raw line.
            host: the host it names (``KernelLogParser.host`` after feeding it), if any.
        """
        if "GPU at PCI:" in line and (u := _GPU_UUID.search(line)):
            if len(self.uuids) < 1024:
                self.uuids[(host or "", u["pci"].lower())] = u["uuid"]
        if "RmInitAdapter" in line and (m := _RM_INIT.search(line)):
            if len(self.rm_init_failures) >= 1024:
                return
            entry = self.rm_init_failures.setdefault((host or "", m["pci"].lower()),
                                                     {"count": 0, "codes": []})
            entry["count"] += 1
            if m["code"] not in entry["codes"]:
                entry["codes"].append(m["code"])


def _iso(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    return datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).isoformat(
        timespec="seconds")


def gpu_name(host: str | None, pci: str) -> str:
    """What a report calls one GPU: ``gpu-node-07 GPU 0000:3b:00``, or ``GPU 0000:3b:00`` where
    the input names no host."""
    return f"{host} GPU {pci}" if host else f"GPU {pci}"


def kernel_findings(source: str, evidence: KernelEvidence) -> list[Finding]:
    """Xid groups (by code, host and GPU), SXid groups (by code, host and switch), lost GPUs.

    Each finding's ``node`` and ``evidence["host"]`` are the host the lines name (None where
    they name none), and its subject and message name it before the GPU.
    """
    out = []
    for (xid, host, pci), g in sorted(evidence.xids.items()):
        info = xid_catalog.lookup(xid, g.messages[0] if g.messages else "", g.fatal_token)
        pids = [{"pid": pid, "process": proc, "count": n}
                for (pid, proc), n in g.pids.most_common()]
        known = [p for p in pids if p["pid"] is not None or p["process"] is not None]
        ev: dict[str, Any] = {
            "xid": xid, "name": info.name, "pci_bus_id": pci, "count": g.count,
            "action": info.action.value, "first": _iso(g.first), "last": _iso(g.last),
            "first_uptime_seconds": g.first_uptime, "last_uptime_seconds": g.last_uptime,
            "messages": g.messages, "host": host or None,
        }
        if (host, pci) in evidence.uuids:
            ev["uuid"] = evidence.uuids[(host, pci)]
        if known:
            ev["pid"] = known[0]["pid"]
            ev["process"] = known[0]["process"]
            ev["processes"] = known
        who = "; ".join(f"{p['process'] or '?'} (pid {p['pid'] if p['pid'] is not None else '?'})"
                        f"{' x' + str(p['count']) if p['count'] > 1 else ''}" for p in known)
        out.append(incident(
            source=source, kind="xid", severity=info.severity,
            subject=gpu_name(host, pci), node=host or None,
            evidence=ev,
            message=f"{g.count}x Xid {xid} ({info.name}: {info.description}) on "
            f"{gpu_name(host, pci)}"
            f"{', ' + who if who else ''}; action: {info.action.value.replace('_', ' ')}"))
        if xid == 79:
            out.append(_gpu_lost(source, host, pci, "fell off the bus (Xid 79)",
                                 {"xid": 79, "count": g.count}))
    for (sxid, host, pci), sx in sorted(evidence.sxids.items()):
        info = xid_catalog.sxid_lookup(sxid, sx["severity"])
        links = sorted(set(sx["links"]))
        said = sx["severity"] or f"no severity printed; {info.catalog_class} per the catalog"
        on_host = f"{host} " if host else ""
        out.append(incident(
            source=source, kind="sxid", severity=info.severity,
            subject=f"{on_host}NVSwitch {pci}", node=host or None,
            evidence={"sxid": sxid, "name": info.name, "pci_bus_id": pci,
                      "device": sx["device"], "count": sx["count"], "links": links,
                      "severity": sx["severity"], "catalog_class": info.catalog_class,
                      "message": sx["message"], "host": host or None},
            message=f"{sx['count']}x SXid {sxid} ({info.name}; {said}) on "
                    f"{on_host}{sx['device'] or 'NVSwitch'} {pci}"
                    f"{', link ' + ', '.join(map(str, links)) if links else ''}: "
                    f"{sx['message']}; {info.action}"))
    for (host, pci), entry in sorted(evidence.rm_init_failures.items()):
        out.append(_gpu_lost(source, host, pci[:-2] if pci.count(".") else pci,
                             f"failed to initialise ({entry['count']}x RmInitAdapter failed, "
                             f"{', '.join(entry['codes'])})",
                             {"rm_init_adapter_failures": entry["count"],
                              "codes": entry["codes"], "pci_bus_id_full": pci}))
    return out


def _gpu_lost(source: str, host: str, pci: str, what: str, ev: dict[str, Any]) -> Finding:
    return incident(
        source=source, kind="gpu_lost", severity=Severity.CRITICAL,
        subject=gpu_name(host, pci), node=host or None,
        evidence={"pci_bus_id": pci, **ev, "host": host or None},
        message=f"{gpu_name(host, pci)} {what}: it is unusable until the node is rebooted or "
                f"the GPU reset; drain the node and check the PCIe link, power and the GPU")


#: Clock-event reasons that slow a busy GPU, with how bad each is.
_REASON_SEVERITY = {
    "hw_slowdown": Severity.CRITICAL, "hw_thermal": Severity.CRITICAL,
    "hw_power_brake": Severity.CRITICAL, "sw_thermal": Severity.WARNING,
    "sw_power_cap": Severity.WARNING, "sync_boost": Severity.INFO,
}


def clock_event_findings(source: str, gpus: list[SmiGpu]) -> list[Finding]:
    """One finding per GPU with a throttling clock-event reason active."""
    out = []
    for gpu in gpus:
        active = gpu.active_reasons
        slowing = [r for r in active if r in _REASON_SEVERITY]
        if not slowing:
            continue
        severity = min((_REASON_SEVERITY[r] for r in slowing), key=SEVERITY_ORDER.__getitem__)
        # The kernel log's DDDD:BB:DD form, so one GPU has one name across every file of a
        # report; the form nvidia-smi printed is kept beside it.
        short = _short_pci(gpu.pci_bus_id) if gpu.pci_bus_id else None
        name = short or "(bus id not in the excerpt)"
        ev = {"pci_bus_id": short, "pci_bus_id_full": gpu.pci_bus_id,
              "product": gpu.product_name, "reasons": slowing,
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
        out.append(incident(
            source=source, kind="clock_event", severity=severity,
            subject=f"GPU {name}",
            evidence=ev,
            message=f"GPU {name}{' (' + gpu.product_name + ')' if gpu.product_name else ''}: clock "
            f"event reasons active: {', '.join(slowing)}{'; ' + state if state else ''}{note}"))
    return out


def dcgm_findings(source: str, gpus: list[DcgmGpu]) -> list[Finding]:
    """Xids and clock-event reasons that dcgm-exporter reported."""
    out = []
    for g in gpus:
        name = g.pci_bus_id or f"{g.gpu}" + (f" ({g.uuid})" if g.uuid else "")
        xid = g.get("last_xid")
        if xid:
            info = xid_catalog.lookup(int(xid))
            pci = _short_pci(g.pci_bus_id) if g.pci_bus_id else None
            out.append(incident(
                source=source, kind="xid", severity=info.severity,
                subject=f"GPU {pci or name}",
                evidence={"xid": int(xid), "name": info.name, "pci_bus_id": pci, "count": 1,
                 "gpu": g.gpu, "uuid": g.uuid, "action": info.action.value,
                 "note": "DCGM_FI_DEV_XID_ERRORS holds the last Xid, not a count"},
                message=f"DCGM reports Xid {int(xid)} ({info.name}) on GPU {name}; action: "
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
