"""Hangs and long checkpoints injected into the demo's ranks, and rank 0's report of a hang.

``laggard demo --inject hang=rank:R,step:S,kind:K`` stops rank R at step S (the loop's 0-based
step index, as ``--slow-from``) in one of these ways:

* ``python``: the training thread enters one C call that never releases Python's interpreter
  lock (a ``sum`` over a range of 10**15 integers): nothing else of the process runs Python,
  the monitor's heartbeat thread included, so the rank falls *silent* while its process lives.
* ``spin``: the training thread spins in a pure-Python loop. The interpreter hands its lock to
  other threads every switch interval (5 ms), so the heartbeat thread goes on: the rank is alive,
  in its ``forward`` phase, and never issues the step's collectives (*missing*).
* ``data``: the rank's data loader blocks (it waits on an event that is never set) in the step's
  ``data`` phase (*missing*, last in phase ``data``).
* ``skip``: the rank skips one collective, the step's first gradient all-reduce (its DDP hook
  returns the bucket unreduced). Its next all-reduce would be matched by gloo (which tags a
  group's collectives by their count) with the others' skipped one, a bucket of another size,
  and fail rather than hang; so the rank waits where it would issue it, as an NCCL rank whose
  next collective never matches its peers' does (*missing*, in ``backward``).
* ``device``: ``--device emulated-async`` only: the rank's emulated stream issues the step's
  first gradient all-reduce, the peers complete it, and the stream never completes it (its
  thread stays blocked after the collective, as a GPU stream stuck behind a hung kernel):
  *stuck on the device*.

``--inject checkpoint=step:S,factor:F`` makes step S take about F times the usual step on every
rank: a ``checkpoint`` phase that serialises the model's state (``torch.save`` into memory)
until ``F - 1`` times the rank's median step so far has passed. Slow, not hung: no hang may be
reported.

Rank R writes a *marker* (JSON: rank, kind, step, wall-clock time) just before it hangs; rank 0's
monitor calls :class:`HangReportWriter` (``TrainingMonitor.Config(on_hang=...)``) from its
heartbeat thread with each hang it names, which appends it as a JSON line. The demo's launcher
(:mod:`laggard.demo.local`) reads both, judges the report against :data:`EXPECTED_KIND` and
stops the job. Nothing here imports torch at module level: the launcher parses flags without it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["EXPECTED_KIND", "HANG_KINDS", "CheckpointInjection", "HangInjection",
           "HangReportWriter", "parse_inject", "parse_spec", "read_json_lines", "verdict_of"]

#: Injected kind -> what it does to the rank (the demo's one-line description).
HANG_KINDS: dict[str, str] = {
    "python": "its training thread holds Python's interpreter lock in one C call (heartbeat "
              "stops)",
    "spin": "its training thread spins in a pure-Python loop (heartbeat goes on)",
    "data": "its data loader blocks",
    "skip": "it skips one gradient all-reduce and waits before the next",
    "device": "its emulated stream never completes a gradient all-reduce",
}
#: Injected kind -> the culprit kind of ``laggard.detectors.hang`` a correct report names.
EXPECTED_KIND: dict[str, str] = {
    "python": "silent", "spin": "missing", "data": "missing", "skip": "missing",
    "device": "device",
}
#: Integers the ``python`` hang sums: hours of one C loop, never a bytecode boundary.
_GIL_HOLD_RANGE = 10**15


@dataclass(frozen=True, slots=True)
class HangInjection:
    """``hang=rank:R,step:S,kind:K``: rank ``rank`` hangs at step ``step`` in way ``kind``.

    Attributes:
        rank: the global rank that hangs.
        step: the loop's step index (0-based, as ``--slow-from``) at which it hangs, >= 1 so
            that every rank has a step time before it.
        kind: one of :data:`HANG_KINDS`.

    Raises:
        ValueError: an unknown kind, a negative rank, a step below 1.
    """

    rank: int
    step: int
    kind: str

    def __post_init__(self) -> None:
        if self.kind not in HANG_KINDS:
            raise ValueError(f"unknown hang kind {self.kind!r} (kinds: {', '.join(HANG_KINDS)})")
        if self.rank < 0:
            raise ValueError(f"rank {self.rank} must be >= 0")
        if self.step < 1:
            raise ValueError(f"step {self.step} must be >= 1 (the ranks need a step time first)")

    @property
    def expected_kind(self) -> str:
        """The culprit kind a correct report names (:data:`EXPECTED_KIND`)."""
        return EXPECTED_KIND[self.kind]

    def spec(self) -> str:
        """The flag's text for this injection (what :func:`parse_inject` reads back)."""
        return f"hang=rank:{self.rank},step:{self.step},kind:{self.kind}"

    def check(self, world_size: int, steps: int, *, device: str = "cpu",
              parallel: str = "ddp") -> str | None:
        """Why this injection cannot run in that demo (one line), or None when it can."""
        if self.rank >= world_size:
            return f"rank {self.rank} outside the world of {world_size} ranks (0-{world_size - 1})"
        if self.step >= steps:
            return f"step {self.step} not before --steps {steps}"
        if self.kind == "python" and self.rank == 0:
            return ("kind python on rank 0 stops rank 0's own heartbeat thread, which names "
                    "hangs in the job: choose another rank")
        if self.kind == "device" and device != "emulated-async":
            return "kind device needs --device emulated-async (the emulated stream)"
        if self.kind in ("skip", "device") and parallel != "ddp":
            return f"kind {self.kind} acts in the DDP communication hook: use --parallel ddp"
        return None


