"""A stand-in for ``torchtitan.trainer.Trainer`` (0.3): the same method names and signatures
(checked against the installed torchtitan by test_adapters.py), training a small FSDP2 model
the way torchtitan's step does (zero_grad, next batch, forward_backward_step, optimizer step).
torchtitan's own ``__init__`` sets a CUDA device and cannot run on a CPU-only machine."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch.distributed.fsdp import fully_shard


class TitanLikeTrainer:
    def __init__(self, config: Any = None) -> None:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(),
                                    torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                    torch.nn.Linear(64, 1))
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer)
        fully_shard(model)
        self.model_parts = [model]
        self.optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        self.losses: list[float] = []

    def batch_generator(self, data_iterable: Iterable[Any]) -> Iterator[Any]:
        yield from data_iterable

    def forward_backward_step(self, *, input_dict: dict[str, torch.Tensor],
                              labels: torch.Tensor, global_valid_tokens: torch.Tensor
                              ) -> torch.Tensor:
        pred = self.model_parts[0](input_dict["input"])
        loss = torch.nn.functional.mse_loss(pred, labels, reduction="sum") / global_valid_tokens
        loss.backward()
        return loss

    def train_step(self, data_iterator: Iterator[Any]) -> None:
        self.optimizer.zero_grad()
        input_dict, labels = next(data_iterator)
        loss = self.forward_backward_step(input_dict=input_dict, labels=labels,
                                          global_valid_tokens=torch.tensor(float(labels.numel())))
        self.optimizer.step()
        self.losses.append(loss.item())

    def close(self) -> None:
        pass
