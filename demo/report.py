"""The text and JSON report of ``laggard demo``: per-rank medians, findings as sentences, the
injected slowdown beside the measured one. Pure functions of rank 0's result document."""

from __future__ import annotations

import argparse
import math
from typing import Any

from laggard.detectors.window import STEP_COLUMN_NAMES, WindowRecord

__all__ = ["build_report", "cause_line", "cause_outcomes", "detector_compute_slowdown",
           "finding_events", "format_report", "injected_line", "injected_shapes", "node_line",
           "percent", "shape_lines", "summary_lines", "windows_file_line"]


def build_report(result: dict[str, Any], args: argparse.Namespace,
                 metrics_url: str) -> dict[str, Any]:
    """The demo's report from rank 0's result (see ``laggard.demo.worker.result_of``).

    Per-rank values are medians over the detection windows that lie wholly after ``slow_from``
    (all windows when none does) of each window's per-rank median.

    Returns:
        A JSON-serialisable dict: ``world_size``, ``steps``, ``injected``, ``findings``,
        ``ranks``, ``loss``, ``metrics_url``, and ``comm`` (job medians per step: ``bytes``
        sent per rank, ``collective_seconds``, ``exposed_seconds``, ``hidden_seconds``).
    """
    windows = result["windows"]
    # On the device clock a window's timing columns describe the window before it (its events
    # are read one window late): a window counts as slowed only if that one was, too.
    late = args.window if result.get("phase_clock") == "device" else 0
    after = [w for w in windows if w["step"] - args.window - late + 1 >= args.slow_from]
    chosen = after or windows
    stat_names = result.get("stat_names", list(STEP_COLUMN_NAMES))
    records = [WindowRecord.from_saved({**w, "stat_names": stat_names}) for w in chosen]
    names = ("compute_seconds", "collective_wait_seconds", "data_seconds", "step_seconds",
             "collective_seconds", "comm_bytes", "p2p_wait_seconds", "gc_seconds", "tokens",
             *CLOCK_COLUMNS)
    ranks = []
    for rank in range(result["world_size"]):
        def median(name: str, rank: int = rank) -> float | None:
            if name not in stat_names:  # a column this monitor does not have
                return None
            return _median([float(r[name][rank]) for r in records])

        ranks.append({"rank": rank, **{f"{name}_median": median(name) for name in names}})
    findings = [
        {**{key: f.get(key) for key in
            ("detector", "kind", "rank", "step", "severity", "evidence", "message")},
         # what a rank-less finding (a pipeline stage) is about
         **({"subject": f["subject"]} if f.get("subject") else {})}
        for f in result["findings"]
    ]
    groups = _peer_groups(result, findings)
    for r in ranks:
        r["peer_group"] = _group_name(groups, r["rank"])
    slow_ranks = _slow_ranks(args)
    report = {
        "world_size": result["world_size"],
        "steps": result["steps"],
        "injected": {"rank": slow_ranks[0] if slow_ranks else None, "slowdown": args.slowdown,
                     "from_step": args.slow_from,
                     "measured_slowdown": _measured_slowdown(ranks, args)},
        "findings": findings,
        "ranks": ranks,
        "loss": result["loss"],
        "metrics_url": metrics_url,
        "comm": _comm(ranks, result.get("fp32_allreduce_bytes"), args.compression),
        "parallel": result.get("parallel", "ddp"),
        "prefetch": result.get("prefetch", True),
        "step_comm": result.get("step_comm", {}),
        "table_from_step": chosen[0]["step"] - args.window + 1 if chosen else 0,
        "device": result.get("device", "cpu"),
        "phase_clock": result.get("phase_clock"),
        "device_clock": result.get("device_clock"),
        "clocks": _clocks(ranks, result.get("phase_clock")),
        # findings that ended during the run (the detector's "cleared" findings)
        "cleared": [{"detector": f.get("detector"), "kind": f.get("kind"),
                     "rank": f.get("rank"), "step": f.get("step")}
                    for f in result.get("cleared", [])],
        "windows_file": _windows_file(result, args),
        "peer_groups": groups,
        "injections": list(result.get("injections") or []),
    }
    if args.slowdown > 1.0:  # against its own peer group, as the table says
        report["injected"]["measured_slowdown"] = _rank_excess(report, slow_ranks[0])
        report["injected"]["measured_slowdowns"] = {
            str(r): _rank_excess(report, r) for r in slow_ranks}
    report["finding_events"] = finding_events(result)
    report["nodes"] = _placement(result, args)
    report["rank_nodes"] = list(result.get("rank_nodes") or [])  # as the windows carried them
    report["injected"].update(injected_shapes(result, args, report["finding_events"]))
    report["causes"] = cause_outcomes(report)
    return report


def _slow_ranks(args: argparse.Namespace) -> list[int]:
    """``--slow-rank`` as a list (an int, a list, or the flag's text ``1,3``)."""
    from laggard.demo.injections import parse_slow_ranks

    value = getattr(args, "slow_rank", None)
    return [] if value is None else parse_slow_ranks(value)


# ------------------------------------------------------------ shapes of a slowness (issue 33)
#: Steps at the start of a run left out of a rank's baseline (its first steps allocate).
WARMUP_STEPS = 3


