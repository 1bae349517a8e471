"""PyTorch flight-recorder dumps and ``torchfrtrace`` reports: safe, pure readers.

A dump (one file per rank, ``TORCH_FR_DUMP_TEMP_FILE`` + rank; PyTorch
``torch/csrc/distributed/c10d/FlightRecorder.cpp``, reader ``torch/distributed/flight_recorder``)
is a dict of builtin types::

    {"version": "2.9", "pg_config": {pg_name: {"name", "desc", "ranks": "[0, 1]"}},
     "pg_status": {pg_id: {"last_enqueued_collective", "last_started_collective",
                           "last_completed_collective"}},
     "entries": [{"record_id", "pg_id", "process_group": (pg_name, desc), "collective_seq_id",
                  "p2p_seq_id", "op_id", "profiling_name": "nccl:all_reduce", "time_created_ns",
                  "input_sizes", "input_dtypes", "output_sizes", "output_dtypes",
                  "state": "scheduled"|"started"|"completed", "is_p2p", "timeout_ms", ...}]}

``pg_config`` is keyed by the group's *name* and ``pg_status`` by its local *uid* (``pg_id``); an
entry carries both, which is how a rank's status is tied to a group.

Three encodings are read: a pickle (loaded by :class:`RestrictedUnpickler`, which refuses every
class, so a dump cannot run code), the JSON form (``_dump_nccl_trace_json``), and the printed
Python repr of an unpickled dump as PyTorch's tutorial shows it (JSON with Python tuples and a
literal ``...``), read with :func:`ast.literal_eval`, never ``eval``.

Cross-rank analysis of the loaded dumps is :mod:`laggard.detectors.flight_recorder`.
"""

from __future__ import annotations

import ast
import io
import json
import os
import pickle
import re
import tokenize
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "DumpError",
    "FlightRecorderDump",
    "FrEntry",
    "PgStatus",
    "RestrictedUnpickler",
    "load_dump",
    "parse_dump",
    "parse_fr_trace_report",
    "FrTraceIssue",
    "MAX_DUMP_BYTES",
]

#: Largest dump file read (a full 20 000-entry buffer with stacks is tens of MiB).
MAX_DUMP_BYTES = 512 * 1024 * 1024
#: Largest printed-repr dump parsed with ``ast.literal_eval`` (its AST costs ~20x the text).
MAX_TEXT_DUMP_BYTES = 32 * 1024 * 1024
#: Ops whose sizes legitimately differ across ranks (PyTorch ``fr_trace`` ``Op.match``).
VARIABLE_SIZE_OPS = frozenset({
    "all_to_all", "all_to_all_single", "all_to_all_v_single", "scatter", "gather",
    "all_gather_v", "reduce_scatter_v",
})


