"""What the trainer adapters share: a TrainingMonitor and a CollectiveTracer built once the process
group exists, phases driven by a trainer's callback hooks, and the job's collectives hooked.

A trainer owns the training loop, so an adapter cannot wrap its steps in ``with`` blocks; it
gets callbacks at the phase boundaries instead. :class:`PhaseDriver` turns "the step starts",
"now the X phase", "the step ends" into the monitor's step and phase timers, and times the data
phase from the previous step's end to this step's start (where a trainer fetches the next
batch). :func:`hook_collectives` times the model's collectives: DDP through the timing
communication hook (the same averaging all-reduce as DDP's own), FSDP2 through its custom
all-gather and reduce-scatter. Every entry point here catches its own errors: an adapter never
raises into the trainer (counted in ``monitor.stats.internal_errors``, logged once).
"""

from __future__ import annotations

import logging
from typing import Any

from laggard.integrations.monitor import TrainingMonitor
from laggard.integrations.tracer import CollectiveTracer

log = logging.getLogger(__name__)


class PhaseDriver:
    """Drives a :class:`TrainingMonitor` from callback hooks.

    Args:
        config: the monitor's configuration (built on :meth:`start`, after
            ``init_process_group``).
        trace: also build a :class:`CollectiveTracer` over every process group.

    Attributes:
        monitor: the TrainingMonitor (None before :meth:`start`).
        tracer: the CollectiveTracer (None before :meth:`start` or without ``trace``).
        comm_timer: the DDP CommTimer once :func:`hook_collectives` registered it.
    """

    def __init__(self, config: TrainingMonitor.Config | None = None, *, trace: bool = True
                 ) -> None:
        self.config = config
        self.trace = trace
        self.monitor: TrainingMonitor | None = None
        self.tracer: CollectiveTracer | None = None
        self.comm_timer: Any = None
        self._step: Any = None
        self._phase: Any = None
        self._last_end: float | None = None
        self._errors_logged = False

    def start(self, model: Any = None) -> None:
        """Build the tracer and monitor (every rank, same point) and hook the collectives of
        ``model`` (one module or a list of model parts); called once the process group exists
        (a trainer's setup hook)."""
        if self.monitor is not None:
            return
        try:
            self.tracer = CollectiveTracer() if self.trace else None
            parts = model if isinstance(model, list | tuple) else [model]
            for part in parts:
                if part is not None and self.tracer is not None:
                    self.comm_timer = hook_collectives(part, self.tracer) or self.comm_timer
            self.monitor = TrainingMonitor(self.config, comm_timer=self.comm_timer,
                                           tracer=self.tracer)
        except Exception as exc:  # noqa: BLE001 - an adapter never stops training
            self._error("start", exc)

    def begin_step(self, *, data_before: bool = True) -> None:
        """The step starts now.

        Args:
            data_before: the time since the last step ended was the data phase (trainers that
                fetch the next batch between steps); False where the step fetches its own.
        """
        m = self.monitor
        if m is None:
            return
        try:
            self._step = m.step()
            self._step.__enter__()
            now = m._clock()
            if data_before and self._last_end is not None:
                m._intervals.append(("data", self._last_end, now))
        except Exception as exc:  # noqa: BLE001
            self._error("begin_step", exc)

    def switch(self, phase: str) -> None:
        """End the current phase (if any) and start ``phase`` now."""
        if self._step is None or self.monitor is None:
            return
        try:
            self._close_phase()
            self._phase = self.monitor.phase(phase)
            self._phase.__enter__()
        except Exception as exc:  # noqa: BLE001
            self._error("switch", exc)

    def end_step(self) -> None:
        """The step ends now: close the phase and the step (a StepRecord goes out)."""
        if self._step is None or self.monitor is None:
            return
        try:
            self._close_phase()
            step, self._step = self._step, None
            step.__exit__(None, None, None)
            self._last_end = self.monitor._clock()
        except Exception as exc:  # noqa: BLE001
            self._error("end_step", exc)

    def abort_step(self, exc: BaseException) -> None:
        """The step failed (the trainer's exception goes on): drop it, record nothing."""
        if self._step is None:
            return
        try:
            self._close_phase()
            step, self._step = self._step, None
            step.__exit__(type(exc), exc, exc.__traceback__)
        except Exception as err:  # noqa: BLE001
            self._error("abort_step", err)

    def close(self) -> None:
        """Close the monitor (socket, its own gather group)."""
        if self.monitor is not None:
            self.monitor.close()

    def _close_phase(self) -> None:
        if self._phase is not None:
            phase, self._phase = self._phase, None
            phase.__exit__(None, None, None)

    def _error(self, where: str, exc: BaseException) -> None:
        if self.monitor is not None:
            self.monitor._internal_error(f"adapter {where}", exc)
        elif not self._errors_logged:
            self._errors_logged = True
            log.warning("laggard: adapter failed in %s (%r); training goes on unmonitored",
                        where, exc)


def hook_collectives(model: Any, tracer: CollectiveTracer) -> Any:
    """Time ``model``'s collectives with ``tracer``; returns the DDP CommTimer, if one.

    DDP (``DistributedDataParallel``): registers the timing all-reduce hook, unless a hook is
    registered already (DDP takes one; the user's hook stays and this is logged once).
    FSDP2 (a module with ``fully_shard`` in it): wraps its all-gather and reduce-scatter.
    Anything else: nothing to hook (phases are still timed).
    """
    from torch.nn.parallel import DistributedDataParallel

    from laggard.integrations.comm_timing import CommTimer, allreduce_timing_hook
    from laggard.integrations.trace_sources import instrument_fsdp

    if isinstance(model, DistributedDataParallel):
        timer = CommTimer(model.process_group, tracer=tracer)
        try:
            model.register_comm_hook(timer, allreduce_timing_hook)
        except RuntimeError as exc:  # a hook of the user's, or after the first backward
            tracer._count("errors", "ddp_hook", "laggard: DDP comm hook not registered (%s); "
                          "DDP buckets are not timed", exc)
            return None
        return timer
    instrument_fsdp(model, tracer)
    return None


__all__ = ["PhaseDriver", "hook_collectives"]
