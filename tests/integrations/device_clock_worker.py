"""One rank of a real gloo DDP job on a fake real-time device; launched by test_device_clock.py
through ``python -m torch.distributed.run``. Writes ``rank<R>.json`` into argv[1].

Every rank's ``device=`` is a :class:`fake_cuda.RealTimeCuda`: its streams run enqueued work as
wall time passes. The last rank's forward enqueues ``DELAY`` seconds of device work that its CPU
never waits for (a slow GPU). The DDP hook emulates what NCCL's stream order does on a GPU: a
bucket's all-reduce starts once this rank's device has run the work enqueued before the bucket
was ready (NCCL's stream waits for the compute stream), so every rank's collectives wait for the
slow device, as they would on a GPU, while no CPU phase of the slow rank takes longer. The
collectives run in hook order on one helper thread over a second gloo group
(docs: the pattern that ran clean in ENVIRONMENT.md). argv[2] is the monitor's phase clock.
"""

from __future__ import annotations

import json
import os
import queue
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fake_cuda import RealTimeCuda  # noqa: E402

from laggard.integrations.collective_bytes import ring_allreduce_bytes, tensor_bytes  # noqa: E402
from laggard.integrations.comm_timing import CommTimer  # noqa: E402
from laggard.integrations.monitor import TrainingMonitor  # noqa: E402

DELAY = 0.05
STEPS = 70
WINDOW = 5


class StreamOrderedAllreduce:
    """The DDP hook: each bucket's averaging all-reduce starts when the device reaches it."""

    def __init__(self, timer: CommTimer, device: RealTimeCuda) -> None:
        self.timer = timer
        self.device = device
        self.group = dist.new_group(backend="gloo")
        self.queue: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def hook(self, state, bucket):  # noqa: ANN001, ANN201 - DDP checks the annotations
        self.timer.bucket_ready()
        fut: torch.futures.Future = torch.futures.Future()
        ready_on_device = self.device.current_stream().tail
        self.queue.put((bucket.buffer(), fut, ready_on_device))
        nbytes = ring_allreduce_bytes(tensor_bytes(bucket.buffer()), self.group.size())
        return self.timer.track(fut, nbytes, bucket_ready=False)

    def _run(self) -> None:
        while (item := self.queue.get()) is not None:
            buffer, fut, ready_on_device = item
            time.sleep(max(0.0, ready_on_device - self.device.now))
            buffer.div_(self.group.size())
            dist.all_reduce(buffer, group=self.group)
            fut.set_result(buffer)

    def close(self) -> None:
        self.queue.put(None)
        self.thread.join()


def main(out_dir: str, clock: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    device = RealTimeCuda()
    model = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 4))
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.05)
    timer = CommTimer()
    hook = StreamOrderedAllreduce(timer, device)
    ddp.register_comm_hook(None, hook.hook)
    windows = os.path.join(out_dir, f"windows-{clock}.jsonl")
    monitor = TrainingMonitor(
        TrainingMonitor.Config(agent_address="", window_steps=WINDOW, phase_clock=clock,
                               windows_path=windows),
        comm_timer=timer, device=device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(rank)
    for _ in range(STEPS):
        with monitor.step():
            with monitor.phase("data"):
                x = torch.randn(32, 32, generator=gen)
            with monitor.phase("forward"):
                loss = ddp(x).square().mean()
                if rank == world - 1:
                    device.launch(DELAY)  # device-only work: the CPU never sees it
            with monitor.phase("backward"):
                loss.backward()
            with monitor.phase("optimizer"):
                opt.step()
                opt.zero_grad()
    monitor.close()
    hook.close()
    with open(os.path.join(out_dir, f"rank{rank}-{clock}.json"), "w") as f:
        json.dump({"rank": rank, "delay": DELAY, "phase_clock": monitor.phase_clock,
                   "findings": [fd.to_dict() for fd in monitor.findings],
                   "stats": {"device_pending": monitor.stats.device_pending,
                             "device_fallbacks": monitor.stats.device_fallbacks,
                             "internal_errors": monitor.stats.internal_errors}}, f)
    dist.barrier()
    dist.destroy_process_group(hook.group)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    sys.stdout.flush()  # torn down: now skip the C++ static destructors, where gloo's
    os._exit(0)  # threads abort a rank 1 run in 20 (ENVIRONMENT.md; demo/worker.py)
