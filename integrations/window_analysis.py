"""Rank 0's analysis thread: the gathered window is handed over, never waited for.

The training thread takes part in the window gather (a collective: every rank, at the same
step), runs the *inline* participants (those whose verdict must act alike on every rank, such
as the gradient-integrity check whose policy ``raise`` stops the job), and hands the record to
this thread. The thread runs the other participants (the straggler and link detectors, cause
attribution) and the report (finding log, agent datagrams, windows file): what used to make
rank 0's steps longer, so that the other ranks waited for it at the next collective (at 16,384
ranks the analysis took 0.2-1.4 s a window, issue 31) and rank 0 showed a false wall-clock
finding on itself under load.

The queue between the two has one slot (torchtitan's rule for its metrics: never block
training). A window handed over while the thread is still busy with the previous one waits in
the slot; a newer one arriving before the thread took it *replaces* it: the older record is
dropped unanalysed (its detectors skip a window) but its inline findings are kept, prepended
to the newer window's, and the drop is counted (``MonitorStats.windows_coalesced``). So a
window's findings come out at most one window after its gather, and a slow analysis costs
windows, not step time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from laggard.detectors.window import WindowRecord
from laggard.integrations.participants import WindowOutcome

#: Seconds ``close()`` waits for the window in hand and the one in the slot: the analysis of
#: one window at 65,536 ranks took 3-4 s on a loaded 2-core host (issue 31), 13 s at worst.
CLOSE_SECONDS = 30.0


@dataclass(slots=True)
class PendingWindow:
    """One gathered window on its way to the analysis thread.

    Attributes:
        record: the gathered window (every rank's columns).
        inline: what the inline participants found in it, on the training thread.
        notes: the job's own notes for the windows file (name -> mean over the window).
        coalesced: older windows this one replaced in the slot (their inline findings are in
            ``inline``, before this window's).
    """

    record: WindowRecord
    inline: WindowOutcome = field(default_factory=WindowOutcome)
    notes: dict[str, float] = field(default_factory=dict)
    coalesced: int = 0


def merge_outcomes(first: WindowOutcome, second: WindowOutcome) -> WindowOutcome:
    """One outcome of two: ``first``'s findings then ``second``'s; scores and counters of
    ``second`` over ``first``'s."""
    return WindowOutcome(findings=first.findings + second.findings,
                         scores={**first.scores, **second.scores},
                         detector_stats={**first.detector_stats, **second.detector_stats})


class WindowAnalysis:
    """A daemon thread that runs ``work`` on each window handed over, behind a one-slot queue.

    The thread starts at the first :meth:`submit`: a monitor that never gathers (one rank, a
    test calling ``analyse`` by hand) makes none.

    Args:
        work: called on the thread with each :class:`PendingWindow`, holding :attr:`lock`;
            what it raises is passed to ``count_error`` and the thread goes on.
        stats: the monitor's :class:`~laggard.integrations.monitor_config.MonitorStats`, whose
            ``windows_coalesced`` (windows replaced in the slot by a newer one, never
            analysed), ``windows_analysed`` and ``analysis_seconds`` (wall seconds of
            ``work``, in all) this counts into.
        count_error: ``(where, exc)``, the monitor's internal-error counter.
        name: the thread's name.

    Attributes:
        lock: held while ``work`` runs; a synchronous analysis (``TrainingMonitor.analyse``)
            takes it so that the participants never run on two threads at once.
    """

    def __init__(self, work: Callable[[PendingWindow], None], *, stats: Any,
                 count_error: Callable[[str, BaseException], None],
                 name: str = "laggard-window-analysis") -> None:
        self._work = work
        self._stats = stats
        self._count_error = count_error
        self._name = name
        self.lock = threading.Lock()
        self._cond = threading.Condition()
        self._slot: PendingWindow | None = None
        self._busy = False
        self._closing = False
        self._thread: threading.Thread | None = None

    def submit(self, item: PendingWindow) -> int:
        """Hand a window over; never waits for the analysis (the condition's lock is held by
        the thread only to take the slot, never while it works).

        Returns:
            How many windows this call dropped (0 or 1), counted in
            ``stats.windows_coalesced``: the one waiting in the slot, or after :meth:`close`
            this one.
        """
        with self._cond:
            if self._closing:
                self._stats.windows_coalesced += 1
                return 1
            dropped = self._slot
            if dropped is not None:
                item.inline = merge_outcomes(dropped.inline, item.inline)
                item.coalesced += dropped.coalesced + 1
                self._stats.windows_coalesced += 1
            self._slot = item
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name,
                                                daemon=True)
                self._thread.start()
            self._cond.notify()
        return int(dropped is not None)

    def wait_idle(self, timeout: float) -> bool:
        """Wait until the slot is empty and no window is being analysed (at most ``timeout``
        seconds); True if so. For the job's end and a StopJob, never per step."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._slot is not None or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def close(self, timeout: float = CLOSE_SECONDS) -> bool:
        """Analyse what was handed over (the last window's findings are reported), then end
        the thread; waits ``timeout`` seconds at most (the thread is a daemon: one stuck in
        a participant does not hold the process). Idempotent.

        Returns:
            True when everything handed over was analysed and the thread ended in time.
        """
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            thread = self._thread
        if thread is None:
            return True
        thread.join(timeout)
        return not thread.is_alive()

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._slot is None and not self._closing:
                    self._cond.wait()
                item, self._slot = self._slot, None
                if item is None:  # closing, nothing left
                    self._cond.notify_all()
                    return
                self._busy = True
            start, cpu = time.perf_counter(), time.thread_time()
            try:
                with self.lock:
                    self._work(item)
            except Exception as exc:  # noqa: BLE001 - one bad window never ends the thread
                self._count_error("analysis", exc)
            finally:
                self._stats.analysis_seconds += time.perf_counter() - start
                self._stats.analysis_cpu_seconds += time.thread_time() - cpu
                with self._cond:
                    self._stats.windows_analysed += 1
                    self._busy = False
                    self._cond.notify_all()


__all__ = ["CLOSE_SECONDS", "PendingWindow", "WindowAnalysis", "merge_outcomes"]
