"""laggard for PyTorch Lightning (``pytorch-lightning`` 2.6): one callback.

Example::

    import pytorch_lightning as pl
    from laggard.integrations.lightning import LaggardCallback
    from laggard.integrations.monitor import TrainingMonitor

    trainer = pl.Trainer(accelerator="cpu", devices=3, strategy="ddp", max_steps=1000,
                         callbacks=[LaggardCallback(TrainingMonitor.Config(window_steps=20))])
    trainer.fit(model, loader)

Per training batch it times ``data`` (previous batch end to this batch start: the loader),
``forward`` (batch start to ``on_before_backward``), ``backward`` (to ``on_after_backward``)
and ``optimizer`` (to batch end), sends one StepRecord per step to the node agent and names the
straggler rank (at least 3 ranks) and a slow link from inside the job, like
:class:`~laggard.integrations.monitor.TrainingMonitor` in a hand-written loop. Collectives:
under ``strategy="ddp"`` the DDP timing hook is registered at ``on_train_start`` (Lightning has
wrapped the model by then; skipped, and logged once, if you gave the strategy a
``ddp_comm_hook`` of your own); under ``ModelParallelStrategy`` (FSDP2) the all-gathers and
reduce-scatters are timed. The callback changes no tensor: the loss is the same bit for bit.
With gradient accumulation the optimizer phase is empty on the steps that do not step.
"""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl

from laggard.integrations.monitor import TrainingMonitor
from laggard.integrations.trainers import PhaseDriver


class LaggardCallback(pl.Callback):
    """Lightning callback: step phases, collectives and in-job straggler detection.

    Args:
        config: the TrainingMonitor's configuration (defaults when None).
        trace: time the model's collectives with a CollectiveTracer.

    Attributes:
        driver: the :class:`~laggard.integrations.trainers.PhaseDriver`; ``driver.monitor``
            holds the findings (on rank 0) and counters once training started.
    """

    def __init__(self, config: TrainingMonitor.Config | None = None, *, trace: bool = True
                 ) -> None:
        self.driver = PhaseDriver(config, trace=trace)

    @property
    def monitor(self) -> TrainingMonitor | None:
        """The TrainingMonitor (None before training starts)."""
        return self.driver.monitor

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # The strategy has set up the process group and wrapped the model (DDP) by now.
        self.driver.start(trainer.strategy.model)

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                             batch: Any, batch_idx: int) -> None:
        self.driver.begin_step()
        self.driver.switch("forward")

    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           loss: Any) -> None:
        self.driver.switch("backward")

    def on_after_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.driver.switch("optimizer")

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        self.driver.end_step()

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.driver.close()


__all__ = ["LaggardCallback"]
