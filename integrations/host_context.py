"""This rank's host in the window record: run queue, CPU pressure, steal, preemptions, per window.

:class:`HostContextParticipant` is a window participant
(:mod:`laggard.integrations.participants`), one of the monitor's built-in ones
(``TrainingMonitor.Config(host_context=False)`` turns it off). At each window gather it reads its
host and adds the columns of :data:`~laggard.detectors.host_contention.HOST_CONTEXT_COLUMNS`:

- ``host_load1_per_cpu``: ``psutil.getloadavg()[0] / psutil.cpu_count()`` (the 1-minute load
  average the agent exports as ``laggard_host_load1``, per logical CPU);
- ``host_cpus``: ``psutil.cpu_count()`` (so a reader can tell a job that runs more ranks than
  its host has CPUs);
- ``host_cpu_pressure_some_ratio``: the share of the window in which some task of the host
  waited for a CPU: the delta of ``/proc/pressure/cpu``'s ``some`` total (kernel PSI, parsed by
  :func:`laggard.parsers.pressure.parse_pressure`) over the window's wall time; the exact window,
  where ``avg10`` would be the last 10 seconds whatever the window's length. NaN on a kernel
  without PSI (before 4.20, ``CONFIG_PSI`` off, ``psi=0``);
- ``host_cpu_steal_ratio``: ``steal`` over all modes of ``psutil.cpu_times()`` between two
  windows (``guest`` and ``guest_nice`` left out: Linux already counts them in ``user`` and
  ``nice``, as psutil's own ``cpu_percent`` does); NaN where psutil has no steal field;
- ``rank_involuntary_switches_per_second``: the delta of
  ``psutil.Process().num_ctx_switches().involuntary`` over the window's wall time. On Linux that
  is ``nonvoluntary_ctxt_switches`` of ``/proc/PID/status``, the process's main thread: in a
  torchrun rank, the training thread, taken off its CPU by the scheduler while it could run.

The first window's deltas run from :meth:`~HostContextParticipant.attach`. Each read is a small
``/proc`` file on the training thread, once per window (all of them about 160 microseconds on
a 2-CPU VM at load 8; ``/proc/stat`` grows with the CPUs); none blocks on another process. A
read that fails leaves its column NaN, is counted in :attr:`HostContextParticipant.stats` and
logged once; nothing is raised into the loop.
The straggler participant reads the columns by name to say when a whole-job slowdown coincides
with CPU-bound hosts (:func:`laggard.detectors.host_contention.with_host_cause`).
"""

from __future__ import annotations

import errno
import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from laggard.detectors.host_contention import HOST_CONTEXT_COLUMNS
from laggard.detectors.window import WindowRecord
from laggard.integrations.participants import MonitorContext, WindowOutcome, WindowParticipant
from laggard.log_once import LogOnce
from laggard.parsers.pressure import parse_pressure

log = logging.getLogger(__name__)

#: ``psutil.cpu_times()`` fields already counted in others on Linux (``man 5 proc``: guest
#: time is also user time), left out of the total as psutil's ``cpu_percent`` does.
_COUNTED_TWICE = ("guest", "guest_nice")
#: Errors that mean "this kernel has no PSI": no file, or ``psi=0`` (read fails EOPNOTSUPP).
_NO_PSI = (errno.ENOENT, errno.EOPNOTSUPP)


@dataclass(frozen=True, slots=True)
class HostReading:
    """One read of the host (each field None where its read failed or is not offered).

    Attributes:
        monotonic_seconds: ``time.monotonic()`` at the read.
        load1: 1-minute load average.
        pressure_some_seconds: ``/proc/pressure/cpu`` ``some`` total, seconds.
        cpu_times: ``psutil.cpu_times()`` as a dict, seconds per mode, all CPUs.
        involuntary_switches: the process's cumulative involuntary context switches.
    """

    monotonic_seconds: float
    load1: float | None
    pressure_some_seconds: float | None
    cpu_times: dict[str, float] | None
    involuntary_switches: int | None


