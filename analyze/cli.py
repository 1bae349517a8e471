"""``laggard analyze PATH...``: read an incident's artifacts and name the culprit.

Each file's kind is told from its content (:mod:`laggard.analyze.filetype`), it is parsed by
that kind's parser (logs are streamed line by line, so a log of any size runs in bounded memory),
and the rules of :mod:`laggard.analyze.gpu`, ``incident_collectives`` and
``incident_network`` turn what was parsed into findings. Watchdog timeouts of every NCCL log,
and flight-recorder dumps of one directory, are compared across ranks together, since one
rank's log alone cannot say who is behind.

Exit status: 0 nothing found, 1 findings, 2 an input could not be read (findings of the other
inputs are still printed). A file found in a directory is an input like a file named: one of no
known kind (binary, empty, no marker) is an error and status 2 either way (``docs/analyze.md``).

The table has a HOST column where a finding names a host (``Finding.node``: the syslog or
journal HOSTNAME, a pdsh/clush prefix, NCCL's hostname), and a SOURCE column when more than one
file, or a directory, was read.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from laggard.analyze import filetype
from laggard.analyze.findings import KINDS, report_dict, sort_findings
from laggard.parsers.flight_recorder import DumpError

if TYPE_CHECKING:
    from laggard.analyze.traces import TraceSummary
    from laggard.detectors.finding import Finding
    from laggard.parsers.flight_recorder import FlightRecorderDump
    from laggard.parsers.nccl_log import NcclLog

# Each file kind's parser and rules are imported by the reader of that kind, when a file of it
# is read: a kernel log must not cost numpy, prometheus_client and the trace and dump rules
# (``laggard analyze`` of a 4-line kernel log: 1.4 s before, 0.4 s after, at load 8 on 2 cores;
# benchmarks/RESULTS.md. tests/test_cli_startup.py checks the modules it loads).

#: Most files read from the directories given (a stray ``/`` must not walk the whole disk).
MAX_FILES = 10_000
#: Largest small-format file (nvidia-smi, /proc/net/dev, IB listing, exposition) read whole.
MAX_TABLE_BYTES = 64 * 1024 * 1024


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``laggard analyze``."""
    parser.add_argument("paths", nargs="+", metavar="PATH",
                        help="files or directories (searched recursively): kernel logs, NCCL "
                             "logs, flight-recorder dumps, PyTorch profiler (Kineto) traces "
                             "(.json, .json.gz, one per rank), nccl-tests output, nvidia-smi "
                             "-q or CSV, dcgm-exporter output, /proc/net/dev, IB listings")
    parser.add_argument("--json", action="store_true",
                        help="print a JSON list of findings instead of a table")
    parser.add_argument("--kind", choices=filetype.KINDS, metavar="KIND",
                        help="treat every file as this kind instead of detecting it: "
                             + ", ".join(filetype.KINDS))
    parser.epilog = ("exit status: 0 nothing found, 1 findings, 2 an input could not be read. "
                     "Finding kinds: " + ", ".join(KINDS) + ".")


@dataclass(slots=True)
class _Inputs:
    """What was read, by kind, before the cross-file rules run."""

    findings: list[Finding] = field(default_factory=list)
    nccl_logs: list[tuple[str, NcclLog]] = field(default_factory=list)
    fr_dumps: dict[str, list[FlightRecorderDump]] = field(default_factory=lambda: defaultdict(list))
    kineto: dict[str, list[TraceSummary]] = field(default_factory=lambda: defaultdict(list))
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    files: int = 0  # files walked (named or found in a directory)
    directories: list[str] = field(default_factory=list)  # the directories among the paths


def _walk(paths: list[str], inputs: _Inputs) -> Iterator[tuple[str, bool]]:
    """Yield ``(file, named_explicitly)``; hidden files and directories are skipped."""
    count = 0
    for path in paths:
        if os.path.isdir(path):
            inputs.directories.append(path)
            for root, dirs, files in os.walk(path):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                for name in sorted(files):
                    if name.startswith("."):
                        continue
                    count += 1
                    if count > MAX_FILES:
                        inputs.notes.append(f"stopped after {MAX_FILES} files")
                        return
                    inputs.files = count
                    yield os.path.join(root, name), False
        elif os.path.exists(path):
            count += 1
            inputs.files = count
            yield path, True
        else:
            inputs.errors.append(f"{path}: no such file or directory")


def _small_text(path: str) -> list[str]:
    if os.path.getsize(path) > MAX_TABLE_BYTES:
        raise ValueError(f"larger than {MAX_TABLE_BYTES} bytes; not a table of this kind")
    with filetype.open_text(path) as f:
        return f.read().splitlines()


