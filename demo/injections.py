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

and the *shapes* of a slowness (issue 33), each from ``--slow-from`` on, each made of the same
extra real compute as ``--slowdown`` (:class:`~laggard.demo.model.StepThrottle`, inside
backward; phases are thread CPU time, the stand-in for GPU time):

* ``stall=rank:R,every:N,seconds:S[,mode:sleep]``: on every N-th step (the onset's first) rank
  R computes S seconds more (a GPU stalling: a power or thermal capping burst, a host daemon, a
  link retry); ``mode:sleep`` sleeps S seconds in the same place instead, a wait its CPU time
  does not see (the others' collective waits do).
* ``burst=rank:R,steps:K,every:M,factor:F``: rank R is F times slower on K consecutive steps
  out of every M.
* ``node=node:NAME,factor:F`` (with ``--nodes``): every rank on emulated node NAME is F times
  slower (what a shared host CPU, PCIe switch, cooling or NIC does).
* ``moving=every:N,factor:F[,rank:R]``: one rank F times slower, the next rank every N steps
  (R, R+1, ..., wrapping; R defaults to 1): a slowness that moves.

:class:`SlowSchedule` says, for each rank and step, how much extra work each of these (and
``--slow-rank``/``--slowdown``) adds: the ranks apply it, the report reads the expected ranks
and steps back from it.

Nothing here imports torch at module level: the launcher parses flags without it.
"""

from __future__ import annotations

import gc
import threading
import time
from dataclasses import dataclass
from typing import Any, ClassVar

from laggard.demo.hang import _FIELDS as _HANG_FIELDS
from laggard.demo.hang import CheckpointInjection, HangInjection, describe_injection, parse_spec

__all__ = ["CAUSE_INJECTIONS", "SHAPE_INJECTIONS", "BurstInjection", "CyclicGarbage",
           "GcInjection", "MovingInjection", "NodeInjection", "NodePlacement", "SlowSchedule",
           "StageInjection", "StallInjection", "TokensInjection", "describe", "describe_shape",
           "node_name", "parse_injection", "parse_slow_ranks"]

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


# ---------------------------------------------------------------- shapes of a slowness
#: Largest factor ``burst``, ``node`` and ``moving`` take (F times slower).
MAX_FACTOR = 20.0
#: Longest ``stall``, in seconds.
MAX_STALL_SECONDS = 60.0
#: What a ``stall`` does: extra real compute (CPU time, as ``--slowdown``) or ``time.sleep``.
STALL_MODES = ("compute", "sleep")


def node_name(index: int) -> str:
    """The emulated node ``index``'s name (``--nodes``): ``node-0``, ``node-1``, ..."""
    return f"node-{index}"


@dataclass(frozen=True, slots=True)
class NodePlacement:
    """Where ``laggard demo --nodes N`` places the ranks: N emulated nodes of consecutive ranks
    (``world_size / N`` each, as torchrun numbers a node's ranks), named :func:`node_name`.

    Attributes:
        world_size: the job's ranks.
        nodes: emulated nodes; 0 places none (each rank's node is the host's name).
    """

    world_size: int
    nodes: int = 0

    def check(self) -> str | None:
        """Why these ranks cannot be placed so (one line), or None."""
        if self.nodes < 0:
            return f"--nodes must be >= 1, got {self.nodes}"
        if self.nodes and self.world_size % self.nodes:
            return (f"--nodes {self.nodes} must divide --world-size {self.world_size} (each "
                    "node holds as many ranks)")
        return None

    @property
    def names(self) -> list[str]:
        """The nodes' names, in order ([] without nodes)."""
        return [node_name(i) for i in range(self.nodes)]

    def node_of(self, rank: int) -> str | None:
        """The name of ``rank``'s node, None without nodes."""
        if not self.nodes:
            return None
        return node_name(rank // (self.world_size // self.nodes))

    def ranks_of(self, name: str) -> list[int]:
        """The ranks on node ``name`` ([] for a name that is not one of :attr:`names`)."""
        return [r for r in range(self.world_size) if self.node_of(r) == name]


def _exact(value: float) -> str:
    """``value`` as short as it reads back exactly (a spec is read again by each rank)."""
    short = f"{value:g}"
    return short if float(short) == value else repr(value)


def _check_factor(factor: float) -> None:
    if not 1.0 < factor <= MAX_FACTOR:  # NaN fails too
        raise ValueError(f"factor {factor:g} must be in (1, {MAX_FACTOR:g}]")


def _check_positive(name: str, value: int) -> None:
    if value < 1:
        raise ValueError(f"{name} {value} must be >= 1")


def _rank_outside(rank: int, world_size: int) -> str | None:
    if rank >= world_size:
        return f"rank {rank} outside the world of {world_size} ranks (0-{world_size - 1})"
    return None


class _OneRank:
    """What the shapes that start on one rank share: the check and the ranks they slow."""

    __slots__ = ()
    rank: int

    def check(self, world_size: int, steps: int, *, device: str = "cpu",
              parallel: str = "ddp", nodes: int = 0) -> str | None:
        """Why this injection cannot run in that demo (one line), or None."""
        return _rank_outside(self.rank, world_size)

    def ranks(self, placement: NodePlacement, steps: int, slow_from: int) -> list[int]:
        """The ranks it acts on in a run of ``steps`` steps."""
        return [self.rank]


@dataclass(frozen=True, slots=True)
class StallInjection(_OneRank):
    """``stall=rank:R,every:N,seconds:S[,mode:M]``: from the onset on, every N-th step (the
    onset's first) rank R does S seconds more inside its backward pass.

    Attributes:
        mode: ``compute``: S seconds of extra real compute in the thread's CPU time, like
            ``--slowdown``'s; ``sleep``: ``time.sleep(S)``, a wait no CPU clock sees.

    Raises:
        ValueError: a negative rank, N below 1, S outside (0, :data:`MAX_STALL_SECONDS`], an
            unknown mode.
    """

    shape: ClassVar[str] = "stall"
    rank: int
    every: int
    seconds: float
    mode: str = "compute"

    def __post_init__(self) -> None:
        if self.rank < 0:
            raise ValueError(f"rank {self.rank} must be >= 0")
        _check_positive("every", self.every)
        if not 0.0 < self.seconds <= MAX_STALL_SECONDS:
            raise ValueError(f"seconds {self.seconds:g} must be in (0, {MAX_STALL_SECONDS:g}]")
        if self.mode not in STALL_MODES:
            raise ValueError(f"mode must be {' or '.join(STALL_MODES)}, got {self.mode!r}")

    def spec(self) -> str:
        """The flag's text (what :func:`parse_injection` reads back)."""
        return (f"stall=rank:{self.rank},every:{self.every},seconds:{_exact(self.seconds)},"
                f"mode:{self.mode}")

    def hits(self, rank: int, step: int, slow_from: int, placement: NodePlacement) -> bool:
        """Whether it acts on ``rank`` at ``step`` (onset ``slow_from``)."""
        return rank == self.rank and step >= slow_from and (step - slow_from) % self.every == 0


@dataclass(frozen=True, slots=True)
class BurstInjection(_OneRank):
    """``burst=rank:R,steps:K,every:M,factor:F``: from the onset on, rank R is F times slower
    (``--slowdown F``'s extra compute) on the first K steps of every M.

    Raises:
        ValueError: a negative rank, K below 1 or not below M, F outside (1, :data:`MAX_FACTOR`].
    """

    shape: ClassVar[str] = "burst"
    rank: int
    steps: int
    every: int
    factor: float

    def __post_init__(self) -> None:
        if self.rank < 0:
            raise ValueError(f"rank {self.rank} must be >= 0")
        _check_positive("steps", self.steps)
        if self.steps >= self.every:
            raise ValueError(f"steps {self.steps} must be fewer than every {self.every} (K slow "
                             "steps of every M; all of them is --slowdown)")
        _check_factor(self.factor)

    def spec(self) -> str:
        """The flag's text."""
        return (f"burst=rank:{self.rank},steps:{self.steps},every:{self.every},"
                f"factor:{_exact(self.factor)}")

    def hits(self, rank: int, step: int, slow_from: int, placement: NodePlacement) -> bool:
        """Whether it slows ``rank`` at ``step``."""
        return rank == self.rank and step >= slow_from and (step - slow_from) % self.every \
            < self.steps


@dataclass(frozen=True, slots=True)
class NodeInjection:
    """``node=node:NAME,factor:F``: from the onset on, every rank of emulated node NAME
    (``--nodes``) is F times slower.

    Raises:
        ValueError: F outside (1, :data:`MAX_FACTOR`].
    """

    shape: ClassVar[str] = "node"
    node: str
    factor: float

    def __post_init__(self) -> None:
        _check_factor(self.factor)

    def spec(self) -> str:
        """The flag's text."""
        return f"node=node:{self.node},factor:{_exact(self.factor)}"

    def check(self, world_size: int, steps: int, *, device: str = "cpu",
              parallel: str = "ddp", nodes: int = 0) -> str | None:
        """Why this injection cannot run in that demo (no ``--nodes``, no such node), or None."""
        if not nodes:
            return "a node slowdown needs emulated nodes: add --nodes N"
        placement = NodePlacement(world_size, nodes)
        error = placement.check()
        if error:
            return error
        if self.node not in placement.names:
            return (f"no node {self.node!r}: --nodes {nodes} places the ranks on "
                    f"{', '.join(placement.names)}")
        return None

    def hits(self, rank: int, step: int, slow_from: int, placement: NodePlacement) -> bool:
        """Whether it slows ``rank`` at ``step``."""
        return step >= slow_from and placement.node_of(rank) == self.node

    def ranks(self, placement: NodePlacement, steps: int, slow_from: int) -> list[int]:
        """The node's ranks."""
        return placement.ranks_of(self.node)


@dataclass(frozen=True, slots=True)
class MovingInjection(_OneRank):
    """``moving=every:N,factor:F[,rank:R]``: from the onset on, one rank is F times slower,
    rank R for the first N steps, then R+1, and so on around the world.

    Raises:
        ValueError: N below 1, F outside (1, :data:`MAX_FACTOR`], a negative rank.
    """

    shape: ClassVar[str] = "moving"
    every: int
    factor: float
    rank: int = 1

    def __post_init__(self) -> None:
        _check_positive("every", self.every)
        _check_factor(self.factor)
        if self.rank < 0:
            raise ValueError(f"rank {self.rank} must be >= 0")

    def spec(self) -> str:
        """The flag's text."""
        return f"moving=every:{self.every},factor:{_exact(self.factor)},rank:{self.rank}"

    def slowed_rank(self, step: int, slow_from: int, world_size: int) -> int | None:
        """The rank it slows at ``step`` (None before the onset)."""
        if step < slow_from:
            return None
        return (self.rank + (step - slow_from) // self.every) % world_size

    def hits(self, rank: int, step: int, slow_from: int, placement: NodePlacement) -> bool:
        """Whether it slows ``rank`` at ``step``."""
        return rank == self.slowed_rank(step, slow_from, placement.world_size)

    def ranks(self, placement: NodePlacement, steps: int, slow_from: int) -> list[int]:
        """The ranks it visits in a run of ``steps`` steps, in order."""
        turns = min(placement.world_size, -(-(steps - slow_from) // self.every))
        return [(self.rank + k) % placement.world_size for k in range(max(0, turns))]


ShapeInjection = StallInjection | BurstInjection | NodeInjection | MovingInjection
#: The shapes of a slowness (:class:`SlowSchedule`).
SHAPE_INJECTIONS = (StallInjection, BurstInjection, NodeInjection, MovingInjection)


@dataclass(frozen=True, slots=True)
class SlowSchedule:
    """Which rank is slowed how much at which step: ``--slow-rank``/``--slowdown`` (steady, on
    each listed rank) and the shape injections, all from ``slow_from`` on.

    Attributes:
        placement: the emulated nodes (``--nodes``).
        slow_from: the onset step (0-based).
        slow_ranks: the ranks ``--slowdown`` slows (none when it is 1.0).
        slowdown: their factor.
        shapes: the shape injections.
    """

    placement: NodePlacement
    slow_from: int
    slow_ranks: tuple[int, ...] = ()
    slowdown: float = 1.0
    shapes: tuple[ShapeInjection, ...] = ()

    @classmethod
    def of(cls, *, world_size: int, slow_from: int, slow_ranks: list[int], slowdown: float,
           nodes: int = 0, injections: list[Any] | tuple[Any, ...] = ()) -> SlowSchedule:
        """The schedule of a demo's flags (``injections``: every parsed ``--inject``; those
        that are not shapes are left out)."""
        return cls(NodePlacement(world_size, nodes), slow_from,
                   tuple(slow_ranks) if slowdown > 1.0 else (), slowdown,
                   tuple(i for i in injections if isinstance(i, SHAPE_INJECTIONS)))

    def extra(self, rank: int, step: int) -> float:
        """Extra compute of ``rank`` at ``step``, as a fraction of the step's own (the
        throttle's ``factor``; 0 for none). Slowdowns that meet on one step add their extra work
        up: ``--slowdown 1.2`` and a burst of factor 2 make the step 2.2 times its compute."""
        extra = 0.0
        if step >= self.slow_from and rank in self.slow_ranks:
            extra += self.slowdown - 1.0
        for shape in self.shapes:
            if not isinstance(shape, StallInjection) and shape.hits(
                    rank, step, self.slow_from, self.placement):
                extra += shape.factor - 1.0
        return extra

    def stall(self, rank: int, step: int) -> StallInjection | None:
        """The stall ``rank`` does at ``step``, or None."""
        return next((s for s in self.shapes if isinstance(s, StallInjection)
                     and s.hits(rank, step, self.slow_from, self.placement)), None)

    def hits(self, shape: ShapeInjection | None, rank: int, step: int) -> bool:
        """Whether ``shape`` (None: the steady ``--slowdown``) acts on ``rank`` at ``step``."""
        if shape is None:
            return step >= self.slow_from and rank in self.slow_ranks
        return shape.hits(rank, step, self.slow_from, self.placement)


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
    "stall": (StallInjection, {"rank": int, "every": int, "seconds": float, "mode": str}),
    "burst": (BurstInjection, {"rank": int, "steps": int, "every": int, "factor": float}),
    "node": (NodeInjection, {"node": str, "factor": float}),
    "moving": (MovingInjection, {"every": int, "factor": float, "rank": int}),
}
_DEFAULTS: dict[str, dict[str, Any]] = {"tokens": {"factor": 1.3, "note": "on"},
                                        "stall": {"mode": "compute"}, "moving": {"rank": 1}}
_USAGE = ("hang=rank:R,step:S,kind:K, checkpoint=step:S,factor:F, gc=rank:R, "
          "tokens=rank:R[,factor:F][,note:off], stage=stage:S,layers:N, "
          "stall=rank:R,every:N,seconds:S[,mode:sleep], burst=rank:R,steps:K,every:M,factor:F, "
          "node=node:NAME,factor:F or moving=every:N,factor:F[,rank:R]")

Injection = (HangInjection | CheckpointInjection | GcInjection | TokensInjection | StageInjection
             | StallInjection | BurstInjection | NodeInjection | MovingInjection)


def parse_injection(spec: str) -> Injection:
    """Read one ``--inject`` value, any form (module docstring; hangs and checkpoints as
    :func:`laggard.demo.hang.parse_inject`).

    Raises:
        ValueError: an unknown injection or key, a missing key, a value of the wrong type or out
            of range; the message is one line.
    """
    return parse_spec(spec, _FIELDS, _USAGE, _DEFAULTS)  # type: ignore[no-any-return]


def parse_slow_ranks(text: str | int | list[int]) -> list[int]:
    """``--slow-rank``: one rank or a comma list (``1,3``), each listed once.

    Raises:
        ValueError: an empty entry, a value that is not an integer, a negative or repeated
            rank; the message is one line.
    """
    if isinstance(text, int):
        text = str(text)
    if isinstance(text, list):
        text = ",".join(map(str, text))
    ranks = []
    for part in text.split(","):
        try:
            rank = int(part.strip())
        except ValueError:
            raise ValueError(f"--slow-rank takes a rank or a comma list of ranks (1,3), got "
                             f"{text!r}") from None
        if rank < 0:
            raise ValueError(f"--slow-rank: rank {rank} must be >= 0")
        if rank in ranks:
            raise ValueError(f"--slow-rank: rank {rank} listed twice")
        ranks.append(rank)
    return ranks


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
    if isinstance(injection, SHAPE_INJECTIONS):
        return describe_shape(injection)
    return describe_injection(injection)


def describe_shape(shape: ShapeInjection) -> str:
    """One phrase for a shape injection (what it does from the onset on)."""
    if isinstance(shape, StallInjection):
        how = ("extra compute" if shape.mode == "compute"
               else "asleep: no CPU clock sees it, the others' waits do")
        often = "every step" if shape.every == 1 else f"once every {shape.every} steps"
        return f"rank {shape.rank} stalls {1e3 * shape.seconds:.0f} ms {often} ({how})"
    if isinstance(shape, BurstInjection):
        return (f"rank {shape.rank} {shape.factor:g}x slower on {shape.steps} consecutive "
                f"step{'s' if shape.steps > 1 else ''} of every {shape.every}")
    if isinstance(shape, NodeInjection):
        return f"every rank of {shape.node} {shape.factor:g}x slower"
    return (f"one rank {shape.factor:g}x slower, moving to the next rank every {shape.every} "
            f"steps from rank {shape.rank}")



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