@dataclass(frozen=True, slots=True)
class CheckpointInjection:
    """``checkpoint=step:S,factor:F``: step ``step`` takes about ``factor`` times the usual
    step on every rank (a long checkpoint save; slow, not hung).

    Raises:
        ValueError: a step below 1, a factor not above 1.
    """

    step: int
    factor: float

    def __post_init__(self) -> None:
        if self.step < 1:
            raise ValueError(f"step {self.step} must be >= 1 (the ranks need a step time first)")
        if not 1.0 < self.factor <= 1000.0:
            raise ValueError(f"factor {self.factor:g} must be in (1, 1000]")

    def spec(self) -> str:
        """The flag's text for this injection."""
        return f"checkpoint=step:{self.step},factor:{self.factor:g}"

    def check(self, world_size: int, steps: int, **_: Any) -> str | None:
        """Why this injection cannot run in that demo, or None."""
        return f"step {self.step} not before --steps {steps}" if self.step >= steps else None


_FIELDS: dict[str, tuple[type[Any], dict[str, type[Any]]]] = {
    "hang": (HangInjection, {"rank": int, "step": int, "kind": str}),
    "checkpoint": (CheckpointInjection, {"step": int, "factor": float}),
}
#: The forms :func:`parse_inject` reads, for its error message.
_USAGE = "hang=rank:R,step:S,kind:K or checkpoint=step:S,factor:F"


def parse_inject(spec: str) -> HangInjection | CheckpointInjection:
    """Read one ``--inject`` value: ``hang=rank:R,step:S,kind:K`` or
    ``checkpoint=step:S,factor:F`` (every key required, in any order).

    Raises:
        ValueError: an unknown injection, key or kind, a missing key, a value of the wrong type
            or out of range; the message is one line.
    """
    return parse_spec(spec, _FIELDS, _USAGE)


