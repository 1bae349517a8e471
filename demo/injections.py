"""The demo's injected *causes* of a slow rank that are not a slow GPU, and every ``--inject`` form.

Beside ``hang=...`` and ``checkpoint=...`` (:mod:`laggard.demo.hang`), ``laggard demo --inject``
takes (the causes of stragglers in Lin et al., "Understanding Stragglers in Large Model Training
Using What-if Analysis", OSDI'25):

* ``gc=rank:R``: from ``--slow-from`` on, rank R builds cyclic garbage every step (small
  self-referencing lists, freed only by Python's cycle collector), sized as it runs so that the
  collector spends about 30% of the rank's step (:class:`CyclicGarbage`); a real job's cause: a
  training loop that leaves reference cycles behind (closures, exceptions, object graphs).
* ``tokens=rank:R,factor:F``: rank R's sequences are F times longer (default 1.3): more work,
  not a slower rank. Every rank notes its tokens per step (``monitor.note("tokens", n)``);
  ``note:off`` leaves the note out, to see what is reported without it. With ``--parallel pp``
  the whole pipeline of rank R (every stage of its data-parallel replica) gets the longer
  sequences: a microbatch's activations go through all of them.
* ``stage=stage:S,layers:N`` (``--parallel pp`` only): stage S holds N more transformer blocks
  than the balanced split: a pipeline-stage imbalance, every rank of stage S alike.

Nothing here imports torch at module level: the launcher parses flags without it.
"""

from __future__ import annotations

import gc
import threading
import time
from dataclasses import dataclass
from typing import Any

from laggard.demo.hang import _FIELDS as _HANG_FIELDS
from laggard.demo.hang import CheckpointInjection, HangInjection, describe_injection, parse_spec

__all__ = ["CAUSE_INJECTIONS", "CyclicGarbage", "GcInjection", "StageInjection",
           "TokensInjection", "describe", "parse_injection"]

#: Share of the injected rank's step that :class:`CyclicGarbage` makes Python's collector take.
GC_SHARE = 0.3
#: Most extra blocks ``stage=...,layers:N`` adds.
MAX_EXTRA_LAYERS = 8


@dataclass(frozen=True, slots=True)
class GcInjection:
    """``gc=rank:R``: rank R builds cyclic garbage every step (:class:`CyclicGarbage`).

    Raises:
        ValueError: a negative rank.
    """

    rank: int

    def __post_init__(self) -> None:
        if self.rank < 0:
            raise ValueError(f"rank {self.rank} must be >= 0")

    def spec(self) -> str:
        """The flag's text (what :func:`parse_injection` reads back)."""
        return f"gc=rank:{self.rank}"

    def check(self, world_size: int, steps: int, *, device: str = "cpu",
              parallel: str = "ddp") -> str | None:
        """Why this injection cannot run in that demo (one line), or None."""
        return _check_rank(self.rank, world_size, device)


@dataclass(frozen=True, slots=True)
class TokensInjection:
    """``tokens=rank:R,factor:F[,note:off]``: rank R's sequences are ``factor`` times longer.

    Raises:
        ValueError: a negative rank, a factor outside (1, 4], a note other than on/off.
    """

    rank: int
    factor: float = 1.3
    note: str = "on"

    def __post_init__(self) -> None:
        if self.rank < 0:
            raise ValueError(f"rank {self.rank} must be >= 0")
        if not 1.0 < self.factor <= 4.0:
            raise ValueError(f"factor {self.factor:g} must be in (1, 4]")
        if self.note not in ("on", "off"):
            raise ValueError(f"note must be on or off, got {self.note!r}")

    @property
    def noted(self) -> bool:
        """Every rank notes its tokens per step (``monitor.note("tokens", n)``)."""
        return self.note == "on"

    def spec(self) -> str:
        """The flag's text."""
        return f"tokens=rank:{self.rank},factor:{self.factor:g},note:{self.note}"

    def check(self, world_size: int, steps: int, *, device: str = "cpu",
              parallel: str = "ddp") -> str | None:
        """Why this injection cannot run in that demo, or None."""
        return _check_rank(self.rank, world_size, device)

    def seq_len(self, base: int) -> int:
        """The injected rank's sequence length for a base of ``base`` tokens."""
        return max(base + 1, round(base * self.factor))


@dataclass(frozen=True, slots=True)
class StageInjection:
    """``stage=stage:S,layers:N``: pipeline stage S holds N more blocks (``--parallel pp``).

    Raises:
        ValueError: a negative stage, N outside [1, :data:`MAX_EXTRA_LAYERS`].
    """

    stage: int
    layers: int

    def __post_init__(self) -> None:
        if self.stage < 0:
            raise ValueError(f"stage {self.stage} must be >= 0")
        if not 1 <= self.layers <= MAX_EXTRA_LAYERS:
            raise ValueError(f"layers {self.layers} must be in [1, {MAX_EXTRA_LAYERS}]")

    def spec(self) -> str:
        """The flag's text."""
        return f"stage=stage:{self.stage},layers:{self.layers}"

    def check(self, world_size: int, steps: int, *, device: str = "cpu",
              parallel: str = "ddp") -> str | None:
        """Why this injection cannot run in that demo, or None."""
        if parallel != "pp":
            return "a stage imbalance needs pipeline stages: use --parallel pp"
        if self.stage >= 2:
            return f"stage {self.stage} outside the demo's 2 pipeline stages (0-1)"
        return None