def _read_log(path: str, kind: str, inputs: _Inputs) -> None:
    from laggard.parsers.nccl_log import MAX_EVENTS_PER_TYPE, NcclLog, parse_nccl_log

    if kind == "nccl_log":
        log = parse_nccl_log(filetype.iter_lines(path))
        if log.dropped:
            inputs.notes.append(f"{path}: {log.dropped} NCCL events beyond the first "
                                f"{MAX_EVENTS_PER_TYPE} of their type were counted, not kept")
        inputs.nccl_logs.append((path, log))
        return
    from laggard.analyze import gpu
    from laggard.parsers.kernel_log import KernelLogParser
    from laggard.parsers.nccl_log import NcclLogParser

    kernel = KernelLogParser()
    nccl = NcclLogParser() if kind == "mixed_log" else None
    evidence = gpu.KernelEvidence()
    log = NcclLog()
    for line in filetype.iter_lines(path):
        # Every line the kernel-log rules use (Xid, SXid, "fallen off the bus", RmInitAdapter)
        # has one of these; the rest skip the regex parser, which is what lets a busy kernel
        # log stream at hundreds of thousands of lines per second.
        if "NVRM" in line or "Xid" in line or kernel.waiting:
            for event in kernel.feed(line):
                evidence.add(event)
            evidence.add_line(line, kernel.host)
        if nccl is not None:
            for nccl_event in nccl.feed(line):
                log.add(nccl_event)
    for event in kernel.flush():
        evidence.add(event)
    inputs.findings += gpu.kernel_findings(path, evidence)
    if nccl is not None:
        inputs.nccl_logs.append((path, log))


def _fr_group(path: str) -> str:
    # dumps of one job share a directory and a prefix: "/x/trace_3" -> "/x/trace_"
    return os.path.join(os.path.dirname(path), re.sub(r"\d+(\.\w+)?$", "",
                                                      os.path.basename(path)))


def _read_dump(path: str, inputs: _Inputs) -> None:
    from laggard.parsers.flight_recorder import load_dump

    dump = load_dump(path)
    inputs.notes += [f"{path}: {note}" for note in dump.notes]
    group = inputs.fr_dumps[_fr_group(path)]
    other = next((d for d in group if dump.rank is not None and d.rank == dump.rank), None)
    if other is not None:
        # Two jobs' dumps in one directory: comparing them would invent lags.
        inputs.notes.append(f"{path}: skipped: rank {dump.rank} was already read from "
                            f"{other.source} (dumps of two jobs in one place?)")
        return
    world = _world(dump)
    if world and any(_world(d) not in (None, world) for d in group):
        inputs.notes.append(f"{path}: skipped: its default group has {world} ranks, the other "
                            f"dumps beside it another number (a dump of another job?)")
        return
    group.append(dump)


def _read_trace(path: str, inputs: _Inputs) -> None:
    from laggard.analyze import traces

    with filetype.open_text(path) as f:
        trace = traces.read_trace(f, path)
    if not trace.steps:
        inputs.notes.append(f"{path}: a profiler trace with no ProfilerStep ranges (profile "
                            f"with a schedule and call prof.step()): nothing to break down")
        return
    group = inputs.kineto[os.path.dirname(path)]
    clash = next((t for t in group if t.rank == trace.rank or (
        t.world_size and trace.world_size and t.world_size != trace.world_size)), None)
    if clash is not None:
        inputs.notes.append(f"{path}: skipped: rank {trace.rank} of {trace.world_size} does "
                            f"not fit beside {clash.source} (rank {clash.rank} of "
                            f"{clash.world_size}): traces of two jobs in one directory?")
        return
    group.append(trace)


def _world(dump: FlightRecorderDump) -> int | None:
    members = next((m for desc, m in dump.groups.values() if desc == "default_pg" and m), ())
    return len(members) or None


def _read_inspector(path: str, inputs: _Inputs) -> None:
    from laggard.analyze import network
    from laggard.parsers.nccl_inspector import InspectorRecord, InspectorStream

    stream = InspectorStream()
    records: list[InspectorRecord] = []
    for line in filetype.iter_lines(path):
        item = stream.feed(line)
        if isinstance(item, InspectorRecord) and len(records) < 1_000_000:
            records.append(item)
    stream.finish()
    if stream.malformed:
        inputs.notes.append(f"{path}: {stream.malformed} malformed Inspector line(s) skipped")
    if stream.count_mismatches:
        inputs.notes.append(f"{path}: {stream.count_mismatches} dump_stats marker(s) whose "
                            f"record counts do not match the records that follow")
    inputs.findings += network.inspector_findings(path, records, [stream])