def parse_spec(spec: str, fields: dict[str, tuple[type[Any], dict[str, type[Any]]]],
               usage: str, defaults: dict[str, dict[str, Any]] | None = None) -> Any:
    """Read ``WHAT=key:value,key:value`` into ``fields[WHAT]``'s class (the parser of every
    ``--inject`` form: :func:`parse_inject`, :func:`laggard.demo.injections.parse_injection`).

    Args:
        spec: the flag's value.
        fields: ``WHAT`` -> (class, key -> type); the class is called with the keys.
        usage: the accepted forms, for the message on an unknown ``WHAT``.
        defaults: ``WHAT`` -> key -> value of the keys that may be left out.

    Raises:
        ValueError: an unknown ``WHAT`` or key, a key given twice or missing, a value of the
            wrong type, or what the class refuses; the message is one line.
    """
    what, sep, rest = spec.strip().partition("=")
    if not sep or what not in fields:
        raise ValueError(f"expected {usage}, got {spec!r}")
    cls, types = fields[what]
    values: dict[str, Any] = {}
    for part in rest.split(","):
        key, sep, value = part.partition(":")
        key, value = key.strip(), value.strip()
        if not sep or not value:
            raise ValueError(f"{what}: expected key:value, got {part!r}")
        if key not in types:
            raise ValueError(f"{what}: unknown key {key!r} (keys: {', '.join(types)})")
        if key in values:
            raise ValueError(f"{what}: {key} given twice")
        try:
            values[key] = types[key](value)
        except ValueError:
            raise ValueError(f"{what}: {key} must be {types[key].__name__}, got {value!r}") \
                from None
    values = {**(defaults or {}).get(what, {}), **values}
    missing = [k for k in types if k not in values]
    if missing:
        raise ValueError(f"{what}: missing {', '.join(missing)} (keys: {', '.join(types)})")
    return cls(**values)


# ------------------------------------------------------------------------- in the rank
def write_marker(path: str, injection: HangInjection) -> None:
    """Say, on the hanging rank, that the hang begins now (wall clock: the launcher runs on
    the same machine, so the seconds to name are one clock's difference)."""
    if not path:
        return
    doc = {"rank": injection.rank, "step": injection.step, "kind": injection.kind,
           "time": time.time(), "pid": os.getpid()}
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, path)


def hang_forever(kind: str) -> None:
    """Hang the calling thread in the way ``kind`` says; returns only if the process is ending."""
    if kind == "python":
        # One C loop over int objects: no bytecode boundary, so the interpreter lock is never
        # offered to another thread (CPython's eval breaker runs between bytecodes only).
        sum(range(_GIL_HOLD_RANGE))
    elif kind == "spin":
        while True:  # bytecodes: the lock is handed over every switch interval
            pass
    threading.Event().wait()  # data, skip, device: blocked, no CPU


class HangingHook:
    """A DDP communication hook around another that makes rank ``rank`` skip, or never
    complete, the first gradient all-reduce of step ``step`` (kinds ``skip`` and ``device``).

    Register :meth:`as_hook`. The worker sets :attr:`step` to the loop's step index before
    each step. Rank-local: on the other ranks (or other steps) it calls the inner hook and
    nothing else.

    Args:
        inner: the hook to wrap, ``inner(state, bucket) -> Future``.
        injection: the hang (its kind ``skip`` or ``device``).
        rank: this process' global rank.
        marker: where :func:`write_marker` writes.
        timer: the job's ``CommTimer``: kind ``device`` hands it the collective's future that
            never completes (issued on this rank's tracer, never completed).
    """

    def __init__(self, inner: Any, injection: HangInjection, rank: int, marker: str,
                 timer: Any = None) -> None:
        self.inner = inner
        self.timer = timer
        self.injection = injection
        self.active = rank == injection.rank and injection.kind in ("skip", "device")
        self.marker = marker
        self.step = -1
        self._calls = 0
        self._seen_step = -1

    def as_hook(self) -> Any:
        """The hook function to register (DDP wants a function with a ``__name__``, its
        ``bucket`` parameter unannotated or annotated ``dist.GradBucket``)."""

        def hanging_hook(state, bucket):  # type: ignore[no-untyped-def]
            return self._call(state, bucket)

        return hanging_hook

    def _call(self, state: Any, bucket: Any) -> Any:
        if not self.active or self.step != self.injection.step:
            return self.inner(state, bucket)
        if self._seen_step != self.step:
            self._seen_step, self._calls = self.step, 0
        self._calls += 1
        if self.injection.kind == "skip":
            if self._calls == 1:
                write_marker(self.marker, self.injection)
                import torch

                fut: Any = torch.futures.Future()
                fut.set_result(bucket.buffer())  # unreduced: the all-reduce never issued
                return fut
            hang_forever("skip")  # where the next all-reduce would be issued
        # device: the collective runs, so the peers complete it, but the future this rank's
        # tracer watches never completes, and the stream thread stays blocked after it
        import torch
        import torch.distributed as dist

        buffer = bucket.buffer()
        group = dist.group.WORLD
        buffer.div_(group.size())
        dist.all_reduce(buffer, group=group, async_op=True)
        if self.timer is not None:
            self.timer.track(torch.futures.Future(), 4 * buffer.numel())
        write_marker(self.marker, self.injection)
        hang_forever("device")
        return None  # never reached