class DumpError(ValueError):
    """The file is not a readable flight-recorder dump (truncated, corrupt, refused class)."""


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that builds builtin containers and scalars only.

    Every opcode that would import or call something (``GLOBAL``, ``STACK_GLOBAL``, extension
    codes, ``persistent_load``) goes through :meth:`find_class` or :meth:`persistent_load`, and
    both refuse; so ``REDUCE``/``BUILD``/``NEWOBJ`` never get a callable (Python ``pickle`` docs,
    "Restricting Globals").
    """

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(
            f"refusing {module}.{name}: flight-recorder dumps hold builtin types only")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("refusing a persistent id in a flight-recorder dump")


@dataclass(frozen=True, slots=True)
class FrEntry:
    """One entry of a rank's ring buffer, normalised.

    Attributes:
        rank: global rank that recorded it (None when the dump's rank is unknown).
        pg: process-group name; ``pg_desc``: its description; ``pg_id``: local uid.
        seq: ``collective_seq_id``; ``p2p_seq``: ``p2p_seq_id``; ``is_p2p``.
        op: ``profiling_name`` without the ``nccl:`` prefix (``all_reduce``, ``send 8->0``).
        input_sizes / output_sizes: shapes per tensor (lists of ints).
        input_dtypes / output_dtypes: dtype names (``Float``, ``BFloat16``).
        state: ``scheduled``, ``started`` or ``completed``.
        time_created_ns: when it was enqueued (ns since the epoch); ``timeout_ms``.
        record_id: position in the rank's ring buffer.
        retired: whether the recorder retired it (its work finished), None when not dumped.
        op_id: the group's count of every operation issued, send/recv included (None: not
            dumped); ``backend``: the ``profiling_name`` prefix (``nccl``, ``gloo``; empty:
            none).
    """

    rank: int | None
    pg: str
    pg_desc: str
    pg_id: str | None
    seq: int
    p2p_seq: int
    is_p2p: bool
    op: str
    input_sizes: tuple[tuple[int, ...], ...]
    output_sizes: tuple[tuple[int, ...], ...]
    input_dtypes: tuple[str, ...]
    output_dtypes: tuple[str, ...]
    state: str
    time_created_ns: int | None
    timeout_ms: int | None
    record_id: int | None
    retired: bool | None = None
    op_id: int | None = None
    backend: str = ""

    @property
    def finished(self) -> bool:
        """Completed, or retired by the recorder (gloo leaves ``state`` at ``scheduled``)."""
        return self.state == "completed" or bool(self.retired)

    @property
    def signature(self) -> tuple:
        """What must agree across ranks: op, shapes, dtypes."""
        return (self.op, self.input_sizes, self.output_sizes, self.input_dtypes,
                self.output_dtypes)


@dataclass(frozen=True, slots=True)
class PgStatus:
    """``pg_status`` of one group on one rank (-1: none yet): sequence numbers of the last
    collective enqueued, started and completed (and of point-to-point operations, which newer
    versions count apart: ``last_*_p2p``, None when not dumped)."""

    last_enqueued: int
    last_started: int
    last_completed: int
    last_enqueued_p2p: int | None = None
    last_completed_p2p: int | None = None


@dataclass(slots=True)
class FlightRecorderDump:
    """One rank's dump, normalised.

    Attributes:
        rank: global rank (from the file name's trailing digits, as PyTorch's reader does).
        version: dump format version string.
        groups: pg name -> (description, member ranks).
        status: pg name -> :class:`PgStatus` (only groups this rank has entries for).
        status_by_id: pg uid -> :class:`PgStatus` as dumped.
        entries: the entries, in ring-buffer order.
        source: file it came from.
    """

    rank: int | None
    version: str
    groups: dict[str, tuple[str, tuple[int, ...]]]
    status: dict[str, PgStatus]
    status_by_id: dict[str, PgStatus]
    entries: list[FrEntry]
    source: str = ""
    nccl_version: str | None = None
    notes: list[str] = field(default_factory=list)


def _shapes(value: Any) -> tuple[tuple[int, ...], ...]:
    """``[[3, 4], [5]]`` -> ``((3, 4), (5,))``; anything else -> ``()``."""
    if not isinstance(value, (list, tuple)):
        return ()
    return tuple(tuple(int(d) for d in shape if isinstance(d, int))
                 for shape in value if isinstance(shape, (list, tuple)))


def _names(value: Any) -> tuple[str, ...]:
    return tuple(str(v) for v in value) if isinstance(value, (list, tuple)) else ()


def _int(value: Any, default: int | None = None) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: inf from a JSON dump
        return default


def _count(value: Any, default: int) -> int:
    number = _int(value)
    return default if number is None else number


def _ranks(value: Any) -> tuple[int, ...]:
    if isinstance(value, str):
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            return ()
    if isinstance(value, (list, tuple, set)):
        return tuple(sorted(int(v) for v in value if _int(v) is not None))
    return ()


def rank_from_filename(path: str) -> int | None:
    """Trailing digits of the file name (``_dump_9`` -> 9, ``trace_rank3.json`` -> 3)."""
    m = re.search(r"(\d+)(?:\.\w+)?$", os.path.basename(path))
    return int(m.group(1)) if m else None


def parse_dump(raw: dict[str, Any], rank: int | None = None, source: str = "") -> \
        FlightRecorderDump:
    """Normalise a loaded dump dict.

    Raises:
        DumpError: it is not a dict with ``entries``.
    """
    if not isinstance(raw, dict) or not isinstance(raw.get("entries", None), list):
        raise DumpError("not a flight-recorder dump: no 'entries' list")
    pg_config: dict[Any, Any] = raw["pg_config"] if isinstance(raw.get("pg_config"), dict) else {}
    pg_status: dict[Any, Any] = raw["pg_status"] if isinstance(raw.get("pg_status"), dict) else {}
    groups: dict[str, tuple[str, tuple[int, ...]]] = {}
    for name, cfg in pg_config.items():
        if isinstance(cfg, dict):
            groups[str(name)] = (str(cfg.get("desc", "")), _ranks(cfg.get("ranks")))
    entries = []
    pg_id_to_name: dict[str, str] = {}
    for e in raw["entries"]:
        if not isinstance(e, dict):
            continue
        pg = e.get("process_group")
        if isinstance(pg, (list, tuple)) and pg:
            pg_name, pg_desc = str(pg[0]), str(pg[1]) if len(pg) >= 2 else ""
        else:
            pg_name, pg_desc = str(pg if pg is not None else "?"), ""
        pg_id = str(e["pg_id"]) if e.get("pg_id") is not None else None
        if pg_id is not None:
            pg_id_to_name[pg_id] = pg_name
        op = str(e.get("profiling_name") or "")
        entries.append(FrEntry(
            rank=rank, pg=pg_name, pg_desc=pg_desc, pg_id=pg_id,
            seq=_count(e.get("collective_seq_id"), -1), p2p_seq=_count(e.get("p2p_seq_id"), 0),
            is_p2p=bool(e.get("is_p2p", False)), op=op.split(":", 1)[-1],
            input_sizes=_shapes(e.get("input_sizes")),
            output_sizes=_shapes(e.get("output_sizes")),
            input_dtypes=_names(e.get("input_dtypes")),
            output_dtypes=_names(e.get("output_dtypes")),
            state=str(e.get("state", "")), time_created_ns=_int(e.get("time_created_ns")),
            timeout_ms=_int(e.get("timeout_ms")), record_id=_int(e.get("record_id")),
            retired=e["retired"] if isinstance(e.get("retired"), bool) else None,
            op_id=_int(e.get("op_id")), backend=op.split(":", 1)[0] if ":" in op else "",
        ))
    status_by_id = {}
    for key, st in pg_status.items():
        if isinstance(st, dict):
            status_by_id[str(key)] = PgStatus(
                _count(st.get("last_enqueued_collective"), -1),
                _count(st.get("last_started_collective"), -1),
                _count(st.get("last_completed_collective"), -1),
                _int(st.get("last_enqueued_p2p")), _int(st.get("last_completed_p2p")))
    status = {pg_id_to_name[k]: v for k, v in status_by_id.items() if k in pg_id_to_name}
    version = str(raw.get("version", ""))
    return FlightRecorderDump(
        rank=rank, version=version, groups=groups, status=status,
        status_by_id=status_by_id, entries=entries, source=source,
        nccl_version=raw.get("nccl_version") or raw.get("comm_lib_version") or None,
        notes=_format_notes(raw, version))


#: Newest dump format version whose fields this reader was written against (torch 2.13 writes
#: "2.10"); a newer one is read by the same field names, with a note.
KNOWN_VERSION = (2, 10)
_KNOWN_KEYS = frozenset({"version", "pg_config", "pg_status", "entries", "nccl_version",
                         "comm_lib_version", "dump_ts", "stacks", "frames", "pg_status_p2p"})


def _format_notes(raw: dict[str, Any], version: str) -> list[str]:
    notes = []
    parts = re.findall(r"\d+", version)
    if len(parts) >= 2 and (int(parts[0]), int(parts[1])) > KNOWN_VERSION:
        notes.append(f"dump format version {version} is newer than "
                     f"{KNOWN_VERSION[0]}.{KNOWN_VERSION[1]}, the newest known: read by the "
                     f"known field names")
    unknown = sorted(str(k) for k in raw if k not in _KNOWN_KEYS)
    if unknown:
        notes.append(f"unknown top-level field(s) ignored: {', '.join(unknown[:8])}")
    return notes


_PICKLE_MAGIC = re.compile(rb"^\x80[\x02-\x05]")


def load_dump(path: str) -> FlightRecorderDump:
    """Read one dump file in any of the three encodings.

    Raises:
        DumpError: too large, truncated, corrupt, a refused class, or not a dump. The message
            says which.
        OSError: the file cannot be read.
    """
    size = os.path.getsize(path)
    if size > MAX_DUMP_BYTES:
        raise DumpError(f"{size} bytes is larger than the {MAX_DUMP_BYTES}-byte limit for a dump")
    rank = rank_from_filename(path)
    with open(path, "rb") as f:
        head = f.read(2)
        f.seek(0)
        if _PICKLE_MAGIC.match(head):
            try:
                raw = RestrictedUnpickler(f).load()
            except EOFError as exc:
                raise DumpError("truncated pickle (ends before its STOP opcode)") from exc
            except (pickle.UnpicklingError, ValueError, TypeError, IndexError, KeyError,
                    AttributeError, MemoryError, RecursionError) as exc:
                raise DumpError(f"corrupt or unsafe pickle: {exc}") from exc
            return parse_dump(raw, rank, path)
        if size > MAX_TEXT_DUMP_BYTES:
            raise DumpError(f"text dump of {size} bytes exceeds {MAX_TEXT_DUMP_BYTES} bytes")
        text = f.read().decode("utf-8", errors="replace")
    return parse_dump(_load_text(text), rank, path)


def _load_text(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        pass
    except RecursionError as exc:  # nested deeper than json's recursion allows
        raise DumpError("JSON nested too deeply for a dump") from exc
    try:
        return ast.literal_eval(_python_literal(text))
    except (ValueError, SyntaxError, MemoryError, RecursionError, tokenize.TokenError) as exc:
        raise DumpError(f"neither JSON nor a printed dump: {exc}") from exc


def _python_literal(text: str) -> str:
    """Turn JSON-with-tuples (a printed dump) into a Python literal: null/true/false become
    None/True/False and the ``...`` PyTorch's docs use for "more entries" is dropped."""
    source = "(" + text + "\n)"
    lines = source.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    swaps = {"null": "None", "true": "True", "false": "False", "...": ""}
    out, last = [], 0
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.string in swaps and tok.type in (tokenize.NAME, tokenize.OP):
            start = offsets[tok.start[0] - 1] + tok.start[1]
            end = offsets[tok.end[0] - 1] + tok.end[1]
            out.append(source[last:start])
            out.append(swaps[tok.string])
            last = end
    out.append(source[last:])
    return "".join(out)