def _read_netdev(path: str, inputs: _Inputs) -> None:
    from laggard.analyze import network
    from laggard.parsers.proc_net_dev import parse_proc_net_dev

    lines = _small_text(path)
    taken = next((line.strip() for line in lines
                  if re.search(r"\b\d\d:\d\d:\d\d\b.*\b(19|20)\d\d\b", line)), None)
    devices = parse_proc_net_dev("\n".join(lines))
    if not devices:
        raise ValueError("no interface rows")
    inputs.findings += network.netdev_findings(path, devices, taken)


def _read_table(path: str, kind: str) -> list[Finding]:
    """Findings of one file of a kind that is parsed whole and judged on its own."""
    if kind == "fr_trace_report":
        from laggard.analyze import flight_recorder
        from laggard.parsers.flight_recorder import parse_fr_trace_report

        return flight_recorder.fr_report_findings(
            path, parse_fr_trace_report(filetype.iter_lines(path)))
    if kind in ("nvidia_smi_q", "nvidia_smi_csv", "dcgm"):
        from laggard.analyze import gpu

        if kind == "dcgm":
            from laggard.parsers.exposition import dcgm_gpus, parse_exposition

            return gpu.dcgm_findings(path, dcgm_gpus(parse_exposition(_small_text(path))))
        from laggard.parsers.nvidia_smi import parse_nvidia_smi_csv, parse_nvidia_smi_q

        parse_smi = parse_nvidia_smi_q if kind == "nvidia_smi_q" else parse_nvidia_smi_csv
        return gpu.clock_event_findings(path, parse_smi(_small_text(path)))
    from laggard.analyze import network

    if kind == "nccl_tests":
        from laggard.parsers.nccl_tests import parse_nccl_tests

        return network.nccl_tests_findings(path, parse_nccl_tests(filetype.iter_lines(path)))
    if kind == "nccl_inspector_prom":
        from laggard.parsers.exposition import parse_exposition

        return network.inspector_prom_findings(path, parse_exposition(_small_text(path)))
    from laggard.parsers import infiniband_listing as ib

    parse_ib = {"infiniband_listing": ib.parse_ib_listing, "ibstat": ib.parse_ibstat,
                "perfquery": ib.parse_perfquery}[kind]
    return network.ib_findings(path, parse_ib(_small_text(path)))


def _read_one(path: str, kind: str, inputs: _Inputs) -> None:
    readers: dict[str, Callable[[], None]] = {
        "kernel_log": lambda: _read_log(path, kind, inputs),
        "nccl_log": lambda: _read_log(path, kind, inputs),
        "mixed_log": lambda: _read_log(path, kind, inputs),
        "flight_recorder": lambda: _read_dump(path, inputs),
        "kineto_trace": lambda: _read_trace(path, inputs),
        "nccl_inspector": lambda: _read_inspector(path, inputs),
        "proc_net_dev": lambda: _read_netdev(path, inputs),
    }
    reader = readers.get(kind)
    if reader is None:
        inputs.findings += _read_table(path, kind)
    else:
        reader()


def analyze_paths(paths: list[str],
                  kind: str | None = None) -> tuple[list[Finding], _Inputs]:
    """Read every file under ``paths`` and return the findings (sorted) and what was read.

    Never raises for bad input: unreadable files are listed in ``inputs.errors``.
    """
    inputs = _Inputs()
    quiet: list[tuple[str, str]] = []  # (path, kind) of named files with no finding of their own
    for path, explicit in _walk(paths, inputs):
        try:
            file_kind = kind or filetype.detect(path)
        except filetype.UnreadableFileError as exc:
            inputs.errors.append(f"{path}: cannot read: {exc}")
            continue
        except filetype.FileKindError as exc:
            # An input of no known kind could not be read, whether it was named or found in a
            # directory: the exit status must not depend on how the file was given.
            inputs.errors.append(f"{path}: unknown kind: {exc}")
            continue
        except OSError as exc:
            inputs.errors.append(f"{path}: {exc.strerror or exc}")
            continue
        except Exception as exc:  # noqa: BLE001 - one odd file must not cost the others' report
            inputs.errors.append(f"{path}: could not tell its kind "
                                 f"({type(exc).__name__}: {str(exc)[:200]})")
            continue
        before = len(inputs.findings)
        try:
            _read_one(path, file_kind, inputs)
            if explicit and len(inputs.findings) == before:
                # Say what the file was read as: a healthy log and a file mistaken for another
                # kind both end here, and the reader should be able to tell which. Kinds that
                # are compared across files are told after that comparison.
                quiet.append((path, file_kind))
        except DumpError as exc:
            inputs.errors.append(f"{path}: unreadable flight-recorder dump: {exc}")
        except (OSError, EOFError) as exc:
            inputs.errors.append(f"{path}: cannot read: {exc}")
        except (ValueError, UnicodeError) as exc:
            inputs.errors.append(f"{path}: not a valid {file_kind}: {exc}")
        except Exception as exc:  # noqa: BLE001 - one odd file must not cost the others' report
            inputs.errors.append(f"{path}: could not be analysed as {file_kind} "
                                 f"({type(exc).__name__}: {str(exc)[:200]})")
    cross = _cross_file_findings(inputs)
    for path, file_kind in quiet:
        if file_kind not in _CROSS_FILE_KINDS or not cross:
            inputs.notes.append(f"{path}: read as {file_kind}; nothing to report on its own")
    return sort_findings(inputs.findings + cross), inputs


