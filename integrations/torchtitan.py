"""laggard for torchtitan (0.3): a mixin for its ``Trainer``, the extension point torchtitan's own
experiments use (a Trainer subclass; torchtitan has no callback list).

Example::

    from torchtitan.trainer import Trainer
    from laggard.integrations.monitor import TrainingMonitor
    from laggard.integrations.torchtitan import LaggardTitanMixin

    class MonitoredTrainer(LaggardTitanMixin, Trainer):
        laggard_config = TrainingMonitor.Config(window_steps=20)

    trainer = MonitoredTrainer(config)   # in place of Trainer(config), e.g. in your train.py
    trainer.train()

Per step (``train_step``) it times ``data`` (each ``next`` on torchtitan's batch generator, all
micro-batches), ``forward_backward`` (each ``forward_backward_step``) and ``optimizer`` (the
rest of the step: gradient clipping, ``optimizers.step``, metrics), sends one StepRecord per step
to the node agent and names the straggler rank and a slow link from inside the job. After
torchtitan has built and parallelized the model, every FSDP2 unit of ``model_parts``
(``fully_shard`` is torchtitan's data parallelism) gets timed all-gathers and reduce-scatters;
the tracer watches every process group that exists then (the device mesh's dp, tp, pp, cp
groups). A step that raises (``DataloaderExhaustedError``) is dropped, not recorded. No tensor is
changed.

Left for a GPU: torchtitan 0.3's ``Trainer.__init__`` sets the CUDA device unconditionally, so
the real class cannot be built on a CPU-only machine; laggard's tests run this mixin on a 2-rank
gloo FSDP2 job through a stand-in base class with the same method names and signatures (and
check those signatures against the installed torchtitan), not through torchtitan's own
``__init__``, data loader and models. On NCCL, enable ``TORCH_NCCL_ENABLE_TIMING=1`` or the
flight recorder to have the backend-side sources (``laggard.integrations.trace_sources.attach``)
time what FSDP2 issues on its streams.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from laggard.integrations.monitor import TrainingMonitor
from laggard.integrations.trainers import PhaseDriver


class LaggardTitanMixin:
    """Mix in before torchtitan's ``Trainer``: ``class T(LaggardTitanMixin, Trainer)``.

    Attributes:
        laggard_config: class attribute, the TrainingMonitor's configuration (None: defaults).
        laggard: the :class:`~laggard.integrations.trainers.PhaseDriver` (its ``monitor``
            holds the findings on rank 0).
    """

    laggard_config: TrainingMonitor.Config | None = None
    model_parts: list[Any]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.laggard = PhaseDriver(self.laggard_config)
        self.laggard.start(list(getattr(self, "model_parts", [])))

    def batch_generator(self, data_iterable: Iterable[Any]) -> Iterator[Any]:
        batches = super().batch_generator(data_iterable)  # type: ignore[misc]
        while True:
            self.laggard.switch("data")
            try:
                batch = next(batches)
            except StopIteration:
                return
            self.laggard.switch("forward_backward")
            yield batch

    def forward_backward_step(self, **kwargs: Any) -> Any:
        self.laggard.switch("forward_backward")
        loss = super().forward_backward_step(**kwargs)  # type: ignore[misc]
        self.laggard.switch("optimizer")
        return loss

    def train_step(self, data_iterator: Iterator[Any]) -> Any:
        self.laggard.begin_step(data_before=False)
        try:
            result = super().train_step(data_iterator)  # type: ignore[misc]
        except BaseException as exc:
            self.laggard.abort_step(exc)
            raise
        self.laggard.end_step()
        return result

    def close(self) -> None:
        self.laggard.close()
        super().close()  # type: ignore[misc]


__all__ = ["LaggardTitanMixin"]
