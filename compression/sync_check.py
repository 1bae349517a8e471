"""Does any hook make the CPU wait for the device? One step of every hook, checked two ways.

:func:`scenarios` builds, for a device, one short step of every compression hook (two buckets:
one finite, one with a NaN, so the bad-input branches run too), of the integrity hooks and of the
integrity recorder's window read, each prepared (states made, warm-up steps taken, caches
filled) before the part that is checked. Then:

* on a GPU, :func:`run_sync_check` runs each step under ``torch.cuda.set_sync_debug_mode``
  (``"warn"`` lists every synchronising call with the Python line that made it; ``"error"``
  raises at the first): what ``scripts/gpu_timing_check.py`` calls;
* on CPU, ``tests/compression/test_host_reads.py`` runs the same steps with the device branches
  forced (:func:`laggard.integrations.device_reads.device_path`) under :class:`HostReadRecorder`,
  which lists the host reads left (``bool()``, ``item()``, ``tolist()``, ``numpy()``, ...) and
  fails on one that is not on its allow-list.

The optimizer steps of ``onebit_adam`` and ``momentum=True`` are scenarios of their own: they
read the step's shared NaN verdict once per step, after ``backward()``, by design.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode

#: Tensor methods and functions that read a tensor's values into Python, or whose result's size
#: depends on them (on a device each waits for the stream to catch up).
HOST_READS = {
    "__bool__", "item", "tolist", "__float__", "__int__", "__index__", "__complex__", "cpu",
    "numpy", "__array__", "nonzero", "masked_select", "unique", "argwhere",
}

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TORCH = os.path.dirname(os.path.abspath(torch.__file__))
_SELF = os.path.abspath(__file__)


@dataclass(frozen=True, slots=True)
class HostRead:
    """One host read: the laggard function that made it (``path:function``, path relative to
    the repository) and what it called (a name of :data:`HOST_READS`, ``to(device)`` for a copy
    to an explicit device, ``mask-index`` for boolean-mask indexing)."""

    where: str
    kind: str


class HostReadRecorder(TorchFunctionMode):
    """A ``TorchFunctionMode`` that records every host read made from laggard's code.

    Torch routes every ``Tensor`` method (``__bool__``, ``item``, ``numpy`` included) and
    function through ``__torch_function__`` while a mode is active, on the thread that pushed it
    (a mode is thread-local); future callbacks and the two-stage hooks' worker threads get it
    pushed around each callback by :meth:`patch_workers`.
    A read is attributed to the innermost frame outside torch (and outside this module); reads
    from outside laggard's folders are ignored.
    """

    def __init__(self) -> None:
        super().__init__()
        #: what was read, and how many times
        self.reads: dict[HostRead, int] = {}
        self._lock = threading.Lock()

    def __torch_function__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        kind = _read_kind(func, args, kwargs)
        if kind is not None:
            where = _caller()
            if where is not None:
                with self._lock:
                    key = HostRead(where, kind)
                    self.reads[key] = self.reads.get(key, 0) + 1
        return func(*args, **kwargs)

    @contextlib.contextmanager
    def patch_workers(self) -> Iterator[None]:
        """Run the two-stage hooks' ``finish`` closures and every future's ``then()`` callback
        under this recorder too (they run on other threads, where the mode is not pushed)."""
        from laggard.compression import two_stage

        submit, then, recorder = two_stage.StageTwoWorker.submit, torch._C.Future.then, self

        def recorded(function: Any) -> Any:
            def run(*args: Any) -> Any:
                with recorder:
                    return function(*args)
            return run

        def patched_submit(worker: Any, first: Any, finish: Any, device: Any) -> Any:
            return submit(worker, first, recorded(finish), device)

        def patched_then(future: Any, callback: Any) -> Any:
            return then(future, recorded(callback))

        two_stage.StageTwoWorker.submit = patched_submit  # type: ignore[method-assign]
        torch._C.Future.then = patched_then  # type: ignore[method-assign, assignment]
        try:
            yield
        finally:
            two_stage.StageTwoWorker.submit = submit  # type: ignore[method-assign]
            torch._C.Future.then = then  # type: ignore[method-assign]


def _read_kind(func: Any, args: Any, kwargs: Any) -> str | None:
    name = getattr(func, "__name__", "")
    if name in HOST_READS:
        return name
    if name == "to" and (kwargs.get("device") is not None
                         or any(isinstance(a, (torch.device, str)) for a in args[1:])):
        return "to(device)"
    if name in ("__getitem__", "__setitem__") and len(args) > 1:
        index = args[1]
        parts = index if isinstance(index, tuple) else (index,)
        if any(isinstance(p, torch.Tensor) and p.dtype == torch.bool and p.dim() > 0
               for p in parts):
            return "mask-index"
    return None


def _caller() -> str | None:
    frame: Any = sys._getframe(2)
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if not path.startswith(_TORCH) and path != _SELF:
            if not path.startswith(_ROOT) or os.sep + "tests" + os.sep in path:
                return None
            return f"{os.path.relpath(path, _ROOT)}:{frame.f_code.co_name}"
        frame = frame.f_back
    return None


# ----------------------------------------------------------------------------- scenarios
Step = Callable[[], None]


def ensure_group(device: torch.device) -> None:
    """A one-rank default process group in this process if none exists (gloo on CPU; gloo for
    CPU tensors and NCCL for CUDA ones on a GPU)."""
    if dist.is_initialized():
        return
    backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)


def scenarios(device: torch.device) -> dict[str, Callable[[], tuple[Step, Callable[[], None]]]]:
    """Name -> a function that prepares one scenario on ``device`` and returns ``(step,
    close)``: ``step`` is what is checked, ``close`` releases the hook's threads and groups.

    Needs a process group (:func:`ensure_group`). Names: ``<hook>`` for the compression hooks
    (with an integrity recorder fed by them), ``integrity_allreduce`` (the integrity hook and
    two window reads), ``<hook>.optimizer_step`` for the optimizers that read their step's
    verdict once per step.
    """
    out: dict[str, Callable[[], tuple[Step, Callable[[], None]]]] = {}
    for name, options in (("none", {}), ("fp16", {}), ("topk", {"algorithm": "allgather"}),
                          ("topk_scatter", {"algorithm": "scatter"}), ("sign", {}),
                          ("powersgd", {})):
        out[name] = _bucket_scenario(device, name.split("_")[0], options)
    out["integrity_allreduce"] = _bucket_scenario(device, "integrity_allreduce", {})
    for name in ("onebit_adam", "topk_momentum"):
        out[name] = _optimizer_scenario(device, name, optimizer_step=False)
        out[f"{name}.optimizer_step"] = _optimizer_scenario(device, name, optimizer_step=True)
    return out


def _gradients(device: torch.device, numel: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.randn(numel, generator=torch.Generator().manual_seed(seed))
    bad = g.clone()
    bad[numel // 3] = float("nan")
    return g.to(device), bad.to(device)


def _params(device: torch.device) -> list[torch.nn.Parameter]:
    return [torch.nn.Parameter(torch.zeros(300, 40, device=device)),
            torch.nn.Parameter(torch.zeros(7, device=device))]


def _bucket_scenario(device: torch.device, name: str,
                     options: dict[str, Any]) -> Callable[[], tuple[Step, Callable[[], None]]]:
    """A compression hook wrapped by ``with_integrity`` (and feeding it its payloads), or, for
    ``integrity_allreduce``, the integrity hook alone; then two window reads."""
    def prepare() -> tuple[Step, Callable[[], None]]:
        from laggard.compression import make_hook
        from laggard.compression.bucket import FlatBucket
        from laggard.integrations.integrity import GradientIntegrity
        from laggard.integrations.integrity_hooks import (
            IntegrityHookState,
            integrity_allreduce_hook,
            with_integrity,
        )

        integrity = GradientIntegrity(GradientIntegrity.Config(replica_every=0))
        params = _params(device)
        close: Callable[[], None] = lambda: None  # noqa: E731
        if name == "integrity_allreduce":
            hook: Any = integrity_allreduce_hook
            hook_state = IntegrityHookState(integrity)
        else:
            state, inner = make_hook(name, model=torch.nn.ParameterList(params),
                                     integrity=integrity, **options)
            hook, hook_state, close = with_integrity(inner), IntegrityHookState(integrity,
                                                                                state), state.close
        good, bad = _gradients(device, sum(p.numel() for p in params), 0)
        for g in (good, bad):  # warm-up: caches, tables, Q matrices, workspaces
            hook(hook_state, FlatBucket(0, params, g.clone())).wait()
        integrity.window_vector()
        buffers = [good.clone(), bad.clone()]

        def step() -> None:
            for buffer in buffers:
                hook(hook_state, FlatBucket(0, params, buffer)).wait()
            integrity.window_vector()
            integrity.window_vector()  # the held (device) records are read now

        return step, close
    return prepare


def _optimizer_scenario(device: torch.device, name: str, optimizer_step: bool
                        ) -> Callable[[], tuple[Step, Callable[[], None]]]:
    def prepare() -> tuple[Step, Callable[[], None]]:
        from laggard.compression import make_hook
        from laggard.compression.bucket import FlatBucket

        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                    torch.nn.Linear(64, 4)).to(device)
        params = list(model.parameters())
        if name == "onebit_adam":
            state, hook = make_hook("onebit_adam", model=model, warmup_steps=1)
        else:
            state, hook = make_hook("topk", model=model, momentum=True, warmup_steps=1)
        optimizer = state.optimizer
        numel = sum(p.numel() for p in params)
        good, bad = _gradients(device, numel, 2)

        def one(buffer: torch.Tensor) -> None:
            result = hook(state, FlatBucket(0, params, buffer.clone())).wait()
            at = 0
            for p in params:
                p.grad = result[at : at + p.numel()].view_as(p).clone()
                at += p.numel()

        one(good)  # the warm-up step: AdamW, then the variance is frozen
        optimizer.step()
        one(good)
        optimizer.step()

        def hook_step() -> None:
            one(good)
            one(bad)

        def optimizer_step_only() -> None:
            optimizer.step()

        if optimizer_step:
            one(bad)
            return optimizer_step_only, state.close
        return hook_step, state.close
    return prepare


# ------------------------------------------------------------------------------ the check
def run_sync_check(device: torch.device | str = "cuda", mode: str = "warn",
                   names: list[str] | None = None) -> dict[str, Any]:
    """One step of every scenario under ``torch.cuda.set_sync_debug_mode(mode)``.

    Args:
        device: a CUDA device; anything else (or no CUDA) returns ``{"skipped": reason}``.
        mode: ``"warn"``: every synchronising call is listed (the file and line torch's warning
            points at); ``"error"``: the first one raises and its traceback is returned.
        names: scenarios to run (default: all of :func:`scenarios`).

    Returns:
        ``{"device": str, "mode": mode, "synced": [str, ...], "expected": [str, ...],
        "results": {name: {"syncs": [str, ...], "error": str | None}}}``. ``synced`` lists
        ``"<scenario>: <where>"`` for every synchronising call (or error) of the hot-path
        scenarios: empty is the pass. ``expected`` lists those of the ``*.optimizer_step``
        scenarios, which read their step's verdict once by design. When nothing could be
        checked: ``{"skipped": reason, "synced": ["not checked: " + reason]}`` (so a caller
        testing ``not report["synced"]`` does not pass by accident). Never raises for a
        scenario's failure: it is reported under ``error`` and in ``synced``.

    Raises:
        ValueError: ``mode`` is neither ``"warn"`` nor ``"error"``.
    """
    if mode not in ("warn", "error"):
        raise ValueError(f"mode must be 'warn' or 'error', got {mode!r}")
    device = torch.device(device)
    reason = None
    if device.type != "cuda":
        reason = f"device {device} is not CUDA: the sync check needs a GPU"
    elif not torch.cuda.is_available():
        reason = "torch.cuda.is_available() is False: no GPU here"
    elif dist.is_initialized() and dist.get_world_size() != 1:
        reason = ("a process group of several ranks exists in this process: the scenarios "
                  "need a one-rank group (run the check in a process of its own)")
    if reason is not None:
        return {"skipped": reason, "synced": [f"not checked: {reason}"]}
    ensure_group(device)
    torch.cuda.set_device(device)
    results: dict[str, Any] = {}
    for name, prepare in scenarios(device).items():
        if names is not None and name not in names:
            continue
        entry: dict[str, Any] = {"syncs": [], "error": None}
        results[name] = entry
        try:
            step, close = prepare()
        except Exception:  # noqa: BLE001 - reported, the other scenarios still run
            entry["error"] = "prepare: " + traceback.format_exc(limit=8)
            continue
        torch.cuda.synchronize()
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode(mode)
                try:
                    step()
                    torch.cuda.set_sync_debug_mode("default")
                finally:
                    torch.cuda.set_sync_debug_mode("default")
            entry["syncs"] = [f"{w.filename}:{w.lineno}: {w.message}" for w in caught
                              if "synchroniz" in str(w.message)]
        except Exception:  # noqa: BLE001
            entry["error"] = traceback.format_exc(limit=12)
        finally:
            with contextlib.suppress(Exception):
                torch.cuda.synchronize()
                close()
    synced: list[str] = []
    expected: list[str] = []
    for name, entry in results.items():
        found = [*entry["syncs"], *([entry["error"]] if entry["error"] else [])]
        (expected if name.endswith(".optimizer_step") else synced).extend(
            f"{name}: {where}" for where in found)
    return {"device": str(device), "mode": mode, "synced": synced, "expected": expected,
            "results": results}


__all__ = ["HOST_READS", "HostRead", "HostReadRecorder", "ensure_group", "run_sync_check",
           "scenarios"]
