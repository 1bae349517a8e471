"""The window record: what every rank gathers once per detection window, column by column, by name.

Every ``window_steps`` (K) steps each rank reduces its per-step statistics to one value per
column (:func:`summarize_window`), the monitor's participants add their own columns (the tracer's
per-group block, the link probe's round trip, the integrity fingerprints), and all ranks
``all_gather`` one fixed float64 vector laid out by a :class:`WindowLayout`. Rank r's row comes
back as a :class:`WindowRecord`: ``record["compute_seconds"]`` is ``(R,)``, a wider column
``(R, width)``. The monitor writes these columns, the detectors read them, and the demo and the
run report read them back from saved windows, all by name.

To add a column: declare a :class:`WindowColumn` (name, unit, how the window reduces its steps)
in :data:`STEP_COLUMNS` (a per-step statistic the monitor measures) or in a participant's
``columns`` (a value it computes per window), and fill it by name. Readers look columns up by
name, so nothing else changes; saved windows carry their own ``stat_names``, so a reader of an
older file finds the columns by name too (:meth:`WindowRecord.from_saved`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

#: How a column's per-step values become the window's value.
REDUCTIONS = ("median", "sum", "last")
#: Column value types: float64, or int64 carried bit-exact as float64 words.
DTYPES = ("float64", "int64")


@dataclass(frozen=True, slots=True)
class WindowColumn:
    """One named column of the window record.

    Attributes:
        name: the column's name, in the field's terms, with its unit as suffix.
        unit: ``seconds``, ``bytes``, ``count`` or ``words``.
        reduce: how a rank's per-step values become the window's value: ``median`` (robust to
            one slow step, e.g. a garbage-collection pause), ``sum`` (counts) or ``last`` (a
            value measured once per window).
        description: what the value is.
        width: values per rank (1 for a statistic; a participant's block may be wider).
        dtype: ``float64``, or ``int64`` (carried bit-exact: its words viewed as float64).

    Raises:
        ValueError: an unknown ``reduce`` or ``dtype``, or ``width`` < 1.
    """

    name: str
    unit: str
    reduce: str
    description: str
    width: int = 1
    dtype: str = "float64"

    def __post_init__(self) -> None:
        if self.reduce not in REDUCTIONS:
            raise ValueError(f"column {self.name!r}: reduce must be one of {REDUCTIONS}")
        if self.dtype not in DTYPES:
            raise ValueError(f"column {self.name!r}: dtype must be one of {DTYPES}")
        if self.width < 1:
            raise ValueError(f"column {self.name!r}: width must be >= 1")


#: The per-step statistics the monitor measures and every rank summarises per window, in
#: gather order. The first four are the straggler detector's inputs.
STEP_COLUMNS: tuple[WindowColumn, ...] = (
    WindowColumn("compute_seconds", "seconds", "median",
                 "forward + backward + optimizer (phases other than data), minus exposed "
                 "collective time"),
    WindowColumn("data_seconds", "seconds", "median", "the data-loading phase"),
    WindowColumn("collective_wait_seconds", "seconds", "median",
                 "exposed collective time: waiting inside the gradient collective"),
    # Launch-to-completion minus the exposed wait is the *hidden* time (backward compute
    # overlapped with communication), not a link's transfer time, and would blame the slow
    # rank's link: the monitor leaves this NaN until a per-link measurement fills it.
    WindowColumn("transfer_seconds", "seconds", "median",
                 "the collective's own transfer time (a slow link); NaN when not measured"),
    WindowColumn("step_seconds", "seconds", "median", "wall time of the step"),
    WindowColumn("collective_seconds", "seconds", "median",
                 "launch-to-completion collective time (union over buckets)"),
    WindowColumn("comm_bytes", "bytes", "median", "payload bytes handed to collectives"),
    # The device clock (TrainingMonitor.Config(phase_clock="device")): timing events are read
    # without blocking, so a window's device values are gathered one window late. On that
    # clock these four and compute_seconds, data_seconds and collective_wait_seconds describe
    # the window *before* the record's (its first record has them NaN); on the CPU clocks the
    # device columns are NaN and compute_cpu_seconds is compute_seconds.
    WindowColumn("compute_device_seconds", "seconds", "median",
                 "device time of the compute phases minus the device waits for peers (DDP: "
                 "last bucket ready to backward end; FSDP2: its stalls); NaN off the device "
                 "clock or while pending"),
    WindowColumn("compute_cpu_seconds", "seconds", "median",
                 "the compute phases on the CPU clock (wall time, exposed wait out), of the same "
                 "steps as compute_device_seconds"),
    WindowColumn("collective_wait_device_seconds", "seconds", "median",
                 "exposed collective time on the device timeline (the wait the arrived-last "
                 "rule reads on the device clock)"),
    WindowColumn("device_pending_count", "count", "sum",
                 "steps whose device events were still pending at their window's gather "
                 "(device columns NaN for them, the CPU clock used instead)"),
    # Python GC (laggard.integrations.gc_timing) and the work each rank did
    # (TrainingMonitor.note("tokens", n) / note("samples", n)): what tells a rank slowed by
    # collections, or given more work, from a slow GPU (laggard.detectors.causes).
    WindowColumn("gc_seconds", "seconds", "median",
                 "the training thread's Python garbage collection inside the step's compute "
                 "(the gc phase, on the phase clock; wall time on the device clock); NaN with "
                 "TrainingMonitor.Config(gc_timing=False)"),
    WindowColumn("gc_generation", "count", "last",
                 "the highest generation (0-2) the training thread collected in the window; -1 "
                 "none, NaN when not measured"),
    WindowColumn("tokens", "count", "median",
                 "tokens per step: the sum of a step's monitor.note('tokens', n); NaN when not "
                 "noted"),
    WindowColumn("samples", "count", "median",
                 "samples per step: the sum of a step's monitor.note('samples', n); NaN when not "
                 "noted"),
    # Pipeline parallelism (laggard.integrations.trace_sources.instrument_pipeline); 0 without.
    WindowColumn("p2p_wait_seconds", "seconds", "median",
                 "exposed P2P wait: the training thread blocked in pipeline send/recv waits"),
)
#: The step columns the device clock fills, one window late (the rest stay the CPU's).
DEVICE_CLOCK_COLUMNS: tuple[str, ...] = (
    "compute_seconds",
    "data_seconds",
    "collective_wait_seconds",
    "compute_device_seconds",
    "compute_cpu_seconds",
    "collective_wait_device_seconds",
    "device_pending_count",
)
#: Names of :data:`STEP_COLUMNS`, in order.
STEP_COLUMN_NAMES: tuple[str, ...] = tuple(c.name for c in STEP_COLUMNS)
#: The straggler detector's inputs (columns of every window record).
DETECTOR_COLUMNS: tuple[str, ...] = (
    "compute_seconds",
    "data_seconds",
    "collective_wait_seconds",
    "transfer_seconds",
)


def summarize_window(steps: np.ndarray,
                     columns: Sequence[WindowColumn] = STEP_COLUMNS) -> dict[str, float]:
    """One rank's window value of each column, reduced over its K steps as the column says.

    The one summarising function: the monitor calls it on its per-step table every window.

    Args:
        steps: ``(len(columns), K)`` float64 per-step statistics (NaN where unmeasured).
        columns: the rows' columns, in row order (each of width 1).

    Returns:
        Column name -> window value (float; NaN where a median column had no finite value,
        the last finite value for ``last``, the NaN-skipping sum for ``sum``).

    Raises:
        ValueError: ``steps`` does not have one row per column.
    """
    values = np.asarray(steps, dtype=np.float64)
    if values.ndim != 2 or values.shape[0] != len(columns):
        raise ValueError(f"steps must be ({len(columns)}, K), got {values.shape}")
    out: dict[str, float] = {}
    for row, column in zip(values, columns, strict=True):
        finite = row[np.isfinite(row)]
        if column.reduce == "sum":
            out[column.name] = float(finite.sum())
        elif not finite.size:
            out[column.name] = float("nan")
        elif column.reduce == "median":
            out[column.name] = float(np.median(finite))
        else:
            out[column.name] = float(finite[-1])
    return out


class WindowLayout:
    """The order and width of the window record's columns: one rank's gathered vector.

    Args:
        columns: the record's columns, in gather order.

    Raises:
        ValueError: two columns share a name.

    Attributes:
        columns: the columns, in order.
        size: float64 words per rank.
    """

    def __init__(self, columns: Sequence[WindowColumn]) -> None:
        self.columns = tuple(columns)
        self._slices: dict[str, slice] = {}
        offset = 0
        for column in self.columns:
            if column.name in self._slices:
                raise ValueError(f"window column {column.name!r} declared twice")
            self._slices[column.name] = slice(offset, offset + column.width)
            offset += column.width
        self.size = offset

    def __contains__(self, name: object) -> bool:
        return name in self._slices

    @property
    def names(self) -> tuple[str, ...]:
        """Column names, in gather order."""
        return tuple(c.name for c in self.columns)

    def pack(self, values: Mapping[str, object]) -> np.ndarray:
        """One rank's vector from its column values.

        Args:
            values: column name -> a float or an array of the column's width (int64 columns:
                integers). A column not given is NaN (int64: 0); names not in the layout are
                ignored.

        Returns:
            ``(size,)`` float64; int64 columns hold their words bit-exact.

        Raises:
            ValueError: a value of the wrong width.
        """
        out = np.full(self.size, np.nan)
        for column in self.columns:
            where = self._slices[column.name]
            value = values.get(column.name)
            if column.dtype == "int64":
                words = (np.zeros(column.width, dtype=np.int64) if value is None
                         else np.asarray(value, dtype=np.int64).ravel())
                self._check_width(column, words)
                out[where] = words.view(np.float64)
            elif value is not None:
                floats = np.asarray(value, dtype=np.float64).ravel()
                self._check_width(column, floats)
                out[where] = floats
        return out

    @staticmethod
    def _check_width(column: WindowColumn, values: np.ndarray) -> None:
        if values.size != column.width:
            raise ValueError(f"column {column.name!r} has width {column.width}, "
                             f"got {values.size} values")

    def unpack(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """Every rank's column values from the gathered vectors.

        Args:
            rows: ``(R, size)`` float64, row r = rank r's :meth:`pack`.

        Returns:
            Column name -> ``(R,)`` for a width-1 column, ``(R, width)`` otherwise; int64
            columns as int64 (copies: the caller may keep them).

        Raises:
            ValueError: ``rows`` is not ``(R, size)``.
        """
        matrix = np.asarray(rows, dtype=np.float64)
        if matrix.ndim != 2 or matrix.shape[1] != self.size:
            raise ValueError(f"rows must be (R, {self.size}), got {matrix.shape}")
        out: dict[str, np.ndarray] = {}
        for column in self.columns:
            block = np.ascontiguousarray(matrix[:, self._slices[column.name]])
            if column.dtype == "int64":
                block = block.view(np.int64)
            out[column.name] = block[:, 0].copy() if column.width == 1 else block.copy()
        return out


@dataclass(kw_only=True, slots=True)
class WindowRecord:
    """One gathered window: every rank's columns, by name.

    Attributes:
        step: last training step of the window.
        columns: column name -> ``(R,)`` (or ``(R, width)``) values, row r = ``ranks[r]``.
        ranks: (R,) int64 global rank of each row.
        world_size: ranks in the job, if known.
        nodes: (R,) host name of each row, if known.
        local_ranks: (R,) int64 local rank of each row on its node, if known.
    """

    step: int
    columns: dict[str, np.ndarray]
    ranks: np.ndarray
    world_size: int | None = None
    nodes: Sequence[str] | None = None
    local_ranks: np.ndarray | None = None

    def __getitem__(self, name: str) -> np.ndarray:
        return self.columns[name]

    def __contains__(self, name: object) -> bool:
        return name in self.columns

    def get(self, name: str) -> np.ndarray | None:
        """The column ``name``, or None when the record has none (not declared, older file)."""
        return self.columns.get(name)

    def scalars(self) -> WindowRecord:
        """The same record with only its width-1 float columns (what history keeps)."""
        kept = {name: values for name, values in self.columns.items()
                if values.ndim == 1 and values.dtype == np.float64}
        return WindowRecord(step=self.step, columns=kept, ranks=self.ranks,
                            world_size=self.world_size, nodes=self.nodes,
                            local_ranks=self.local_ranks)

    def table(self, names: Sequence[str]) -> np.ndarray:
        """``(R, len(names))`` float64 of width-1 columns; NaN for a column the record lacks."""
        out = np.full((self.ranks.size, len(names)), np.nan)
        for i, name in enumerate(names):
            values = self.columns.get(name)
            if values is not None:
                out[:, i] = values
        return out

    @classmethod
    def from_table(cls, *, step: int, names: Sequence[str], rows: Sequence[Sequence[object]],
                   world_size: int | None = None,
                   nodes: Sequence[str] | None = None) -> WindowRecord:
        """A record from a saved window: per-rank rows of values named by ``names``.

        Args:
            step: the window's last step.
            names: the saved column names (``stat_names``), in row order.
            rows: (R, len(names)) values, None for "not measured" (JSON has no NaN).
            world_size, nodes: as in the record.

        Raises:
            ValueError: a row of the wrong length, or a value that is not a number.
        """
        matrix = np.array([[np.nan if v is None else v for v in row] for row in rows],
                          dtype=np.float64, ndmin=2)
        if matrix.size and matrix.shape[1] != len(names):
            raise ValueError(f"rows must have {len(names)} values, got {matrix.shape[1]}")
        ranks = np.arange(len(rows), dtype=np.int64)
        columns = {name: matrix[:, i].copy() for i, name in enumerate(names)} if len(rows) \
            else {name: np.zeros(0) for name in names}
        return cls(step=step, columns=columns, ranks=ranks, world_size=world_size, nodes=nodes)

    @classmethod
    def from_saved(cls, doc: Mapping[str, object]) -> WindowRecord:
        """A record from one line of a saved windows file (``TrainingMonitor.Config(
        windows_path=...)``: ``step``, ``stat_names``, ``medians``, ``world_size``).

        Raises:
            KeyError: the document lacks ``step``, ``stat_names`` or ``medians``.
            ValueError, TypeError: they are not a step, a list of names and rows of numbers.
        """
        names, rows, step = doc["stat_names"], doc["medians"], doc["step"]
        if not isinstance(names, list) or not isinstance(rows, list):
            raise TypeError("stat_names and medians must be lists")
        if not isinstance(step, (int, float, str)):
            raise TypeError("step must be a number")
        world = doc.get("world_size")
        return cls.from_table(step=int(step), names=[str(n) for n in names], rows=rows,
                              world_size=int(world) if isinstance(world, int) else None)


# -- the straggler detector's input ------------------------------------------------------

@dataclass(kw_only=True, slots=True)
class RankWindow:
    """Per-rank timings of one detection window: R ranks x K steps.

    The monitor gives K = 1 (each rank's window medians, :meth:`from_record`); the simulator
    and tests may give K raw steps per rank, which yields the same statistic at K times the
    gathered bytes.

    Attributes:
        step: last training step of the window.
        ranks: (R,) int64 global ranks present; a rank that did not report is simply absent.
        compute_seconds: (R, K) float64, the phases other than data (forward, backward,
            optimizer): work before the sync point.
        data_seconds: (R, K) float64, data loading.
        collective_wait_seconds: (R, K) float64, time waiting inside the gradient collective
            (least wait = the rank the others waited for).
        transfer_seconds: (R, K) float64, the collective's own transfer time as this rank saw
            it (a slow link), NaN where unknown; None when not measured at all.
        world_size: ranks in the job, if known (enables missing-rank counts and elastic resets).
        nodes: (R,) host name of each rank, if known.
        local_ranks: (R,) local rank of each rank on its node, if known.

    NaN, infinite or negative durations are dropped (counted in ``StragglerDetector.stats``).
    """

    step: int
    ranks: np.ndarray
    compute_seconds: np.ndarray
    data_seconds: np.ndarray
    collective_wait_seconds: np.ndarray
    transfer_seconds: np.ndarray | None = None
    world_size: int | None = None
    nodes: Sequence[str] | None = None
    local_ranks: np.ndarray | None = None

    @classmethod
    def from_record(cls, record: WindowRecord) -> RankWindow:
        """The detector's K = 1 window from a gathered :class:`WindowRecord`, columns by name
        (:data:`DETECTOR_COLUMNS`; a record without ``transfer_seconds`` has it unmeasured).

        Raises:
            KeyError: the record lacks ``compute_seconds``, ``data_seconds`` or
                ``collective_wait_seconds``.
        """
        def column(name: str) -> np.ndarray:
            return np.asarray(record[name], dtype=np.float64).reshape(-1, 1)

        transfer = record.get("transfer_seconds")
        return cls(
            step=record.step,
            ranks=np.asarray(record.ranks, dtype=np.int64),
            compute_seconds=column("compute_seconds"),
            data_seconds=column("data_seconds"),
            collective_wait_seconds=column("collective_wait_seconds"),
            transfer_seconds=None if transfer is None else column("transfer_seconds"),
            world_size=record.world_size,
            nodes=record.nodes,
            local_ranks=record.local_ranks,
        )