def checkpoint_save(model: Any, seconds: float) -> int:
    """Serialise ``model``'s state into memory until ``seconds`` have passed (a checkpoint
    save's work: pickling, copying tensors); returns how many times it was saved."""
    import io

    import torch

    deadline = time.perf_counter() + max(0.0, seconds)
    saves = 0
    while True:
        buffer = io.BytesIO()
        torch.save(model.state_dict(), buffer)
        saves += 1
        if time.perf_counter() >= deadline:
            return saves


# ------------------------------------------------------------------------ rank 0's report
class HangReportWriter:
    """``TrainingMonitor.Config(on_hang=...)`` for rank 0: append each hang report as a JSON
    line (with the wall-clock time it arrived) to ``path``. Never raises into the monitor."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.errors = 0
        self._lock = threading.Lock()

    def __call__(self, report: Any) -> None:
        try:
            doc = {"time": time.time(), "report": to_jsonable(report)}
            line = json.dumps(doc, default=str) + "\n"
            with self._lock, open(self.path, "a") as f:
                f.write(line)
        except Exception:  # noqa: BLE001 - the monitor's thread must go on
            self.errors += 1


def to_jsonable(value: Any) -> Any:
    """A dataclass, mapping, sequence or plain value as JSON-ready data (for reports)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if hasattr(value, "ranks") and "ranks" not in out:
            out["ranks"] = to_jsonable(value.ranks)
        return out
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_jsonable(v) for v in value]
    if hasattr(value, "to_dict"):
        return to_jsonable(value.to_dict())
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


# ----------------------------------------------------------------------- the launcher's
def read_json_lines(path: Path) -> list[dict[str, Any]]:
    """Every complete JSON line of ``path`` (none when it does not exist; a line being written
    is left for the next read)."""
    try:
        text = path.read_text()
    except OSError:
        return []
    docs = []
    for line in text.splitlines(keepends=True):
        if not line.endswith("\n"):
            break
        try:
            docs.append(json.loads(line))
        except ValueError:
            continue
    return docs


