"""laggard for the Hugging Face ``transformers`` Trainer (5.x): one ``TrainerCallback``.

Example::

    from transformers import Trainer, TrainingArguments
    from laggard.integrations.hf_trainer import LaggardTrainerCallback
    from laggard.integrations.monitor import TrainingMonitor

    trainer = Trainer(model=model, args=TrainingArguments(output_dir="out"),
                      train_dataset=dataset)
    LaggardTrainerCallback.attach(trainer, TrainingMonitor.Config(window_steps=20))
    trainer.train()                      # under torchrun: every rank runs the same

Per optimizer step it times ``data`` (previous step end to this step's begin: the batches are
fetched there), ``forward_backward`` (``on_step_begin`` to ``on_pre_optimizer_step``; the
Trainer's callbacks do not split forward from backward) and ``optimizer`` (to
``on_step_end``), sends one StepRecord per step to the node agent and names the straggler rank
(at least 3 ranks) and a slow link from inside the job. Collectives: attached with
:meth:`LaggardTrainerCallback.attach` (or given ``trainer=``), the callback reads
``trainer.model_wrapped`` at ``on_train_begin`` (Accelerate has wrapped the model by then) and
registers the DDP timing hook, or times FSDP2's all-gathers and reduce-scatters; without the
trainer it times phases only. The callback changes no tensor: the loss is the same bit for bit.
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from laggard.integrations.monitor import TrainingMonitor
from laggard.integrations.trainers import PhaseDriver


class LaggardTrainerCallback(TrainerCallback):
    """Hugging Face Trainer callback: step phases, collectives, in-job straggler detection.

    Args:
        config: the TrainingMonitor's configuration (defaults when None).
        trainer: the Trainer, to time its wrapped model's collectives (optional).
        trace: time the model's collectives with a CollectiveTracer.

    Attributes:
        driver: the :class:`~laggard.integrations.trainers.PhaseDriver`.
    """

    def __init__(self, config: TrainingMonitor.Config | None = None, *, trainer: Any = None,
                 trace: bool = True) -> None:
        self.driver = PhaseDriver(config, trace=trace)
        self.trainer = trainer

    @classmethod
    def attach(cls, trainer: Any, config: TrainingMonitor.Config | None = None,
               **kwargs: Any) -> LaggardTrainerCallback:
        """Create the callback for ``trainer`` and add it; returns it."""
        callback = cls(config, trainer=trainer, **kwargs)
        trainer.add_callback(callback)
        return callback

    @property
    def monitor(self) -> TrainingMonitor | None:
        """The TrainingMonitor (None before training starts)."""
        return self.driver.monitor

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        model = getattr(self.trainer, "model_wrapped", None) if self.trainer else None
        self.driver.start(model)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.driver.begin_step()
        self.driver.switch("forward_backward")

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.driver.switch("optimizer")

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.driver.end_step()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.driver.close()


__all__ = ["LaggardTrainerCallback"]