#: File kinds whose findings come from comparing files (ranks' logs, traces, dumps).
_CROSS_FILE_KINDS = frozenset({"nccl_log", "mixed_log", "kineto_trace", "flight_recorder"})


def _cross_file_findings(inputs: _Inputs) -> list[Finding]:
    """Rules that compare files: NCCL logs of every rank, profiler traces and flight-recorder
    dumps of one directory. A failure of one stage costs only that stage."""
    findings: list[Finding] = []
    if not (inputs.nccl_logs or inputs.kineto or inputs.fr_dumps):
        return findings
    from laggard.analyze import collectives, flight_recorder, traces
    from laggard.detectors.flight_recorder import analyze_dumps

    if inputs.nccl_logs:
        try:
            findings += collectives.nccl_findings(inputs.nccl_logs)
        except Exception as exc:  # noqa: BLE001 - keep the per-file findings already made
            inputs.errors.append(f"NCCL logs ({len(inputs.nccl_logs)}): cross-rank comparison "
                                 f"failed ({type(exc).__name__}: {str(exc)[:200]})")
    for directory, group_traces in sorted(inputs.kineto.items()):
        try:
            findings += traces.trace_findings(group_traces)
        except Exception as exc:  # noqa: BLE001 - one set of traces must not cost the others
            inputs.errors.append(f"{directory or '.'}: cross-rank trace analysis failed "
                                 f"({type(exc).__name__}: {str(exc)[:200]})")
    for group, dumps in sorted(inputs.fr_dumps.items()):
        source = (dumps[0].source if len(dumps) == 1
                  else f"{os.path.dirname(group) or '.'} ({len(dumps)} dumps)")
        try:
            locations = collectives.rank_locations(
                collectives.job_inits(inputs.nccl_logs, {os.path.dirname(group)}))
            findings += flight_recorder.fr_findings(source, analyze_dumps(dumps), locations)
        except Exception as exc:  # noqa: BLE001 - one group's dumps must not cost the others
            inputs.errors.append(f"{source}: cross-rank flight-recorder analysis failed "
                                 f"({type(exc).__name__}: {str(exc)[:200]})")
    return findings


#: Widest the SEVERITY .. SOURCE columns of the table get (the message is never cut).
_COLUMN_WIDTH = 40


def _cell(text: str, width: int, *, keep_end: bool = False) -> str:
    """``text`` cut to ``width`` (from the left when ``keep_end``: a path keeps its file name)."""
    if len(text) <= width:
        return text.ljust(width)
    return ("..." + text[-(width - 3):]) if keep_end else text[:width]


def _shown_source(source: str, root: str | None) -> str:
    """A finding's source as the table shows it: relative to ``root`` (the one directory
    given) where there is one, else each file's base name (a cross-file finding's source is a
    list, ``a, b and 3 more``)."""
    prefix = os.path.join(root, "") if root else None
    if prefix and prefix != os.sep:
        return source.replace(prefix, "")
    return ", ".join(os.path.basename(part) for part in source.split(", "))


def _source_cell(source: str) -> str:
    """A cross-file finding's source list (``a, b, c and 4 more``) as one cell: the first file
    and how many others (``a +6``), so the column stays narrow and names a file."""
    parts = source.split(", ")
    if len(parts) == 1:
        return source
    more = re.fullmatch(r"(.*) and (\d+) more", parts[-1])
    others = len(parts) - 1 + (int(more[2]) if more else 0)
    return f"{parts[0]} +{others}"


