"""One rank of a real 2-rank Lightning DDP job on gloo, trained twice from the same seed: without
and with LaggardCallback. Writes ``rank<R>.json`` (losses of both runs, the StepRecords the
callback sent, the tracer's counters) into argv[1]. Launched by test_adapters.py."""

from __future__ import annotations

import logging
import os
import sys
import warnings

import pytorch_lightning as pl
import torch
import torch.distributed as dist
from adapter_support import RecordSink, summarize, write_result

from laggard.integrations.lightning import LaggardCallback
from laggard.integrations.monitor import TrainingMonitor

STEPS = 12


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(),
                                       torch.nn.Linear(64, 1))
        self.losses: list[float] = []

    def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self):  # type: ignore[no-untyped-def]
        return torch.optim.SGD(self.parameters(), lr=0.05)


def fit(callbacks: list) -> list[float]:
    pl.seed_everything(0, workers=True)
    model = Tiny()
    data = torch.utils.data.TensorDataset(torch.randn(STEPS * 8 * 2, 16), torch.randn(
        STEPS * 8 * 2, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=STEPS,
                         callbacks=callbacks, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         deterministic=True)
    trainer.fit(model, loader)
    return model.losses


def main(out_dir: str) -> None:
    warnings.filterwarnings("ignore")
    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    baseline = fit([])
    sink = RecordSink()
    callback = LaggardCallback(TrainingMonitor.Config(agent_address=sink.address,
                                                      window_steps=4))
    monitored = fit([callback])
    monitor = callback.monitor
    assert monitor is not None and callback.driver.tracer is not None
    write_result(out_dir, monitor.rank, {
        "baseline": baseline, "monitored": monitored, **summarize(sink.records()),
        "tracer": callback.driver.tracer.stats, "internal_errors": monitor.stats.internal_errors,
        "windows": monitor.stats.windows,
    })
    if dist.is_initialized():  # every rank done before the group goes: else gloo can abort one
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
    sys.stdout.flush()  # torn down: now skip the C++ static destructors, where gloo's
    os._exit(0)  # threads abort a rank 1 run in 20 (ENVIRONMENT.md; demo/worker.py)