class HostContextParticipant(WindowParticipant):
    """Adds this rank's host load, CPU pressure, steal and preemptions to the window record.

    Args:
        proc_root: where procfs is mounted (tests point it at a fixture tree): the pressure
            file is ``{proc_root}/pressure/cpu``. psutil reads its own ``/proc``.

    Attributes:
        stats: counters: ``windows``, ``pressure_unavailable`` (1 once the kernel was found to
            have no PSI), and ``<what>_errors`` per read that failed (``load``, ``pressure``,
            ``cpu_times``, ``switches``).
        cpus: logical CPUs of the host (``psutil.cpu_count()``; None where psutil cannot tell).
    """

    name = "host_context"
    columns = HOST_CONTEXT_COLUMNS

    def __init__(self, *, proc_root: str = "/proc") -> None:
        super().__init__()
        self.stats: Counter[str] = Counter()
        self.cpus: int | None = None
        self._pressure_path: Path | None = Path(proc_root) / "pressure" / "cpu"
        self._process: Any = None
        self._last: HostReading | None = None
        self._log_once: Callable[..., object] = LogOnce(log)

    # ------------------------------------------------------------------ participant protocol
    def attach(self, context: MonitorContext) -> None:
        super().attach(context)
        self._log_once = context.log_once
        try:
            self.cpus = psutil.cpu_count() or None
            self._process = psutil.Process()
        except Exception as exc:  # noqa: BLE001 - no host context, the job goes on
            self._failed("process", exc)
        self._last = self.read()

    def contribute(self, step: int) -> Mapping[str, object]:
        try:
            now = self.read()
            values = window_values(self._last, now, cpus=self.cpus)
            self._last = now
        except Exception as exc:  # noqa: BLE001 - never raise into the loop
            self._failed("host_context", exc)
            values = dict.fromkeys((c.name for c in HOST_CONTEXT_COLUMNS), math.nan)
        self.stats["windows"] += 1
        return values

    def on_window(self, record: WindowRecord) -> WindowOutcome | None:
        return None

    # ---------------------------------------------------------------------------- reading
    def read(self) -> HostReading:
        """Read the host once; a field whose read fails is None (counted, logged once)."""
        return HostReading(monotonic_seconds=time.monotonic(), load1=self._load1(),
                           pressure_some_seconds=self._pressure(),
                           cpu_times=self._cpu_times(),
                           involuntary_switches=self._switches())

    def _load1(self) -> float | None:
        try:
            return float(psutil.getloadavg()[0])
        except Exception as exc:  # noqa: BLE001 - an OS without a load average
            self._failed("load", exc)
            return None

    def _pressure(self) -> float | None:
        path = self._pressure_path
        if path is None:
            return None
        try:
            some = parse_pressure(path.read_text().splitlines()).get("some")
        except OSError as exc:
            if exc.errno in _NO_PSI:  # normal on such a kernel: stop asking
                self._pressure_path = None
                self.stats["pressure_unavailable"] = 1
                return None
            self._failed("pressure", exc)
            return None
        if some is None:
            self._failed("pressure", ValueError(f"{path}: no 'some' line"))
            return None
        return some.total_seconds

    def _cpu_times(self) -> dict[str, float] | None:
        try:
            return {k: float(v) for k, v in psutil.cpu_times()._asdict().items()}
        except Exception as exc:  # noqa: BLE001
            self._failed("cpu_times", exc)
            return None

    def _switches(self) -> int | None:
        if self._process is None:
            return None
        try:
            return int(self._process.num_ctx_switches().involuntary)
        except Exception as exc:  # noqa: BLE001
            self._failed("switches", exc)
            return None

    def _failed(self, what: str, exc: BaseException) -> None:
        self.stats[f"{what}_errors"] += 1
        self._log_once(f"host_context.{what}", "laggard: host context: reading %s failed "
                       "(%r); its column is NaN", what, exc)


def window_values(last: HostReading | None, now: HostReading, *,
                  cpus: int | None) -> dict[str, float]:
    """The window's :data:`~laggard.detectors.host_contention.HOST_CONTEXT_COLUMNS` from the
    reads at its start (``last``) and end (``now``).

    Args:
        last: the read at the previous window's gather (or at attach); None: deltas NaN.
        now: the read now.
        cpus: logical CPUs of the host; None: load per CPU NaN.

    Returns:
        Column name -> value (ratios in [0, 1] but the load, a rate; NaN where not measured or
        where no time passed).
    """
    nan = math.nan
    load = now.load1 / cpus if now.load1 is not None and cpus else nan
    out = {"host_load1_per_cpu": load, "host_cpus": float(cpus) if cpus else nan,
           "host_cpu_pressure_some_ratio": nan,
           "host_cpu_steal_ratio": nan, "rank_involuntary_switches_per_second": nan}
    if last is None:
        return out
    elapsed = now.monotonic_seconds - last.monotonic_seconds
    if elapsed <= 0:
        return out
    if now.pressure_some_seconds is not None and last.pressure_some_seconds is not None:
        # the system-wide share is at most 1: a clamp for the two clocks' skew, not a cap
        out["host_cpu_pressure_some_ratio"] = min(
            1.0, max(0.0, (now.pressure_some_seconds - last.pressure_some_seconds) / elapsed))
    if now.cpu_times is not None and last.cpu_times is not None and "steal" in now.cpu_times:
        modes = [m for m in now.cpu_times if m not in _COUNTED_TWICE and m in last.cpu_times]
        total = sum(now.cpu_times[m] - last.cpu_times[m] for m in modes)
        if total > 0:
            out["host_cpu_steal_ratio"] = max(
                0.0, (now.cpu_times["steal"] - last.cpu_times.get("steal", 0.0)) / total)
    if now.involuntary_switches is not None and last.involuntary_switches is not None:
        out["rank_involuntary_switches_per_second"] = (
            now.involuntary_switches - last.involuntary_switches) / elapsed
    return out