def _where(finding: Finding) -> str:
    """Where a rank-named culprit ran, from NCCL's ``Init COMPLETE`` lines: ``rank 2 on node-b
    GPU 0000:3b:00 (cudaDev 0)``; empty when the inputs do not say."""
    located = finding.evidence.get("culprit_locations") or finding.evidence.get("locations")
    if not isinstance(located, dict) or not located:
        return ""
    items = sorted(located.items(), key=lambda kv: int(kv[0]) if str(kv[0]).isdigit() else -1)
    text = ", ".join(f"rank {rank} on {where}" for rank, where in items[:8])
    return text + (f" and {len(items) - 8} more" if len(items) > 8 else "")


def _table(findings: list[Finding], errors: bool = False, show_source: bool = False,
           root: str | None = None) -> str:
    """The findings as a table, then the culprits.

    Args:
        findings: sorted findings.
        errors: some input could not be read (said when nothing was found).
        show_source: add the SOURCE column (a directory or several files were read).
        root: the one directory given, if so: SOURCE is shown relative to it.

    Returns:
        The text to print.
    """
    if not findings:
        return "No findings in the inputs that could be read." if errors else "No findings."
    show_host = any(f.node for f in findings)
    header = ["SEVERITY", "KIND"] + (["HOST"] if show_host else []) + ["SUBJECT"] \
        + (["SOURCE"] if show_source else [])
    rows = []
    for f in findings:
        source = _source_cell(_shown_source(f.source or "", root) if root else f.source or "")
        row = [f.severity.value, f.kind] + ([f.node or "-"] if show_host else []) \
            + [f.subject or ""] + ([source] if show_source else [])
        rows.append((row, f.message))
    width = [min(max(len(r[i]) for r in [header] + [row for row, _ in rows]), _COLUMN_WIDTH)
             for i in range(len(header))]
    source_column = len(header) - 1 if show_source else -1
    lines = ["  ".join(_cell(h, w) for h, w in zip(header, width, strict=True)) + "  MESSAGE"]
    for row, message in rows:
        cells = (_cell(c, w, keep_end=i == source_column)
                 for i, (c, w) in enumerate(zip(row, width, strict=True)))
        lines.append("  ".join(cells) + "  " + message)
    # The culprits: what is critical, or, where nothing is, what is named as at fault.
    culprits = ([f for f in findings if f.severity.value == "critical"]
                or [f for f in findings if f.severity.value == "warning"])
    if culprits:
        lines.append("")
        lines.append("Culprits:")
        seen = set()
        for f in culprits:
            where = _where(f)
            if (f.subject, where) not in seen:
                seen.add((f.subject, where))
                lines.append(f"  {f.subject}: {f.kind}{_hang_kinds(f)} "
                             f"({_shown_source(f.source or '', root)})"
                             + (f"; {where}" if where else ""))
    return "\n".join(lines)


def _hang_kinds(f: Finding) -> str:
    """`` [device]``: how the hang rules name the finding's ranks (missing, device, silent;
    ``laggard.detectors.hang``), where the finding carries them; ``""`` otherwise."""
    if f.kind == "collective_stuck":
        return " [device]"
    kinds = f.evidence.get("kinds") if isinstance(f.evidence, dict) else None
    if not isinstance(kinds, dict):
        return ""
    named = sorted({str(k) for k in kinds.values() if k})
    return f" [{', '.join(named)}]" if named else ""


def run(args: argparse.Namespace) -> int:
    """Run ``laggard analyze``; returns 0 (nothing found), 1 (findings) or 2 (bad input)."""
    findings, inputs = analyze_paths(list(args.paths), getattr(args, "kind", None))
    try:
        if args.json:
            json.dump([report_dict(f) for f in findings], sys.stdout, indent=2, default=str)
            sys.stdout.write("\n")
        else:
            print(_table(findings, errors=bool(inputs.errors),
                         show_source=bool(inputs.directories) or inputs.files > 1,
                         root=inputs.directories[0] if len(inputs.directories) == 1 else None))
        sys.stdout.flush()
    except BrokenPipeError:  # `laggard analyze ... | head`: the reader left, which is fine
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    for note in inputs.notes:
        print(f"laggard analyze: note: {note}", file=sys.stderr)
    for error in inputs.errors:
        print(f"laggard analyze: error: {error}", file=sys.stderr)
    if inputs.errors:
        return 2
    return 1 if findings else 0