def verdict_of(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The culprits of one hang report (the JSON of rank 0's ``on_hang`` argument): a list of
    ``{"rank", "kind", ...}`` (the fields of ``laggard.detectors.hang.HangCulprit``)."""
    verdict = report.get("verdict", report)
    if isinstance(verdict, dict):
        culprits = verdict.get("culprits", [])
    else:
        culprits = verdict
    return [c for c in culprits if isinstance(c, dict) and "rank" in c]


def describe_injection(injection: HangInjection | CheckpointInjection) -> str:
    """One phrase for the demo's first line."""
    if isinstance(injection, HangInjection):
        return (f"rank {injection.rank} hangs at step {injection.step} (kind {injection.kind}: "
                f"{HANG_KINDS[injection.kind]})")
    return (f"step {injection.step} takes {injection.factor:g}x the usual on every rank "
            f"(a long checkpoint: slow, not hung)")


def hang_outcome(injection: HangInjection | None, marker: dict[str, Any] | None,
                 reports: list[dict[str, Any]], bound_seconds: float, *,
                 checked: bool = True) -> dict[str, Any]:
    """What the demo says of a run's hangs: the injected one against rank 0's reports.

    Args:
        injection: the injected hang, or None (a clean run, a checkpoint run).
        marker: what the hanging rank wrote when it hung (``time``: wall clock), or None when
            it did not get there.
        reports: rank 0's hang reports (:class:`HangReportWriter`'s lines), in order.
        bound_seconds: how long after the hang a report counts.
        checked: whether rank 0's monitor could report hangs at all (``on_hang``).

    Returns:
        A JSON-ready dict: ``injected`` (or None), ``checked``, ``named`` (a report within the
        bound after the hang began), ``seconds_to_name``, ``culprits`` (the first such report's),
        ``correct`` (it names the injected rank with :data:`EXPECTED_KIND`, and no other rank),
        ``false_reports`` (reports before the hang, or in a run with none injected), ``report``.
    """
    began = marker.get("time") if marker else None
    false = [r for r in reports if injection is None or began is None or r["time"] < began]
    after = [r for r in reports if injection is not None and began is not None
             and began <= r["time"] <= began + bound_seconds]
    first = after[0] if after else None
    culprits = verdict_of(first["report"]) if first else []
    correct = None
    if injection is not None:
        correct = bool(culprits) and all(
            c["rank"] == injection.rank and c.get("kind") == injection.expected_kind
            for c in culprits)
    return {
        "injected": None if injection is None else {
            "rank": injection.rank, "step": injection.step, "kind": injection.kind,
            "expected_kind": injection.expected_kind, "spec": injection.spec()},
        "checked": checked,
        "began": began is not None,
        "bound_seconds": bound_seconds,
        "named": first is not None,
        "seconds_to_name": None if first is None else round(first["time"] - began, 3),
        "culprits": culprits,
        "correct": correct,
        "report": None if first is None else first["report"],
        "false_reports": [r["report"] for r in false],
    }


def format_hang(outcome: dict[str, Any]) -> str:
    """The report's hang lines (see :func:`hang_outcome`)."""
    lines: list[str] = []
    injected = outcome["injected"]
    if not outcome["checked"]:
        if injected is not None:
            lines.append(f"hang injected: rank {injected['rank']} at step {injected['step']}, "
                         f"kind {injected['kind']}")
        lines.append("hangs: not checked (this TrainingMonitor has no on_hang report)")
        return "\n".join(lines)
    if injected is None:
        false = outcome["false_reports"]
        lines.append("hangs: none reported by rank 0's monitor" if not false else
                     f"hangs: {len(false)} reported with none injected (false): "
                     + "; ".join(_culprits_text(verdict_of(r)) or _message(r) for r in false))
        return "\n".join(lines)
    lines.append(f"hang injected: rank {injected['rank']} at step {injected['step']}, kind "
                 f"{injected['kind']} ({HANG_KINDS[injected['kind']]}); a correct report "
                 f"names rank {injected['rank']} {injected['expected_kind']}")
    if not outcome["began"]:
        lines.append("  the rank did not reach the hang (the job ended first)")
    elif not outcome["named"]:
        lines.append(f"  NOT named within {outcome['bound_seconds']:g} s of the hang")
    else:
        culprits = _culprits_text(outcome["culprits"]) or "no rank"
        lines.append(f"  named by rank 0 after {outcome['seconds_to_name']:.1f} s: {culprits}")
        message = _message(outcome["report"])
        if message:
            lines.append(f"  its log: {message}")
        lines.append("  correct: the injected rank and kind, no other rank" if outcome["correct"]
                     else "  WRONG: not the injected rank and kind alone")
    for r in outcome["false_reports"]:
        lines.append(f"  before the hang (false): {_culprits_text(verdict_of(r)) or _message(r)}")
    return "\n".join(lines)


def _culprits_text(culprits: list[dict[str, Any]]) -> str:
    parts = []
    for c in culprits:
        where = ""
        if c.get("op") or c.get("seq") is not None:
            where = f" in {c.get('op') or 'collective'}"
            where += f" #{c['seq']}" if c.get("seq") is not None else ""
        if c.get("group") or c.get("desc"):
            where += f" of group {c.get('desc') or c.get('group')}"
        parts.append(f"rank {c['rank']} {c.get('kind', '?')}{where}")
    return "; ".join(parts)


def _message(report: Any) -> str:
    if isinstance(report, dict):
        for key in ("message", "line", "text"):
            if isinstance(report.get(key), str):
                return report[key]
    return ""
