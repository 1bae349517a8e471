"""Pure parser for the text output of NVIDIA's nccl-tests (``all_reduce_perf`` and friends).

Format (nccl-tests ``src/common.cu``): a ``#`` header with the run parameters, one device line
per rank::

    #  Rank %2d Group %2d Pid %6d on %10s device %2d [%04x:%02x:%02x] %s     (2.13+)
    #  Rank %2d Group %2d Pid %6d on %10s device %2d [0x%02x] %s            (older)
    #  Rank %2d Pid %6d on %10s device %2d [0x%02x] %s                      (oldest)

then one row per message size: ``size count type redop root`` followed, for the out-of-place and
the in-place run, by ``time algbw busbw #wrong`` (time in µs, printed ``%.1f``/``%.2f`` below
10 ms and as an integer above; bandwidths in GB/s = 1e9 bytes/s; ``#wrong`` is ``N/A`` when the
result is not checked). A run with ``-I`` or a test without an in-place variant prints one
group. The trailer gives ``# Out of bounds values : N OK|FAILED`` and ``# Avg bus bandwidth :
X``, the mean of busbw over all sizes and both runs (not the peak).

Bus bandwidth is nccl-tests' own figure: algbw times the collective's factor (``2(n-1)/n``
for all-reduce, ``(n-1)/n`` for all-gather, reduce-scatter and all-to-all), see
nccl-tests ``doc/PERFORMANCE.md``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ["BenchRow", "NcclTestsResult", "RankDevice", "parse_nccl_tests", "GIB"]

GIB = 1 << 30

_DEVICE = re.compile(
    r"#\s+Rank\s+(?P<rank>\d+)(?:\s+Group\s+\d+)?\s+Pid\s+(?P<pid>\d+)\s+on\s+(?P<host>\S+)"
    r"\s+device\s+(?P<dev>\d+)\s+\[(?P<bus>[^\]]+)\]\s*(?P<name>.*?)\s*$"
)
_AVG = re.compile(r"#\s*Avg bus bandwidth\s*:\s*(?P<avg>[\d.eE+-]+|nan|inf)")
_OOB = re.compile(r"#\s*Out of bounds values\s*:\s*(?P<n>\d+)\s*(?P<verdict>\w+)?")
_TEST_NAME = re.compile(r"\b(\w+_perf)\b")


@dataclass(frozen=True, slots=True)
class RankDevice:
    """One ``# Rank`` line: rank, host, pid, CUDA device ordinal, PCI id and GPU name."""

    rank: int
    host: str
    pid: int
    device: int
    pci_bus_id: str
    name: str


@dataclass(frozen=True, slots=True)
class BenchRow:
    """One message size.

    Attributes:
        size_bytes: message size in bytes; ``count``: elements; ``dtype``, ``redop``, ``root``.
        time_us: out-of-place time (µs); ``algbw``, ``busbw``: GB/s; ``wrong``: errors or None
            for ``N/A``.
        inplace_*: the same for the in-place run, None when not printed.
    """

    size_bytes: int
    count: int
    dtype: str
    redop: str
    root: int
    time_us: float
    algbw: float
    busbw: float
    wrong: int | None
    inplace_time_us: float | None = None
    inplace_algbw: float | None = None
    inplace_busbw: float | None = None
    inplace_wrong: int | None = None

    @property
    def best_busbw(self) -> float:
        """The larger of the out-of-place and in-place bus bandwidth (GB/s)."""
        return max(self.busbw, self.inplace_busbw or 0.0)


