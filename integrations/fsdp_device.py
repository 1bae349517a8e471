"""FSDP2 stall markers for the device clock: events around the points where the compute stream
waits for an all-gather or a reduce-scatter.

On CUDA, FSDP2 issues its all-gathers and reduce-scatters on streams of their own and returns on
enqueue; the *compute* stream waits for them only at a few points in
``torch/distributed/fsdp/_fully_shard/`` (read in torch 2.13):

* ``foreach_all_gather_copy_out`` (called by ``FSDPParamGroup.wait_for_unshard``): the current
  stream waits for the all-gather's event, then copies the gathered parameters out;
* ``FSDPParamGroup.post_backward``: with too many reduce-scatter inputs in flight, the current
  stream waits for the oldest reduce-scatter (``FSDP::post_backward_rs_wait``);
* ``FSDPParamGroup._wait_for_post_backward`` and ``FSDPParamGroup.finalize_backward``: the
  current stream waits for the previous reduce-scatter / all-reduce events.

:class:`FsdpStallMarkers` wraps these (module attributes and class methods, so every FSDP2 module
of the process is covered) with a :data:`~laggard.integrations.phases.STALL_START` event before
the call and a :data:`~laggard.integrations.phases.STALL_END` after, both on the current stream;
on the device timeline the difference is the stall plus the (short) work of the call, and the
device clock takes it out of the phase it fell in (nested calls counted once), so compute = the
step's device time minus its stalls and the stalls are the collective wait. Outside a monitor step
the wrappers only call through.

These are private functions: the import is guarded, and a torch without them (or with a
different shape) leaves the markers out, says so once, and the FSDP2 stalls stay inside the
phases' device time.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from laggard.integrations.phases import STALL_END, STALL_START

log = logging.getLogger(__name__)

#: (module, owner in it or "" for a module function, attribute): the wrapped wait points.
WAIT_POINTS: tuple[tuple[str, str, str], ...] = (
    ("torch.distributed.fsdp._fully_shard._fsdp_param_group", "", "foreach_all_gather_copy_out"),
    ("torch.distributed.fsdp._fully_shard._fsdp_param_group", "FSDPParamGroup", "post_backward"),
    ("torch.distributed.fsdp._fully_shard._fsdp_param_group", "FSDPParamGroup",
     "_wait_for_post_backward"),
    ("torch.distributed.fsdp._fully_shard._fsdp_param_group", "FSDPParamGroup",
     "finalize_backward"),
)


class FsdpStallMarkers:
    """Wraps FSDP2's wait points with device-clock stall marks.

    Args:
        clock: the monitor's :class:`~laggard.integrations.device_clock.DeviceClock` (any
            object with ``mark(kind, name)``).
        log_once: ``(key, message, *args)``; module logging when None.

    Attributes:
        installed: the wait points wrapped (names), empty until :meth:`install`.
        missing: wait points this torch lacks (left out, reported once).
    """

    def __init__(self, clock: Any, *, log_once: Callable[..., None] | None = None) -> None:
        self.clock = clock
        self._log_once = log_once or (lambda key, msg, *a: log.warning(msg, *a))
        self.installed: list[str] = []
        self.missing: list[str] = []
        self._originals: list[tuple[Any, str, Any]] = []

    def install(self) -> bool:
        """Wrap every wait point torch has; never raises.

        Returns:
            True when every wait point was wrapped.
        """
        import importlib

        for module_name, owner_name, attr in WAIT_POINTS:
            try:
                module = importlib.import_module(module_name)
                owner = getattr(module, owner_name) if owner_name else module
                original = getattr(owner, attr)
            except (ImportError, AttributeError):
                self.missing.append(f"{owner_name or module_name}.{attr}")
                continue
            if getattr(original, "_laggard_stall", False):
                continue  # another monitor's markers are in place
            setattr(owner, attr, self._wrap(original, attr))
            self._originals.append((owner, attr, original))
            self.installed.append(f"{owner_name or module_name.rsplit('.', 1)[-1]}.{attr}")
        if self.missing:
            self._log_once("fsdp-markers", "laggard: this torch has no FSDP2 %s (private API); "
                           "those stalls stay inside the phases' device time", self.missing)
        return not self.missing

    def uninstall(self) -> None:
        """Put the original functions back (the monitor's ``close()``)."""
        for owner, attr, original in reversed(self._originals):
            setattr(owner, attr, original)
        self._originals.clear()
        self.installed.clear()

    def _wrap(self, original: Callable[..., Any], name: str) -> Callable[..., Any]:
        return stall_marked(original, self.clock, name)


def stall_marked(call: Callable[..., Any], clock: Any, name: str) -> Callable[..., Any]:
    """``call`` between a :data:`STALL_START` and a :data:`STALL_END` device mark
    (``clock.mark(kind, name)``): the device clock's compute is the step's device time minus
    what lies between them. A failing mark is ignored: a marker never fails FSDP."""

    @functools.wraps(call)
    def marked(*args: Any, **kwargs: Any) -> Any:
        try:
            clock.mark(STALL_START, name)
        except Exception:  # noqa: BLE001 - a marker never fails FSDP
            pass
        try:
            return call(*args, **kwargs)
        finally:
            try:
                clock.mark(STALL_END, name)
            except Exception:  # noqa: BLE001
                pass

    marked._laggard_stall = True  # type: ignore[attr-defined]
    return marked


__all__ = ["WAIT_POINTS", "FsdpStallMarkers", "stall_marked"]
