"""One rank of a real 2-rank Hugging Face Trainer DDP job on gloo (CPU), trained twice from the
same seed: without and with LaggardTrainerCallback. Writes ``rank<R>.json`` into argv[1].
Launched by test_adapters.py."""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import warnings

import torch
import torch.distributed as dist
from adapter_support import RecordSink, summarize, write_result
from transformers import Trainer, TrainerCallback, TrainingArguments, set_seed

from laggard.integrations.hf_trainer import LaggardTrainerCallback
from laggard.integrations.monitor import TrainingMonitor

STEPS = 12


class Regressor(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(),
                                       torch.nn.Linear(64, 1))

    def forward(self, x, labels=None):  # type: ignore[no-untyped-def]
        out = self.net(x)
        return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}


class Data(torch.utils.data.Dataset):
    def __init__(self) -> None:
        g = torch.Generator().manual_seed(1)
        self.x, self.y = torch.randn(512, 16, generator=g), torch.randn(512, 1, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i):  # type: ignore[no-untyped-def]
        return {"x": self.x[i], "labels": self.y[i]}


class Losses(TrainerCallback):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_log(self, args, state, control, logs=None, **kwargs):  # type: ignore[no-untyped-def]
        if logs and "loss" in logs:
            self.losses.append(float(logs["loss"]))


def fit(with_laggard: str) -> tuple[list[float], LaggardTrainerCallback | None]:
    set_seed(0)
    losses = Losses()
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, use_cpu=True, ddp_backend="gloo",
                                 max_steps=STEPS, per_device_train_batch_size=8,
                                 logging_steps=1, save_strategy="no", report_to=[],
                                 learning_rate=0.05, seed=0, data_seed=0,
                                 disable_tqdm=True, dataloader_num_workers=0)
        trainer = Trainer(model=Regressor(), args=args, train_dataset=Data(),
                          callbacks=[losses])
        callback = None
        if with_laggard:
            callback = LaggardTrainerCallback.attach(
                trainer, TrainingMonitor.Config(agent_address=with_laggard, window_steps=4))
        trainer.train()
    return losses.losses, callback


def main(out_dir: str) -> None:
    warnings.filterwarnings("ignore")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    baseline, _ = fit("")
    sink = RecordSink()
    monitored, callback = fit(sink.address)
    assert callback is not None and callback.monitor is not None
    write_result(out_dir, dist.get_rank(), {
        "baseline": baseline, "monitored": monitored, **summarize(sink.records()),
        "tracer": callback.driver.tracer.stats if callback.driver.tracer else None,
        "internal_errors": callback.monitor.stats.internal_errors,
        "windows": callback.monitor.stats.windows,
    })
    if dist.is_initialized():  # every rank done before the group goes: else gloo can abort one
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
    sys.stdout.flush()  # torn down: now skip the C++ static destructors, where gloo's
    os._exit(0)  # threads abort a rank 1 run in 20 (ENVIRONMENT.md; demo/worker.py)