@dataclass(frozen=True, slots=True)
class FrTraceIssue:
    """One problem reported by PyTorch's ``torchfrtrace`` analyser in its text output.

    Attributes:
        kind: ``"not_all_joined"`` or ``"mismatch"``.
        collective: the collective number (``Not all ranks joining collective N``).
        entry: entry index on the first rank.
        group: ``pg_name:desc``; ``op``: ``nccl:all_reduce``...
        missing_ranks: ranks that did not join; ``expected_ranks``: group size.
        input_sizes / output_sizes / state: as printed; ``detail``: a mismatch's description.
    """

    kind: str
    collective: int | None = None
    entry: int | None = None
    group: str | None = None
    op: str | None = None
    missing_ranks: tuple[int, ...] = ()
    expected_ranks: int | None = None
    input_sizes: str | None = None
    output_sizes: str | None = None
    state: str | None = None
    detail: str | None = None


_FR_NOT_ALL = re.compile(r"Not all ranks joining collective (\d+) at entry (\d+)")
_FR_FIELD = re.compile(r"^\s*(group info|collective|missing ranks|input sizes|output sizes|"
                       r"expected ranks|collective state):\s*(.*)$")
_FR_MISMATCH = re.compile(r"(?:does not match|mismatch)", re.IGNORECASE)