def _check_rank(rank: int, world_size: int, device: str) -> str | None:
    if rank >= world_size:
        return f"rank {rank} outside the world of {world_size} ranks (0-{world_size - 1})"
    if device != "cpu":
        return "the cause injections run with --device cpu"
    return None


#: Every injection other than hangs and checkpoints.
CAUSE_INJECTIONS = (GcInjection, TokensInjection, StageInjection)
_FIELDS: dict[str, tuple[type[Any], dict[str, type[Any]]]] = {
    **_HANG_FIELDS,
    "gc": (GcInjection, {"rank": int}),
    "tokens": (TokensInjection, {"rank": int, "factor": float, "note": str}),
    "stage": (StageInjection, {"stage": int, "layers": int}),
}
_DEFAULTS: dict[str, dict[str, Any]] = {"tokens": {"factor": 1.3, "note": "on"}}
_USAGE = ("hang=rank:R,step:S,kind:K, checkpoint=step:S,factor:F, gc=rank:R, "
          "tokens=rank:R[,factor:F][,note:off] or stage=stage:S,layers:N")

Injection = HangInjection | CheckpointInjection | GcInjection | TokensInjection | StageInjection


def parse_injection(spec: str) -> Injection:
    """Read one ``--inject`` value, any form (module docstring; hangs and checkpoints as
    :func:`laggard.demo.hang.parse_inject`).

    Raises:
        ValueError: an unknown injection or key, a missing key, a value of the wrong type or out
            of range; the message is one line.
    """
    return parse_spec(spec, _FIELDS, _USAGE, _DEFAULTS)  # type: ignore[no-any-return]


def describe(injection: Injection, parallel: str = "ddp") -> str:
    """One phrase for the demo's first line."""
    if isinstance(injection, GcInjection):
        return (f"rank {injection.rank} builds cyclic garbage every step (about "
                f"{100 * GC_SHARE:.0f}% of its step in Python's garbage collector)")
    if isinstance(injection, TokensInjection):
        who = (f"rank {injection.rank}'s pipeline" if parallel == "pp"
               else f"rank {injection.rank}")
        note = ("every rank notes its tokens" if injection.noted
                else "no rank notes its tokens (note:off)")
        return f"{who} gets {injection.factor:g}x longer sequences ({note})"
    if isinstance(injection, StageInjection):
        return (f"pipeline stage {injection.stage} holds {injection.layers} more "
                f"block{'s' if injection.layers > 1 else ''}")
    return describe_injection(injection)


# ------------------------------------------------------------------------- in the rank
class CyclicGarbage:
    """Cyclic garbage built every step, sized so Python's collector takes ``share`` of it.

    Each object is a list of :attr:`ITEMS` ``None`` that holds itself: reference counting never
    frees it, the cycle collector does, at a generation-0 collection (about every 700
    allocations of container objects, CPython's default threshold) that traverses it. Most of
    the cost is the collector's (traversing and freeing, about four fifths here), not the
    building's. The count per step is adjusted after every step from the collector's measured
    time on this thread (``gc.callbacks``), so that collections take about ``share`` of the
    step's CPU time whatever the machine's load.

    Args:
        share: the step's share (CPU time) to spend collecting, in (0, 1).
    """

    #: ``None`` slots per garbage list.
    ITEMS = 256
    #: Fewest and most garbage lists built per step.
    MIN_COUNT, MAX_COUNT = 100, 200_000

    def __init__(self, share: float = GC_SHARE) -> None:
        self.share = share
        self.count = 2000
        self.gc_seconds: list[float] = []  # the collector's CPU seconds in each step so far
        self._thread = threading.get_ident()
        self._step_gc = 0.0
        self._gc_started = 0.0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if threading.get_ident() != self._thread:
            return
        if phase == "start":
            self._gc_started = time.thread_time()
        else:
            self._step_gc += time.thread_time() - self._gc_started

    def build(self) -> None:
        """Build this step's garbage (the collector runs while it does, and after)."""
        for _ in range(self.count):
            garbage: list[Any] = [None] * self.ITEMS
            garbage.append(garbage)

    def end_step(self, step_cpu_seconds: float) -> None:
        """Size the next step's garbage from this step's CPU seconds and collector time."""
        spent, self._step_gc = self._step_gc, 0.0
        self.gc_seconds.append(spent)
        own = max(1e-6, step_cpu_seconds - spent)
        target = self.share / (1.0 - self.share) * own
        ratio = target / spent if spent > 0 else 2.0
        self.count = int(min(self.MAX_COUNT, max(self.MIN_COUNT,
                                                 self.count * min(2.0, max(0.5, ratio)))))

    def close(self) -> None:
        """Stop measuring (remove the callback)."""
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