@dataclass(slots=True)
class NcclTestsResult:
    """A parsed nccl-tests run.

    Attributes:
        test: the binary's name when the output names it (``all_reduce_perf``), else None.
        devices: the ``# Rank`` lines, in order.
        rows: one :class:`BenchRow` per message size, in order.
        avg_busbw: the trailer's average bus bandwidth (GB/s), when present.
        out_of_bounds: the trailer's out-of-bounds count, when present.
        skipped: lines that looked like rows but did not parse.
    """

    test: str | None = None
    devices: list[RankDevice] = field(default_factory=list)
    rows: list[BenchRow] = field(default_factory=list)
    avg_busbw: float | None = None
    out_of_bounds: int | None = None
    skipped: int = 0

    @property
    def nranks(self) -> int | None:
        """Number of ranks from the device lines, None when they are absent."""
        return len({d.rank for d in self.devices}) or None

    @property
    def inferred_nranks(self) -> int | None:
        """Ranks implied by busbw/algbw at the peak: ``2(n-1)/n`` above 1, ``(n-1)/n`` below.

        None when the ratio is 1 (broadcast, reduce) or there are no rows.
        """
        peak = self.peak
        if peak is None or peak.algbw <= 0:
            return None
        ratio = peak.busbw / peak.algbw
        if 1.0 < ratio < 2.0:
            return round(2.0 / (2.0 - ratio))
        if 0.0 < ratio < 1.0:
            return round(1.0 / (1.0 - ratio))
        return None

    @property
    def peak(self) -> BenchRow | None:
        """The row with the highest bus bandwidth (either run)."""
        return max(self.rows, key=lambda r: r.best_busbw, default=None)

    def row_at(self, size_bytes: int) -> BenchRow | None:
        """The row for exactly ``size_bytes``, None if that size was not run."""
        return next((r for r in self.rows if r.size_bytes == size_bytes), None)

    @property
    def wrong_total(self) -> int:
        """Sum of ``#wrong`` over every row and run (``N/A`` counts 0)."""
        return sum((r.wrong or 0) + (r.inplace_wrong or 0) for r in self.rows)


def _number(token: str) -> float:
    return float(token)


def _wrong(token: str) -> int | None:
    return int(token) if token.isdigit() else None


def _row(tokens: list[str]) -> BenchRow | None:
    # size count type redop root | time algbw busbw wrong [| time algbw busbw wrong]
    if len(tokens) not in (9, 13) or not tokens[0].isdigit() or not tokens[1].isdigit():
        return None
    try:
        row = BenchRow(
            size_bytes=int(tokens[0]), count=int(tokens[1]), dtype=tokens[2], redop=tokens[3],
            root=int(tokens[4]), time_us=_number(tokens[5]), algbw=_number(tokens[6]),
            busbw=_number(tokens[7]), wrong=_wrong(tokens[8]),
        )
        if len(tokens) == 13:
            row = BenchRow(
                **{s: getattr(row, s) for s in BenchRow.__slots__ if not s.startswith("inplace")},
                inplace_time_us=_number(tokens[9]), inplace_algbw=_number(tokens[10]),
                inplace_busbw=_number(tokens[11]), inplace_wrong=_wrong(tokens[12]),
            )
    except ValueError:
        return None
    return row


def parse_nccl_tests(lines: Iterable[str]) -> NcclTestsResult:
    """Parse nccl-tests output; lines that belong to nothing known are ignored.

    Launcher prefixes before a row (``[1,0]<stdout>:`` of Open MPI, ``0:`` of ``srun -l``) are
    tolerated: a row is recognised by its last 9 or 13 whitespace-separated fields.
    """
    result = NcclTestsResult()
    for line in lines:
        text = line.strip()
        if not text:
            continue
        if "#" in text:
            body = text[text.index("#"):]
            if result.test is None and (m := _TEST_NAME.search(text)):
                result.test = m.group(1)
            if m := _DEVICE.match(body):
                result.devices.append(RankDevice(
                    int(m["rank"]), m["host"], int(m["pid"]), int(m["dev"]), m["bus"], m["name"]))
            elif m := _AVG.match(body):
                result.avg_busbw = float(m["avg"])
            elif m := _OOB.match(body):
                result.out_of_bounds = int(m["n"])
            continue
        tokens = text.split()
        for width in (13, 9):
            if len(tokens) >= width and (row := _row(tokens[-width:])) is not None:
                result.rows.append(row)
                break
        else:
            if tokens[-1].replace(".", "", 1).isdigit() and len(tokens) >= 9:
                result.skipped += 1
    return result