def parse_fr_trace_report(lines: Iterable[str]) -> list[FrTraceIssue]:
    """Parse ``torchfrtrace``'s human-readable report into issues."""
    issues: list[FrTraceIssue] = []
    current: dict[str, Any] | None = None

    def close() -> None:
        if current is not None:
            issues.append(FrTraceIssue(**current))

    for line in lines:
        m = _FR_NOT_ALL.search(line)
        if m:
            close()
            current = {"kind": "not_all_joined", "collective": int(m.group(1)),
                       "entry": int(m.group(2))}
            continue
        f = _FR_FIELD.match(line)
        if f and current is not None:
            key, value = f.group(1), f.group(2).strip()
            if key == "group info":
                current["group"] = value
            elif key == "collective":
                current["op"] = value
            elif key == "missing ranks":
                current["missing_ranks"] = tuple(sorted(int(x) for x in re.findall(r"\d+", value)))
            elif key == "expected ranks":
                current["expected_ranks"] = _int(value)
            elif key == "input sizes":
                current["input_sizes"] = value
            elif key == "output sizes":
                current["output_sizes"] = value
            elif key == "collective state":
                current["state"] = value
            continue
        if _FR_MISMATCH.search(line) and "Expected" in line:
            close()
            current = None
            issues.append(FrTraceIssue(kind="mismatch", detail=line.strip()))
    close()
    return issues
