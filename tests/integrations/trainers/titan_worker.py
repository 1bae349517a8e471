"""One rank of a real 2-rank gloo FSDP2 job driven like torchtitan's Trainer, with and without
LaggardTitanMixin, same seed; the data runs out one step early so the last step raises, as
torchtitan's DataloaderExhaustedError does. Writes ``rank<R>.json`` into argv[1]."""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from adapter_support import RecordSink, summarize, write_result
from titan_standin import TitanLikeTrainer

from laggard.integrations.monitor import TrainingMonitor
from laggard.integrations.torchtitan import LaggardTitanMixin

STEPS = 12


def batches(rank: int) -> list:
    g = torch.Generator().manual_seed(rank)
    return [({"input": torch.randn(8, 16, generator=g)}, torch.randn(8, 1, generator=g))
            for _ in range(STEPS)]


def run(trainer: TitanLikeTrainer) -> list[float]:
    data = trainer.batch_generator(batches(dist.get_rank()))
    for _ in range(STEPS + 1):  # one step more than there are batches
        try:
            trainer.train_step(data)
        except (StopIteration, RuntimeError):  # PEP 479 turns it into RuntimeError in a gen
            break
    trainer.close()
    return trainer.losses


def main(out_dir: str) -> None:
    dist.init_process_group("gloo")
    baseline = run(TitanLikeTrainer())
    sink = RecordSink()

    class Monitored(LaggardTitanMixin, TitanLikeTrainer):
        laggard_config = TrainingMonitor.Config(agent_address=sink.address, window_steps=4)

    trainer = Monitored()
    monitored = run(trainer)
    monitor = trainer.laggard.monitor
    assert monitor is not None and trainer.laggard.tracer is not None
    write_result(out_dir, dist.get_rank(), {
        "baseline": baseline, "monitored": monitored, **summarize(sink.records()),
        "tracer": trainer.laggard.tracer.stats, "internal_errors": monitor.stats.internal_errors,
        "windows": monitor.stats.windows,
    })
    # Every rank done with every group before any is destroyed: without it gloo aborts a rank
    # at exit now and then ("terminate called without an active exception", ENVIRONMENT.md).
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
    sys.stdout.flush()  # torn down: now skip the C++ static destructors, where gloo's
    os._exit(0)  # threads abort a rank 1 run in 20 (ENVIRONMENT.md; demo/worker.py)
