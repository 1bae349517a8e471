"""``torch.distributed.pipelining``'s sends and receives, timed per peer for a
:class:`~laggard.integrations.tracer.CollectiveTracer` (any backend).

:func:`instrument_pipeline` is the entry point (also importable from
:mod:`laggard.integrations.trace_sources` and :mod:`laggard.integrations`);
:func:`track_p2p_ops` tracks one batch of ``P2POp`` for a job that issues its own
(``batch_isend_irecv``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from laggard.integrations.collective_bytes import tensor_bytes

if TYPE_CHECKING:
    from laggard.integrations.tracer import CollectiveTracer

#: The module globals of ``torch.distributed.pipelining.schedules`` that every schedule looks up
#: at call time for its point-to-point ops (torch 2.4 to 2.13 at least): issue a batch, wait.
PIPELINE_FUNCTIONS = ("_batch_p2p", "_wait_batch_p2p")


class PipelineInstrumentation:
    """What :func:`instrument_pipeline` did; :meth:`undo` puts torch's functions back.

    Attributes:
        installed: the schedules' P2P functions are wrapped (by this or an earlier call for
            the same tracer); False when this torch has no such functions (counted, logged).
        tracer: the tracer the wrappers feed.
    """

    def __init__(self, tracer: CollectiveTracer, module: Any = None,
                 wrappers: tuple[Any, Any] | None = None) -> None:
        self.tracer, self._module, self._wrappers = tracer, module, wrappers

    @property
    def installed(self) -> bool:
        module, wrappers = self._module, self._wrappers
        return bool(module is not None and wrappers is not None and tuple(
            getattr(module, n, None) for n in PIPELINE_FUNCTIONS) == wrappers)

    def __bool__(self) -> bool:
        return self.installed

    def undo(self) -> bool:
        """Restore torch's own ``_batch_p2p`` / ``_wait_batch_p2p``; True when restored.

        Only wrappers that are still in place are taken out (a later
        :func:`instrument_pipeline` for another tracer replaced them: that one's handle undoes
        its own). Never raises."""
        if not self.installed:
            return False
        for name, wrapper in zip(PIPELINE_FUNCTIONS, self._wrappers or (), strict=True):
            setattr(self._module, name, wrapper.__wrapped__)
        return True


def instrument_pipeline(tracer: CollectiveTracer) -> PipelineInstrumentation:
    """Time every send and receive of ``torch.distributed.pipelining``'s schedules, per peer.

    Wraps the schedules module's ``_batch_p2p`` (issues one batch of ``P2POp``: each returned
    ``Work`` is tracked with ``tracer.track(work, "send" | "recv", group, nbytes, peer=GLOBAL
    PEER)``) and ``_wait_batch_p2p`` (the training thread's wait for them: timed with
    :meth:`~laggard.integrations.tracer.CollectiveTracer.p2p_wait`, the exposed P2P wait of the
    peer the batch is for). Every schedule (``Schedule1F1B``, ``ScheduleGPipe``, the
    interleaved and runtime ones) looks both up as module globals at call time, so a schedule
    built before or after this call is traced alike. The wrappers call torch's functions
    unchanged: training is the same. Call after the tracer (which must already watch the
    pipeline's process group), any time before the first ``schedule.step()``.

    Idempotent (a second call for the same tracer changes nothing; for another tracer, the
    new one replaces the old, wrapping torch's originals again, never a wrapper) and undone by
    the returned handle's ``undo()``. On NCCL the waits return at enqueue: the exposed wait is
    then the CPU's (the launch), and the ops are timed on the device by ``track``.

    Args:
        tracer: where the timings go; its groups must include the pipeline's group.

    Returns:
        A :class:`PipelineInstrumentation` (true when installed). A torch without these private
        functions (another version) gets nothing wrapped: counted in ``tracer.stats["errors"]``
        and logged once; a batch whose ops or works the wrapper cannot read is issued and waited
        for as usual, untracked, counted in ``tracer.stats["p2p_unmapped"]``. Never raises.
    """
    try:
        from torch.distributed.pipelining import schedules
    except Exception as exc:  # noqa: BLE001 - no pipelining in this torch
        tracer._count("errors", "pipeline_import", "laggard: torch.distributed.pipelining is "
                      "not importable (%r); pipeline send/recv not traced", exc)
        return PipelineInstrumentation(tracer)
    current = [getattr(schedules, name, None) for name in PIPELINE_FUNCTIONS]
    if not all(callable(f) for f in current):
        tracer._count("errors", "pipeline_api", "laggard: this torch's pipelining schedules "
                      "have no %s; pipeline send/recv not traced", " and ".join(
                          n for n, f in zip(PIPELINE_FUNCTIONS, current, strict=True)
                          if not callable(f)))
        return PipelineInstrumentation(tracer)
    if all(getattr(f, "_laggard_tracer", None) is tracer for f in current):
        return PipelineInstrumentation(tracer, schedules, (current[0], current[1]))
    # all callable (checked above); a wrapper of another tracer is unwrapped to torch's own
    batch, wait = (cast("Callable[..., Any]", getattr(f, "__wrapped__", f)
                        if hasattr(f, "_laggard_tracer") else f) for f in current)
    wrappers = (_traced_batch(batch, tracer), _traced_wait(wait, tracer))
    for name, wrapper in zip(PIPELINE_FUNCTIONS, wrappers, strict=True):
        setattr(schedules, name, wrapper)
    return PipelineInstrumentation(tracer, schedules, wrappers)


def _traced_batch(original: Callable[..., Any], tracer: CollectiveTracer) -> Callable[..., Any]:
    """``_batch_p2p`` that tracks each returned work per peer."""
    import functools

    @functools.wraps(original)
    def batch_p2p(*args: Any, **kwargs: Any) -> Any:
        works = original(*args, **kwargs)
        try:
            ops = args[0] if args else kwargs.get("p2p_ops", ())
            track_p2p_ops(tracer, list(ops), works)
        except Exception as exc:  # noqa: BLE001 - never raise into the schedule
            tracer._count("p2p_unmapped", "pipeline_track", "laggard: cannot track a "
                          "pipeline P2P batch (%r); its ops are not traced", exc)
        return works

    batch_p2p._laggard_tracer = tracer  # type: ignore[attr-defined]
    return batch_p2p


def _traced_wait(original: Callable[..., Any], tracer: CollectiveTracer) -> Callable[..., Any]:
    """``_wait_batch_p2p`` whose block is the exposed P2P wait of the works' peer."""
    import functools

    @functools.wraps(original)
    def wait_batch_p2p(*args: Any, **kwargs: Any) -> Any:
        works = args[0] if args else kwargs.get("work", ())
        try:
            waited = list(works) if isinstance(works, (list, tuple)) else []
        except Exception:  # noqa: BLE001
            waited = []
        with tracer.p2p_wait(waited):
            return original(*args, **kwargs)

    wait_batch_p2p._laggard_tracer = tracer  # type: ignore[attr-defined]
    return wait_batch_p2p


def track_p2p_ops(tracer: CollectiveTracer, ops: list[Any], works: Any) -> int:
    """Track the works of one batch of ``torch.distributed.P2POp`` (what ``_batch_p2p`` or
    ``batch_isend_irecv`` returned for ``ops``); returns the works tracked.

    One work per op (gloo, and homogeneous batches on any backend): each is tracked as its op's
    ``send`` / ``recv`` with the op's peer (``P2POp.peer``, a global rank) and bytes. One work
    for a coalesced batch (NCCL's ``batch_isend_irecv``): tracked once, ``recv`` when the batch
    receives anything (the wait is for the data), the bytes summed, the peer the ops share
    (None if they do not). Anything else is counted in ``tracer.stats["p2p_unmapped"]``.
    """
    if not works or not ops:
        return 0
    works = list(works)
    described = []
    for op in ops:
        name = str(getattr(getattr(op, "op", None), "__name__", ""))
        kind = "send" if "send" in name else "recv" if "recv" in name else None
        tensor = getattr(op, "tensor", None)
        if kind is None or tensor is None:
            tracer._count("p2p_unmapped", "pipeline_op", "laggard: a pipeline P2P op of an "
                          "unknown kind (%r) is not traced", op)
            return 0
        described.append((kind, getattr(op, "group", None), tensor_bytes(tensor),
                          getattr(op, "peer", None), tensor))
    if len(works) == len(described):
        for work, (kind, group, nbytes, peer, tensor) in zip(works, described, strict=True):
            tracer.track(work, kind, group, nbytes, tensor=tensor, peer=peer)
        return len(works)
    if len(works) == 1:
        kinds = {d[0] for d in described}
        peers = {d[3] for d in described}
        tracer.track(works[0], "recv" if "recv" in kinds else "send", described[0][1],
                     sum(d[2] for d in described), tensor=described[0][4],
                     peer=peers.pop() if len(peers) == 1 else None)
        return 1
    tracer._count("p2p_unmapped", "pipeline_works", "laggard: a pipeline P2P batch of %d ops "
                  "returned %d works; not traced", len(described), len(works))
    return 0


__all__ = ["PIPELINE_FUNCTIONS", "PipelineInstrumentation", "instrument_pipeline",
           "track_p2p_ops"]
