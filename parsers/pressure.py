"""``/proc/pressure/{cpu,memory,io}``: Linux pressure stall information (PSI).

Each file has a ``some`` line and (memory, io; cpu since Linux 5.13) a ``full`` line
(kernel ``Documentation/accounting/psi.rst``, written by ``kernel/sched/psi.c``
``psi_show``)::

    some avg10=2.48 avg60=1.07 avg300=9.20 total=6008408146
    full avg10=0.00 avg60=0.00 avg300=0.00 total=0

``some`` is the share of wall time in which at least one task was stalled on the resource (for
the CPU: runnable, waiting for a CPU), ``full`` the share in which all non-idle tasks were at
once (for the system-wide CPU file undefined, reported as 0). ``avgN`` are running averages
over N seconds in percent, ``total`` the cumulative stall time in microseconds. The file is
absent on kernels before 4.20 or built without ``CONFIG_PSI`` (and ``psi=0`` on the command
line makes reads fail with ``EOPNOTSUPP``): the caller treats that as "not measured".

Pure: text in, values out, converted at the edge (percent -> ratio, microseconds -> seconds).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

#: The lines a pressure file may have.
KINDS = ("some", "full")
MICROSECONDS_PER_SECOND = 1e6


@dataclass(frozen=True, slots=True)
class PressureLine:
    """One line of a pressure file.

    Attributes:
        avg10_ratio, avg60_ratio, avg300_ratio: share of wall time stalled over the last 10,
            60 and 300 seconds, a ratio in [0, 1] (the file's percent / 100).
        total_seconds: cumulative stall time since boot, seconds (the file's microseconds).
    """

    avg10_ratio: float
    avg60_ratio: float
    avg300_ratio: float
    total_seconds: float


def parse_pressure(lines: Iterable[str]) -> dict[str, PressureLine]:
    """The ``some`` and ``full`` lines of one ``/proc/pressure/*`` file (or a cgroup v2
    ``cpu.pressure``, which has the same format).

    A line that is not ``some`` or ``full`` followed by the four ``key=value`` fields with
    finite, non-negative numbers is skipped (a truncated read, a future field is ignored: only
    the four known keys are required).

    Args:
        lines: the file's lines.

    Returns:
        ``{"some": PressureLine, "full": PressureLine}``, each kind present only if its line
        parsed; empty for empty or unparseable text.
    """
    out: dict[str, PressureLine] = {}
    for line in lines:
        kind, _, rest = line.strip().partition(" ")
        if kind not in KINDS:
            continue
        fields: dict[str, float] = {}
        for item in rest.split():
            key, sep, value = item.partition("=")
            if not sep:
                break
            try:
                number = float(value)
            except ValueError:
                break
            if not math.isfinite(number) or number < 0:
                break
            fields[key] = number
        else:
            try:
                out[kind] = PressureLine(
                    avg10_ratio=fields["avg10"] / 100, avg60_ratio=fields["avg60"] / 100,
                    avg300_ratio=fields["avg300"] / 100,
                    total_seconds=fields["total"] / MICROSECONDS_PER_SECOND)
            except KeyError:
                continue
    return out
