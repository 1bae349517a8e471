"""Second-stage collectives of a DDP hook, run in hook order on a worker thread and a second group.

Two-stage compressed all-reduces (1-bit Adam's all-to-all then all-gather, PowerSGD's P then Q
all-reduce) need the first collective's result before launching the second. Launching it from the
first future's ``.then()`` callback fails two ways on gloo: a blocking collective in a callback
deadlocks, and callbacks run in different orders on different ranks, so ranks pair up different
buckets' second stages ("Received data size doesn't match expected size"). torch's own
``powerSGD_hook`` hangs on gloo with two or more buckets for this reason.

Here the hook launches stage 1 asynchronously and submits ``(stage-1 future, finish)``; one worker
thread runs the ``finish`` closures strictly in submission order (= DDP's bucket order, the same on
every rank), each running its stage-2 collective on a *second* process group of the same ranks so
it never interleaves with the default group's traffic. The hook returns a future that the worker
completes with the bucket's result.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

Finish = Callable[[], torch.Tensor]


class StageTwoWorker:
    """One thread and one process group for the second stage of every bucket, in order.

    Creating it is a collective call (``dist.new_group``): every rank of ``process_group`` must
    construct it, in the same order relative to other groups.

    Args:
        process_group: the group stage 1 runs on; the second group has the same ranks and backend.

    Attributes:
        group: the second process group, for the ``finish`` closures' collectives.
    """

    def __init__(self, process_group: dist.ProcessGroup) -> None:
        backend = dist.get_backend(process_group)
        if process_group is dist.group.WORLD:
            self.group = dist.new_group(backend=backend)
        else:
            self.group = dist.new_group(ranks=dist.get_process_group_ranks(process_group),
                                        backend=backend, use_local_synchronization=True)
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="laggard-comm-stage2", daemon=True)
        self._thread.start()

    def submit(self, first: torch.futures.Future[Any], finish: Finish,
               device: torch.device) -> torch.futures.Future:
        """Queue ``finish`` to run once ``first`` completes; return the future of its result.

        Call from the hook (DDP's autograd thread) in bucket order. An exception in stage 1 or in
        ``finish`` is set on the returned future, so DDP raises it from ``backward()``.

        Args:
            first: the stage-1 collective's future.
            finish: runs stage 2 on :attr:`group`; returns the bucket's result.
            device: the bucket's device; a CUDA device makes the returned future CUDA-aware
                and ``finish`` run with that device current (NCCL). Untested here: no GPU.
        """
        cuda = device.type == "cuda"
        result: torch.futures.Future[torch.Tensor] = torch.futures.Future(
            devices=[device] if cuda else None)
        self._queue.put((first, finish, result, device if cuda else None))
        return result

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            first, finish, result, cuda_device = item
            try:
                first.wait()
                if cuda_device is None:
                    result.set_result(finish())
                else:
                    with torch.cuda.device(cuda_device):
                        result.set_result(finish())
            except BaseException as exc:  # handed to DDP through the future
                result.set_exception(exc)

    def close(self) -> None:
        """Stop the thread after the queued work, wait for it, and destroy the second group.

        Collective: call on every rank, after the last ``backward()``. The barrier keeps a fast
        rank from tearing the group down under a peer's last stage-2 collective.
        """
        if not self._thread.is_alive():
            return
        self._queue.put(None)
        self._thread.join()
        dist.barrier(group=self.group)
        dist.destroy_process_group(self.group)