def finding_events(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Every finding raised or cleared during the run, in step order: ``event`` (``raised`` or
    ``cleared``), ``step``, ``rank``, ``node``, ``kind``, ``detector`` (what a benchmark scores
    a run by)."""
    events = [{"event": "cleared" if cleared else "raised", "step": f.get("step"),
               "rank": f.get("rank"), "node": f.get("node"), "kind": f.get("kind"),
               "detector": f.get("detector")}
              for cleared, found in ((False, result.get("findings") or []),
                                     (True, result.get("cleared") or []))
              for f in found]
    return sorted(events, key=lambda e: -1 if e["step"] is None else e["step"])


def _placement(result: dict[str, Any], args: argparse.Namespace) -> dict[str, list[int]] | None:
    """The emulated nodes' ranks, ``{name: [rank, ...]}``, None without ``--nodes``."""
    from laggard.demo.injections import NodePlacement

    placement = NodePlacement(result["world_size"], _nodes(result, args))
    if not placement.nodes or placement.check():
        return None
    return {name: placement.ranks_of(name) for name in placement.names}


def _nodes(result: dict[str, Any], args: argparse.Namespace) -> int:
    return int(result.get("nodes") or getattr(args, "nodes", 0) or 0)


def injected_shapes(result: dict[str, Any], args: argparse.Namespace,
                    events: list[dict[str, Any]]) -> dict[str, Any]:
    """What was injected, in the report's ``injected``: the steady ``--slowdown`` of each
    ``--slow-rank`` and every shape injection (``stall``, ``burst``, ``node``, ``moving``),
    each with what it expects named, what the findings named, and its effect measured on its
    own steps (:func:`_effect`, from the ranks' ``step_trace``).

    Returns:
        ``slow_ranks`` (the ranks ``--slowdown`` slowed; [] for none), ``shape`` (the shapes'
        names joined by ``+``: ``steady`` for one slowed rank, ``ranks`` for several, ``none``),
        ``ranks`` (every rank any of them slows), ``node`` (the ``node=`` injection's node, or
        None), and ``shapes``: one dict per shape (:func:`_shape_outcome`).
    """
    from laggard.demo.injections import SHAPE_INJECTIONS, SlowSchedule, parse_injection

    parsed = []
    for spec in result.get("injections") or []:
        try:
            parsed.append(parse_injection(spec))
        except ValueError:
            continue
    shapes = [i for i in parsed if isinstance(i, SHAPE_INJECTIONS)]
    slow = _slow_ranks(args) if args.slowdown > 1.0 else []
    schedule = SlowSchedule.of(world_size=result["world_size"], slow_from=args.slow_from,
                               slow_ranks=slow, slowdown=args.slowdown,
                               nodes=_nodes(result, args), injections=shapes)
    entries: list[tuple[str, str, Any, list[int], str | None]] = []
    if slow:
        entries.append(("steady" if len(slow) == 1 else "ranks",
                        f"slowdown={args.slowdown:g},rank:{','.join(map(str, slow))}", None,
                        slow, None))
    for shape in shapes:
        entries.append((shape.shape, shape.spec(), shape,
                        shape.ranks(schedule.placement, result["steps"], args.slow_from),
                        getattr(shape, "node", None)))
    union = sorted({r for entry in entries for r in entry[3]})
    outcomes = [_shape_outcome(*entry, schedule=schedule, events=events, union=union,
                               trace=result.get("step_trace") or {}, window=args.window)
                for entry in entries]
    return {"slow_ranks": slow, "shape": "+".join(o["shape"] for o in outcomes) or "none",
            "ranks": union, "node": next((o["node"] for o in outcomes if o["node"]), None),
            "shapes": outcomes}


def _shape_outcome(shape_name: str, spec: str, shape: Any, expected: list[int],
                   node: str | None, *, schedule: Any, events: list[dict[str, Any]],
                   union: list[int], trace: dict[str, Any], window: int) -> dict[str, Any]:
    """One injected shape: expected vs named.

    Returns:
        ``shape``, ``injection`` (its spec), ``from_step``, ``ranks`` (expected named: the
        ranks it slows; for ``moving`` the ranks it visits), ``node`` (``node=``'s), ``named``
        (each rank, node or ``job`` a raised finding named from the onset on, with ``kind``,
        ``detector`` and its ``first_step``), ``first_named_step`` (the first finding from
        the onset on naming one of ``ranks`` or the node, or of kind ``moving``; None),
        ``steps_to_name`` (onset included), ``windows_to_name`` (windows ended from the onset
        to it, that one included), ``hit`` (every expected rank named, or the node; for
        ``moving`` one of its ranks or a ``moving`` finding), ``wrong_ranks`` (ranks named at
        any step that no injection slows), ``job_named`` (a whole-job finding from the onset
        on) and ``effect`` (:func:`_effect` per expected rank).
    """
    start = schedule.slow_from
    raised = [e for e in events if e["event"] == "raised" and e.get("detector") != "integrity"]
    after = [e for e in raised if e["step"] is not None and e["step"] >= start]
    named: dict[tuple[Any, Any, Any], dict[str, Any]] = {}
    for e in after:
        who = e["rank"] if e["rank"] is not None else (e["node"] or "job")
        named.setdefault((who, e["kind"], e["detector"]),
                         {"who": who, "kind": e["kind"], "detector": e["detector"],
                          "first_step": e["step"]})

    def names_it(e: dict[str, Any]) -> bool:
        return (e["rank"] in expected or (node is not None and e["rank"] is None
                                          and e["node"] == node)
                or (shape_name == "moving" and e["kind"] == "moving"))

    first = min((e["step"] for e in after if names_it(e)), default=None)
    named_ranks = {e["rank"] for e in after if e["rank"] is not None}
    if node is not None:
        hit = any(e["rank"] is None and e["node"] == node for e in after) or \
            set(expected) <= named_ranks
    elif shape_name == "moving":
        hit = first is not None
    else:
        hit = set(expected) <= named_ranks
    return {
        "shape": shape_name, "injection": spec, "from_step": start, "ranks": expected,
        "node": node, "named": list(named.values()), "first_named_step": first,
        "steps_to_name": None if first is None else first - start + 1,
        "windows_to_name": None if first is None else (first + 1) // window - start // window,
        "hit": hit,
        "wrong_ranks": sorted({e["rank"] for e in raised
                               if e["rank"] is not None and e["rank"] not in union}),
        "job_named": any(e["rank"] is None and not e["node"] and e["kind"] == "job_slowdown"
                         for e in after),
        "effect": [_effect(schedule, shape, rank, trace) for rank in expected],
    }


def _effect(schedule: Any, shape: Any, rank: int, trace: dict[str, Any]) -> dict[str, Any]:
    """What the injection did to ``rank``, measured step by step from the ranks' trace
    (``laggard.demo.worker.TRACE_COLUMNS``): medians over the steps it acts on (``on``) and
    over the rank's steps that nothing injected touches (``off``, after the first
    :data:`WARMUP_STEPS`).

    Returns:
        ``rank``, ``steps`` (steps it acts on, in the trace), ``injected_seconds`` (what the
        rank's throttle injected per step, measured as it ran: CPU seconds computed plus wall
        seconds slept), ``cpu_seconds_on``/``_off`` (the rank's training-thread CPU seconds per
        step) and ``others_wait_seconds_on``/``_off`` (the median of the other ranks' exposed
        collective wait on those steps); None where the trace has nothing.
    """
    ranks, columns = trace.get("ranks") or [], trace.get("columns") or []
    rows = ranks[rank] if rank < len(ranks) and ranks[rank] else []
    where = {name: i for i, name in enumerate(columns)}
    on = [s for s in range(len(rows)) if schedule.hits(shape, rank, s)]
    off = [s for s in range(min(WARMUP_STEPS, len(rows)), len(rows))
           if schedule.extra(rank, s) <= 0 and schedule.stall(rank, s) is None]

    def column(r: int, step: int, name: str) -> float | None:
        own = ranks[r] if r < len(ranks) and ranks[r] else []
        return float(own[step][where[name]]) if name in where and step < len(own) else None

    def others_wait(step: int) -> float | None:
        return _median([column(r, step, "exposed_wait_seconds") for r in range(len(ranks))
                        if r != rank])

    return {"rank": rank, "steps": len(on),
            "injected_seconds": _median([column(rank, s, "injected_seconds") for s in on]),
            "cpu_seconds_on": _median([column(rank, s, "cpu_seconds") for s in on]),
            "cpu_seconds_off": _median([column(rank, s, "cpu_seconds") for s in off]),
            "others_wait_seconds_on": _median([others_wait(s) for s in on]),
            "others_wait_seconds_off": _median([others_wait(s) for s in off])}


def node_line(report: dict[str, Any]) -> str:
    """Which ranks sit on which emulated node ("" without ``--nodes``)."""
    nodes = report.get("nodes") or {}
    return ("emulated nodes: " + "; ".join(f"{name}: ranks {', '.join(map(str, ranks))}"
                                           for name, ranks in nodes.items())) if nodes else ""


def shape_lines(report: dict[str, Any]) -> list[str]:
    """One line per injected shape: what it did, measured on its own steps, what was expected
    named and what was, and the verdict."""
    from laggard.demo.injections import describe_shape, parse_injection

    lines = []
    for o in (report.get("injected") or {}).get("shapes") or []:
        if o["shape"] in ("steady", "ranks"):
            continue  # --slowdown: injected_line and its cause_line say it, as they always have
        what = describe_shape(parse_injection(o["injection"]))
        measured = "; ".join(_effect_text(e) for e in o["effect"] if e and e["steps"])
        expected = (f"node {o['node']} (ranks {', '.join(map(str, o['ranks']))})" if o["node"]
                    else ("one of ranks " if o["shape"] == "moving" else "rank"
                          + ("s " if len(o["ranks"]) > 1 else " "))
                    + ", ".join(map(str, o["ranks"])))
        named = ", ".join(f"{'rank ' if isinstance(n['who'], int) else ''}{n['who']} "
                          f"({n['kind']}, {n['detector']}) at step {n['first_step']}"
                          for n in o["named"]) or "nothing"
        verdict = "RIGHT" if o["hit"] and not o["wrong_ranks"] else (
            "found, with others named too" if o["hit"] else "NOT found")
        when = ("" if o["first_named_step"] is None else
                f", first at step {o['first_named_step']} ({o['windows_to_name']} window"
                f"{'s' if o['windows_to_name'] != 1 else ''} from the onset)")
        extra = f"; wrong ranks {o['wrong_ranks']}" if o["wrong_ranks"] else ""
        lines.append(f"injected {o['injection']} from step {o['from_step']}: {what}"
                     + (f"; measured {measured}" if measured else "")
                     + f"; expected {expected}; named: {named}{when}: {verdict}{extra}")
    return lines


def _effect_text(effect: dict[str, Any]) -> str:
    """``rank R on N steps: +X ms injected, CPU A -> B ms, the others' wait C -> D ms``."""
    return (f"rank {effect['rank']} on {effect['steps']} steps: "
            f"{_ms(effect['injected_seconds'])} ms injected, CPU {_ms(effect['cpu_seconds_off'])}"
            f" -> {_ms(effect['cpu_seconds_on'])} ms, the others' wait "
            f"{_ms(effect['others_wait_seconds_off'])} -> {_ms(effect['others_wait_seconds_on'])}"
            " ms per step")


def _peer_groups(result: dict[str, Any], findings: list[dict[str, Any]]
                 ) -> dict[str, Any] | None:
    """The job's peer groups: the monitor's (``groups``, ``names``, ``stages``, ``source``),
    else the group names the findings' evidence gives (``peer_group``), else None."""
    groups = result.get("peer_groups")
    if groups:
        return dict(groups)
    named = sorted({f["evidence"]["peer_group"] for f in findings
                    if isinstance(f.get("evidence"), dict) and f["evidence"].get("peer_group")})
    return {"groups": [], "names": named, "stages": [], "source": "findings"} if named else None


def _group_name(groups: dict[str, Any] | None, rank: int) -> str | None:
    """The name of ``rank``'s peer group, None without groups."""
    if not groups:
        return None
    for members, name in zip(groups.get("groups") or [], groups.get("names") or [],
                             strict=False):
        if rank in members:
            return str(name)
    return None


def _peers(report: dict[str, Any], rank: int) -> list[int]:
    """The ranks ``rank`` is compared with: the others of its peer group when the job has
    several groups, else every other rank."""
    groups = (report.get("peer_groups") or {}).get("groups") or []
    if len(groups) > 1:
        for members in groups:
            if rank in members:
                return [r for r in members if r != rank]
    return [r["rank"] for r in report.get("ranks") or [] if r["rank"] != rank]


def _windows_file(result: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """What became of rank 0's windows file: ``path`` (``--windows``, None for the demo's own
    temporary one), ``windows`` gathered, ``unsaved`` (windows that could not be written) and
    the first ``error``."""
    monitor = result.get("monitor") or {}
    return {"path": getattr(args, "windows", None) or None,
            "windows": monitor.get("windows", len(result["windows"])),
            "unsaved": monitor.get("save_errors", 0), "error": monitor.get("save_error", "")}


def windows_file_line(report: dict[str, Any]) -> str:
    """The report's line on a windows file that could not be written ("" when all was saved)."""
    saved = report.get("windows_file") or {}
    unsaved, total = saved.get("unsaved", 0), saved.get("windows", 0)
    if not unsaved:
        return ""
    where = saved.get("path") or "the demo's windows file (what --html draws)"
    error = saved.get("error") or "a write error"
    if unsaved >= total:
        return (f"windows file: no window was saved to {where}: {error} (all {total} windows "
                "lost; rank 0's log said so once, training went on); `laggard report` has "
                "nothing to read")
    return (f"windows file: {unsaved} of {total} windows could not be saved to {where}: {error} "
            f"(the file holds the other {total - unsaved}; `laggard report` draws those)")


#: The device clock's columns (``laggard.detectors.window``), where the monitor has them.
CLOCK_COLUMNS = ("compute_cpu_seconds", "compute_device_seconds",
                 "collective_wait_device_seconds")


def _clocks(ranks: list[dict[str, Any]], phase_clock: str | None) -> dict[str, Any]:
    """Each rank's compute on the CPU clock and on the device clock, and its excess over the
    other ranks' median on each (fractions; None where a clock was not measured).

    On the device clock the monitor keeps the CPU clock's compute beside the device's
    (``compute_cpu_seconds``, ``compute_device_seconds``); on a CPU clock ``compute_seconds``
    *is* the CPU clock's and there is no device column.
    """
    cpu_name = "compute_cpu_seconds" if phase_clock == "device" else "compute_seconds"
    out: dict[str, Any] = {"cpu": [], "device": []}
    for clock, name in (("cpu", cpu_name), ("device", "compute_device_seconds")):
        values = [r.get(f"{name}_median") for r in ranks]
        for i, own in enumerate(values):
            others = _median([v for j, v in enumerate(values) if j != i])
            if own is None or others is None:
                excess = None
            elif not others:  # every rank 0 (the loop only launched): no rank stands out
                excess = 0.0 if not own else None
            else:
                excess = own / others - 1
            out[clock].append({"seconds": own, "excess": excess})
    return out


def _comm(ranks: list[dict[str, Any]], fp32_bytes: float | None, hook: str) -> dict[str, Any]:
    """Job medians per step of the bytes sent and the collective time, exposed and hidden."""
    collective = _median([r["collective_seconds_median"] for r in ranks])
    comm_bytes = _median([r["comm_bytes_median"] for r in ranks])
    exposed = _median([r["collective_wait_seconds_median"] for r in ranks])
    return {
        "hook": hook,
        "bytes": comm_bytes,
        "fp32_allreduce_bytes": fp32_bytes,
        "compression_ratio": fp32_bytes / comm_bytes if fp32_bytes and comm_bytes else None,
        "collective_seconds": collective,
        "exposed_seconds": exposed,
        "hidden_seconds": (None if collective is None or exposed is None
                           else max(0.0, collective - exposed)),
    }


def _fsdp_line(report: dict[str, Any]) -> str:
    """FSDP2's per-step collectives, exposed vs hidden, for the text report."""
    sc, comm = report.get("step_comm") or {}, report["comm"]
    mb = (comm.get("bytes") or 0) / 1e6
    return (f"communication per step (FSDP2, prefetch {'on' if report.get('prefetch') else 'off'}"
            f"): {mb:.3f} MB sent per rank, all-gather {_ms(sc.get('allgather_seconds'))} ms, "
            f"reduce-scatter {_ms(sc.get('reduce_scatter_seconds'))} ms; "
            f"{_ms(sc.get('exposed_seconds'))} ms exposed (the training thread blocked), "
            f"{_ms(sc.get('hidden_seconds'))} ms hidden behind compute")


def _measured_slowdown(ranks: list[dict[str, Any]], args: argparse.Namespace) -> float | None:
    """The (first) slowed rank's compute over the other ranks' median, minus 1 (None if
    unslowed)."""
    if args.slowdown <= 1.0:
        return None
    return _rank_excess({"ranks": ranks}, _slow_ranks(args)[0])


def format_report(report: dict[str, Any], agent_ranks: list[int] | None = None) -> str:
    """The report as text for a terminal."""
    groups = _peer_group_line(report)
    nodes = node_line(report)
    lines = ([groups] if groups else []) + ([nodes] if nodes else []) + _table_lines(report) \
        + _clock_lines(report) + [""] + _finding_lines(report)
    comm = report["comm"]
    if report.get("parallel") == "fsdp":
        lines.append(_fsdp_line(report))
    elif report.get("parallel") == "pp":
        lines.append(_pipeline_line(report))
    elif comm["bytes"]:
        lines.append(
            f"communication per step (compression: {comm['hook']}): {comm['bytes'] / 1e6:.3f} "
            f"MB (10^6 bytes) sent per rank{_ratio(comm.get('compression_ratio'), comm['hook'])}, "
            f"{_ms(comm['collective_seconds'])} ms in collectives, "
            f"{_ms(comm['exposed_seconds'])} ms exposed (last bucket ready to last completion, "
            f"the codec's CPU time included), {_ms(comm['hidden_seconds'])} ms of the "
            "collectives hidden behind backward (medians per step)")
    loss = report["loss"]
    lines.append(f"loss (mean over ranks; progress lines show rank 0's): {_num(loss['first'])} "
                 f"at the first step, {_num(loss['last'])} at the last")
    received = ("" if agent_ranks is None else
                f" (it received step records from ranks {_ranges(agent_ranks)})" if agent_ranks
                else " (it received no step records)")
    lines.append(f"metrics: {report['metrics_url']}{received}; findings also at "
                 f"{report['metrics_url'].rsplit('/', 1)[0]}/findings and in rank 0's log above")
    lost = windows_file_line(report)
    if lost:
        lines.append(lost)
    lines.append(injected_line(report))
    lines += [cause_line(outcome) for outcome in report.get("causes") or []]
    lines += shape_lines(report)
    return "\n".join(lines)


def _pipeline_line(report: dict[str, Any]) -> str:
    """The pipeline's communication per step: the gradient all-reduce within each stage, the
    P2P wait."""
    sc = report.get("step_comm") or {}
    waits = [r.get("p2p_wait_seconds_median") for r in report["ranks"]]
    waits_text = ", ".join(f"rank {i} {_ms(w)}" for i, w in enumerate(waits))
    return (f"communication per step (pipeline, 1F1B): gradient all-reduce within each stage "
            f"{_ms(sc.get('allreduce_seconds'))} ms (all exposed); P2P wait (blocked in "
            f"send/recv, ms): {waits_text}")


def cause_outcomes(report: dict[str, Any]) -> list[dict[str, Any]]:
    """What each injection expects the detectors to name, and what they named.

    Returns:
        One dict per injection (the slowdown first): ``injection`` (its spec), ``expected``
        (``kind`` and ``ranks``, or ``group`` for a stage; None when nothing is expected:
        ``tokens`` without the note), ``named`` (``[rank or group, kind]`` of every straggler
        finding), ``hit`` (the expected kind on every expected rank, or the expected stage),
        ``wrong_ranks`` (ranks named that were not injected) and ``false_kinds`` (other kinds
        on the injected ranks, or stage findings of another stage).
    """
    from laggard.demo.injections import (
        GcInjection,
        StageInjection,
        TokensInjection,
        parse_injection,
    )

    findings = [f for f in report["findings"]
                if (f.get("detector") or "straggler") == "straggler"]
    world = report.get("world_size") or 0
    expectations: list[tuple[str, dict[str, Any] | None]] = []
    injected = report.get("injected") or {}
    if (injected.get("slowdown") or 1.0) > 1.0:
        slowed = injected.get("slow_ranks") or [injected["rank"]]
        expectations.append((f"slowdown={injected['slowdown']:g},rank:"
                             f"{','.join(map(str, slowed))}",
                             {"kind": "compute", "ranks": slowed}))
    for spec in report.get("injections") or []:
        try:
            injection = parse_injection(spec)
        except ValueError:
            continue
        if isinstance(injection, GcInjection):
            expectations.append((spec, {"kind": "gc", "ranks": [injection.rank]}))
        elif isinstance(injection, TokensInjection):
            ranks = [injection.rank]
            if report.get("parallel") == "pp" and world:
                ranks = [r for r in range(world) if r % (world // 2) == injection.rank % (
                    world // 2)]
            expectations.append((spec, {"kind": "load_imbalance", "ranks": ranks}
                                 if injection.noted else None))
        elif isinstance(injection, StageInjection):
            expectations.append((spec, {"kind": STAGE_KIND, "group": f"pp={injection.stage}"}))
    return [_outcome(spec, expected, findings) for spec, expected in expectations]


def _outcome(spec: str, expected: dict[str, Any] | None,
             findings: list[dict[str, Any]]) -> dict[str, Any]:
    named = []
    for f in findings:
        where = f["rank"] if f["rank"] is not None else (
            (f.get("evidence") or {}).get("peer_group") or f.get("subject"))
        if [where, f["kind"]] not in named:
            named.append([where, f["kind"]])
    rank_named = {(w, k) for w, k in named if isinstance(w, int)}
    group_named = {(w, k) for w, k in named if not isinstance(w, int)}
    if expected is None:
        return {"injection": spec, "expected": None, "named": named, "hit": None,
                "wrong_ranks": [], "false_kinds": []}
    if "group" in expected:
        hit = (expected["group"], STAGE_KIND) in group_named
        return {"injection": spec, "expected": expected, "named": named, "hit": hit,
                "wrong_ranks": sorted({w for w, _ in rank_named}),
                "false_kinds": sorted({k for w, k in group_named if w != expected["group"]})}
    ranks, kind = expected["ranks"], expected["kind"]
    hit = all((r, kind) in rank_named for r in ranks)
    return {"injection": spec, "expected": expected, "named": named, "hit": hit,
            "wrong_ranks": sorted({w for w, _ in rank_named if w not in ranks}),
            "false_kinds": sorted({k for w, k in rank_named if w in ranks and k != kind}
                                  | {k for _, k in group_named})}


def cause_line(outcome: dict[str, Any]) -> str:
    """One line per injection: expected, named, and the verdict."""
    named = ", ".join(f"{'rank ' if isinstance(w, int) else ''}{w} ({k})"
                      for w, k in outcome["named"]) or "nothing"
    expected = outcome["expected"]
    if expected is None:
        return f"injected {outcome['injection']}: nothing expected; named: {named}"
    where = (expected["group"] if "group" in expected
             else "rank" + ("s " if len(expected["ranks"]) > 1 else " ")
             + ", ".join(map(str, expected["ranks"])))
    verdict = "RIGHT" if outcome["hit"] and not outcome["wrong_ranks"] else (
        "found, with others named too" if outcome["hit"] else "NOT found")
    extra = "".join([f"; wrong ranks {outcome['wrong_ranks']}" if outcome["wrong_ranks"] else "",
                     f"; other kinds {outcome['false_kinds']}" if outcome["false_kinds"]
                     else ""])
    return (f"injected {outcome['injection']}: expected {expected['kind']} on {where}; named: "
            f"{named}: {verdict}{extra}")


def _table_lines(report: dict[str, Any]) -> list[str]:
    """The per-rank table: median compute, compute over the others', wait, data, step."""
    clock = ("on the device clock (max of device and CPU time per phase, waits for peers "
             "out), collective wait on the device timeline" if report.get("phase_clock") ==
             "device" else "in each rank's thread CPU time")
    grouped = len((report.get("peer_groups") or {}).get("groups") or []) > 1
    versus_what = ("compute over the median of the other ranks of its peer group" if grouped
                   else "compute over the other ranks' median")
    pp = report.get("parallel") == "pp"
    lines = ["", f"per-rank medians from step {report['table_from_step']} (ms; compute and data "
                 f"{clock}, the rest wall time; 'vs others': {versus_what}"
                 + ("; P2P wait: blocked in pipeline send/recv" if pp else "") + ")",
             f"{'rank':>4}  " + (f"{'group':>6}  " if grouped else "")
             + f"{'compute':>8}  {'vs others':>9}  {'collective wait':>15}  "
             + (f"{'P2P wait':>8}  " if pp else "") + f"{'data':>6}  {'step':>7}"]
    for r in report["ranks"]:
        excess = _rank_excess(report, r["rank"])
        versus = "-" if excess is None else f"{100 * excess:+.1f}%"
        lines.append(f"{r['rank']:>4}  " + (f"{r.get('peer_group') or '-':>6}  " if grouped
                                            else "")
                     + f"{_ms(r['compute_seconds_median']):>8}  {versus:>9}  "
                     f"{_ms(r['collective_wait_seconds_median']):>15}  "
                     + (f"{_ms(r.get('p2p_wait_seconds_median')):>8}  " if pp else "")
                     + f"{_ms(r['data_seconds_median']):>6}  {_ms(r['step_seconds_median']):>7}")
    return lines


def _clock_lines(report: dict[str, Any]) -> list[str]:
    """``--device emulated-async``: each rank's compute on the CPU clock and on the device clock."""
    if report.get("device", "cpu") == "cpu":
        return []
    clocks = report.get("clocks") or {}
    cpu, dev = clocks.get("cpu") or [], clocks.get("device") or []
    if report.get("phase_clock") != "device":
        note = ("this laggard's monitor has no device clock: only the CPU clock (the training "
                "thread's CPU time) was measured")
    else:
        note = (f"device clock: the emulated stream's {report.get('device_clock') or 'busy'} "
                "clock, waits for peers out; CPU clock: the training thread's wall time in the "
                "same phases")
    lines = ["", f"compute on each clock (ms; emulated asynchronous device; {note}; excess over "
                 "the other ranks' median)",
             f"{'rank':>4}  {'CPU clock':>9}  {'excess':>7}  {'device clock':>12}  {'excess':>7}"]
    for rank in range(len(report["ranks"])):
        c = cpu[rank] if rank < len(cpu) else {}
        d = dev[rank] if rank < len(dev) else {}
        lines.append(f"{rank:>4}  {_ms3(c.get('seconds')):>9}  {_pct(c.get('excess')):>7}  "
                     f"{_ms3(d.get('seconds')):>12}  {_pct(d.get('excess')):>7}")
    return lines


def _ms3(seconds: float | None) -> str:
    """Milliseconds to the microsecond: the CPU clock of a loop that only launches is ~0.03."""
    return "-" if seconds is None else f"{1e3 * seconds:.3f}"


def _pct(fraction: float | None) -> str:
    return "-" if fraction is None else f"{100 * fraction:+.1f}%"


def _finding_lines(report: dict[str, Any]) -> list[str]:
    """Each rank's finding once (first flagged, message, why, cleared), then the job's."""
    stragglers = [f for f in report["findings"] if f["rank"] is not None]
    lines = []
    if not any(f.get("detector", "straggler") == "straggler" for f in stragglers):
        lines.append("straggler: none found")
    seen: dict[tuple[Any, Any, Any], int] = {}
    for f in stragglers:  # integrity findings (--inject-bitflip) carry their own detector name
        key = (f.get("detector"), f["rank"], f["kind"])
        if key in seen:  # raised again in a later window (a replica stays diverged): count it
            seen[key] += 1
            continue
        seen[key] = 0
        lines.append(f"{f.get('detector') or 'straggler'}: rank {f['rank']} ({f['kind']}), "
                     f"first flagged at step {f['step']}")
        lines.append(f"  {f['message']}")
        figures = _slowdown_figures(report, f)
        if figures:
            lines.append(f"  slowdown: {figures}")
        why = _evidence_sentence(f.get("evidence") or {})
        if why:
            lines.append(f"  why: {why}")
        where = _where_and_cost(f.get("evidence") or {})
        if where:
            lines.append(f"  {where}")
        ended = _cleared_step(report, f)
        if ended is not None:
            lines.append(f"  cleared at step {ended} (evidence of recovery)")
    for (detector, rank, kind), again in seen.items():
        if again:
            lines.append(f"  ({detector or 'straggler'} {kind} on rank {rank}: raised again in "
                         f"{again} later window{'s' if again > 1 else ''})")
    # Whole-job findings after the rank findings: one still open at the end first, then those
    # that cleared, each saying so (under load, the shared cores slow every rank for a while).
    stages = [f for f in report["findings"] if f["rank"] is None and f["kind"] == STAGE_KIND]
    lines += _stage_lines(report, stages)
    job = [f for f in report["findings"] if f["rank"] is None and f["kind"] != STAGE_KIND]
    for f in sorted(job, key=lambda f: _cleared_step(report, f) is not None):
        ended = _cleared_step(report, f)
        lines.append(f"also: {f['message']} (step {f['step']}; "
                     + ("still open at the end)" if ended is None else
                        f"cleared at step {ended})"))
    return lines


#: The kind of a pipeline-stage imbalance finding (``laggard.detectors.stage_balance``).
STAGE_KIND = "stage_imbalance"


def _where_and_cost(evidence: dict[str, Any]) -> str:
    """A finding's peer group, how it was compared, and what it costs the job ("" if none of
    these is in its evidence)."""
    parts = []
    if evidence.get("peer_group"):
        parts.append(f"peer group {evidence['peer_group']}"
                     + (f" (compared {evidence['compared']})" if evidence.get("compared")
                        else ""))
    per_step, per_hour = (evidence.get("lost_seconds_per_step"),
                          evidence.get("lost_seconds_per_hour"))
    if per_step is not None:
        parts.append(f"costs the job {1e3 * per_step:.1f} ms per step"
                     + (f" ({per_hour / 60:.1f} min per hour)" if per_hour is not None else ""))
    return "; ".join(parts)


def _stage_lines(report: dict[str, Any], findings: list[dict[str, Any]]) -> list[str]:
    """Each stage-imbalance finding once: the stage, the message, each stage's work per step,
    the balanced split, the cost."""
    lines: list[str] = []
    seen: set[Any] = set()
    for f in findings:
        evidence = f.get("evidence") or {}
        key = f.get("subject") or evidence.get("peer_group")
        if key in seen:
            continue
        seen.add(key)
        lines.append(f"stage imbalance: {key or 'a pipeline stage'}, first flagged at step "
                     f"{f['step']}")
        lines.append(f"  {f['message']}")
        stage_seconds = evidence.get("stage_seconds") or {}
        if stage_seconds:
            work = ", ".join(f"{name} {_ms(v)} ms" for name, v in stage_seconds.items())
            balanced = evidence.get("balanced_stage_seconds")
            lines.append(f"  work per step: {work}"
                         + (f"; balanced: {_ms(balanced)} ms each" if balanced else ""))
        cost = _where_and_cost(evidence)
        if cost:
            lines.append(f"  {cost}")
        ended = _cleared_step(report, f)
        if ended is not None:
            lines.append(f"  cleared at step {ended}")
    return lines


def _peer_group_line(report: dict[str, Any]) -> str:
    """The peer groups each rank was compared within ("" for one group of every rank)."""
    groups = report.get("peer_groups") or {}
    members, names = groups.get("groups") or [], groups.get("names") or []
    if len(members) <= 1 and len(names) <= 1:
        return ""
    listed = "; ".join(f"{name}: ranks {', '.join(map(str, ranks))}" if ranks else str(name)
                       for name, ranks in zip(names, members or [[]] * len(names),
                                              strict=False))
    return (f"peer groups ({groups.get('source') or 'given'}; each rank is compared with its "
            f"own group): {listed}")


def _cleared_step(report: dict[str, Any], finding: dict[str, Any]) -> int | None:
    """The step at which ``finding`` cleared, or None if it was still open at the end."""
    return next((c["step"] for c in report.get("cleared", [])
                 if (c["rank"], c["kind"]) == (finding["rank"], finding["kind"])
                 and c.get("detector", finding.get("detector")) == finding.get("detector")
                 and c["step"] is not None and finding["step"] is not None
                 and c["step"] > finding["step"]), None)


def detector_compute_slowdown(evidence: dict[str, Any]) -> float | None:
    """A compute finding's own figure, as its message gives it: the rank's forward+backward over
    the median rank's, the median of the detector's last windows when it was raised."""
    excess, work = evidence.get("compute_slowdown"), evidence.get("median_work_seconds")
    compute = evidence.get("median_compute_seconds")
    if excess is None or not work or not compute:
        return None
    return excess * work / compute


def _slowdown_figures(report: dict[str, Any], finding: dict[str, Any]) -> str:
    """The compute finding's figure and the table's, each said for what it is."""
    evidence = finding.get("evidence") or {}
    own = detector_compute_slowdown(evidence)
    if (finding.get("detector") or "straggler") != "straggler" or finding["kind"] != "compute" \
            or own is None:
        return ""
    text = (f"{100 * own:.0f}% when raised (the finding's figure: the median of its last "
            f"{evidence.get('windows') or 'few'} windows up to step {finding['step']}, those whose "
            "evidence raised it)")
    table = _rank_excess(report, finding["rank"])
    if table is not None:
        text += (f"; {100 * table:+.1f}% from step {report['table_from_step']} on (the table's "
                 "'vs others', the last line's 'measured')")
    return text


def _rank_excess(report: dict[str, Any], rank: int | None) -> float | None:
    """``rank``'s median compute over the other ranks' median, minus 1: the table's figure."""
    ranks = report.get("ranks") or []
    if rank is None or not 0 <= rank < len(ranks):
        return None
    own = ranks[rank]["compute_seconds_median"]
    peers = set(_peers(report, rank))
    others = _median([r["compute_seconds_median"] for r in ranks if r["rank"] in peers])
    return None if own is None or not others else own / others - 1


def summary_lines(report: dict[str, Any]) -> list[str]:
    """The HTML page's summary: the peer groups, what was injected and what was named."""
    groups = _peer_group_line(report)
    nodes = node_line(report)
    return (([groups] if groups else []) + ([nodes] if nodes else []) + [injected_line(report)]
            + [cause_line(o) for o in report.get("causes") or []] + shape_lines(report))


def injected_line(report: dict[str, Any]) -> str:
    """What was injected, what was measured, and whether (and when) it was found."""
    injected = report["injected"]
    if injected["slowdown"] <= 1.0 and report.get("injections"):
        return "injected: no slowdown (the injected causes below)"
    if len(injected.get("slow_ranks") or []) > 1 and injected["slowdown"] > 1.0:
        measured = injected.get("measured_slowdowns") or {}
        figures = ", ".join(f"rank {r} " + ("-" if measured.get(str(r)) is None
                                            else f"{100 * measured[str(r)]:.1f}%")
                            for r in injected["slow_ranks"])
        return (f"injected: ranks {', '.join(map(str, injected['slow_ranks']))} each "
                f"{percent(injected['slowdown'] - 1)} slower compute from step "
                f"{injected['from_step']}; measured {figures} (the table; each below)")
    if injected["slowdown"] <= 1.0:
        named = [f for f in report["findings"] if f["rank"] is not None
                 and f.get("detector", "straggler") == "straggler"]
        return "injected: no slowdown; " + ("no straggler named" if not named else
                                        f"NAMED rank {named[0]['rank']} (a false finding)")
    first = next((f for f in report["findings"] if f["rank"] == injected["rank"]
                  and f["step"] is not None and f["step"] >= injected["from_step"]), None)
    measured = injected.get("measured_slowdown")
    # Counted as slowed steps (onset included): found at step 259 for onset 200 is 60 of them.
    found = (f"found at step {first['step']}, after {first['step'] - injected['from_step'] + 1} "
             "slowed steps" if first else "NOT found")
    own = detector_compute_slowdown(first.get("evidence") or {}) if first else None
    if own is not None and first is not None and first.get("kind") == "compute":
        found += f", at {100 * own:.0f}% in its last windows"
    # the table's figure, to its precision, said over which steps
    since = report.get("table_from_step")
    measured_text = ("-" if measured is None else f"{100 * measured:.1f}%"
                     + (f" from step {since} on (the table)" if since is not None else ""))
    return (f"injected: rank {injected['rank']} {percent(injected['slowdown'] - 1)} slower compute "
            f"from step {injected['from_step']}; measured {measured_text}; {found}")


def _evidence_sentence(evidence: dict[str, Any]) -> str:
    """A straggler finding's evidence in one sentence with two numbers (the JSON report keeps
    every field)."""
    noise, wait = evidence.get("noise"), evidence.get("wait_deficit")
    if noise is None or evidence.get("evidence") is None:
        return ""
    text = (f"its excess added up window after window to the decision interval, against a "
            f"rank-to-rank noise of {percent(noise)} of a step's work")
    work = evidence.get("median_work_seconds")
    if wait is not None and work:
        text += (f"; it waits {1e3 * wait * work:.1f} ms per step less than the median rank in "
                 "the collective: the others wait for it")
    return text


def percent(fraction: float) -> str:
    return f"{100 * fraction:.1f}%" if abs(fraction) < 0.1 else f"{100 * fraction:.0f}%"


def _median(values: list[float | None]) -> float | None:
    finite = sorted(v for v in values if v is not None and math.isfinite(v))
    if not finite:
        return None
    mid = len(finite) // 2
    return finite[mid] if len(finite) % 2 else (finite[mid - 1] + finite[mid]) / 2


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{1e3 * seconds:.1f}"


def _ratio(ratio: float | None, hook: str = "") -> str:
    if ratio is None or abs(ratio - 1) < 0.05:  # no compression: nothing to compare
        if hook not in ("", "none", "fp16", "builtin"):
            return (" (no compression yet: the measured steps were all in the hook's warm-up "
                    "of plain fp32 all-reduces; run more --steps)")
        return ""
    return f", {ratio:.1f}x less than an fp32 all-reduce"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _ranges(ranks: list[int]) -> str:
    if ranks == list(range(ranks[0], ranks[-1] + 1)) and len(ranks) > 2:
        return f"{ranks[0]}-{ranks[-1]}"
    return ", ".join(map(str, ranks))
