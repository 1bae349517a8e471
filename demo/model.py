"""The demo's model and data: a small decoder-only transformer language model on bytes.

The text is the Python standard library's own source (found with ``sysconfig``), as bytes: a
vocabulary of 256 tokens, no tokenizer to download. Each rank samples its own batches. The demo
worker, the tests and the benchmarks all train this model.
"""

from __future__ import annotations

import sysconfig
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

#: Bytes of standard-library source read per rank (the first files in sorted path order).
CORPUS_BYTES = 4 << 20
#: DDP gradient bucket size in MB (DDP's default is 25).
BUCKET_CAP_MB = 0.25


# ----------------------------------------------------------------------------------- data
def load_stdlib_text(max_bytes: int = CORPUS_BYTES) -> torch.Tensor:
    """The Python standard library's ``.py`` sources as one byte sequence.

    Args:
        max_bytes: stop after this many bytes (files taken in sorted path order).

    Returns:
        (N,) uint8 tensor, N <= max_bytes.

    Raises:
        FileNotFoundError: the standard library directory holds no ``.py`` files.
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    chunks, total = [], 0
    for path in sorted(root.rglob("*.py")):
        try:
            data = path.read_bytes()
        except OSError:
            continue
        chunks.append(data[: max_bytes - total])
        total += len(chunks[-1])
        if total >= max_bytes:
            break
    if not total:
        raise FileNotFoundError(f"no Python sources under {root}")
    return torch.from_numpy(np.frombuffer(b"".join(chunks), dtype=np.uint8).copy())


class ByteBatches:
    """Random windows of a byte sequence: next-token prediction batches.

    Args:
        text: (N,) uint8 tokens.
        batch_size: sequences per batch.
        seq_len: tokens per sequence (inputs; targets are shifted by one).
        seed: generator seed (give each rank its own).
    """

    def __init__(self, text: torch.Tensor, batch_size: int, seq_len: int, seed: int) -> None:
        self.text = text
        self.batch_size = batch_size
        self.seq_len = seq_len
        self.generator = torch.Generator().manual_seed(seed)
        self._offsets = torch.arange(seq_len + 1)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (inputs, targets), each (batch_size, seq_len) int64."""
        starts = torch.randint(0, self.text.numel() - self.seq_len - 1, (self.batch_size, 1),
                               generator=self.generator)
        window = self.text[starts + self._offsets].long()
        return window[:, :-1], window[:, 1:]


# ---------------------------------------------------------------------------------- model
class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention, then a 4x GELU MLP (GPT-2 layout)."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, 4 * dim)
        self.out = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(
            2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class ByteLM(nn.Module):
    """Decoder-only transformer over bytes (vocabulary 256).

    Args:
        dim: model width. heads: attention heads. layers: blocks. seq_len: context length.
    """

    def __init__(self, dim: int = 96, heads: int = 4, layers: int = 2, seq_len: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(256, dim)
        self.position = nn.Parameter(torch.randn(seq_len, dim) * 0.02)
        self.blocks = nn.Sequential(*(Block(dim, heads) for _ in range(layers)))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, 256)
        self.throttle = StepThrottle()  # extra backward compute per step (the slowed rank)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, T) int64 tokens -> (B, T, 256) logits."""
        if self.throttle.active:
            self.throttle.start_step()
        x = self.embed(tokens) + self.position[: tokens.shape[1]]
        if self.throttle.active:
            x = Throttle.apply(x, self.throttle)
        return self.head(self.ln(self.blocks(x)))


class FirstStage(nn.Module):
    """Pipeline stage 0 of a :class:`ByteLM`: the embedding and the first ``blocks`` blocks
    (the modules are the model's own, not copies). (B, T) int64 tokens -> (B, T, dim).

    With ``adapter=True`` a residual MLP of two ``dim x dim`` layers follows the embedding
    (made here, from the global generator: seed it the same on every rank of the stage): the
    counterweight of the last stage's head and loss, so the two stages do about the same work
    (see :mod:`laggard.demo.pipeline`).
    """

    def __init__(self, model: ByteLM, blocks: int, *, adapter: bool = False) -> None:
        super().__init__()
        self.embed, self.position = model.embed, model.position
        self.blocks = nn.Sequential(*list(model.blocks)[:blocks])
        self.throttle = model.throttle
        dim = model.embed.embedding_dim
        self.adapter = (nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, dim))
                        if adapter else None)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.position[: tokens.shape[1]]
        if self.adapter is not None:
            x = x + self.adapter(x)
        if self.throttle.active:
            x = Throttle.apply(x, self.throttle)  # its backward, the stage's last, burns
        return self.blocks(x)


class LastStage(nn.Module):
    """Pipeline stage 1 of a :class:`ByteLM`: the blocks after the first ``blocks``, the final
    norm and the head. (B, T, dim) -> (B, T, 256) logits."""

    def __init__(self, model: ByteLM, blocks: int) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*list(model.blocks)[blocks:])
        self.ln, self.head = model.ln, model.head
        self.throttle = model.throttle

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.throttle.active:
            # at the stage's input: its backward runs last, before the gradient goes upstream
            x = Throttle.apply(x, self.throttle)
        return self.head(self.ln(self.blocks(x)))


def split_stages(model: ByteLM, first_blocks: int, *, adapter: bool = False,
                 ) -> tuple[FirstStage, LastStage]:
    """Split ``model`` into two pipeline stages at block ``first_blocks`` (``adapter``: stage
    0's counterweight, :class:`FirstStage`).

    Raises:
        ValueError: a split that leaves a stage without a block.
    """
    if not 0 < first_blocks < len(model.blocks):
        raise ValueError(f"a split at block {first_blocks} of {len(model.blocks)} leaves a "
                         "stage without blocks")
    return FirstStage(model, first_blocks, adapter=adapter), LastStage(model, first_blocks)


# ----------------------------------------------------------------------- fault injection
class StepThrottle:
    """The slowed rank's extra work, measured against its own compute *of each step*.

    ``factor`` = slowdown - 1. At the end of backward the rank burns ``factor`` times the CPU
    time this step has used since the model's forward began, plus the previous step's optimizer
    time (the monitor counts the optimizer as compute too): so ``--slowdown 1.10`` makes every
    step's compute 10% longer, whatever the machine's load does to the step, rather than a fixed
    amount calibrated once.

    A pipeline stage runs several microbatches per step, each with its own backward: with
    ``incremental=True`` each burn covers the compute since the previous burn (the first, since
    :meth:`start_step`), so a step's burns add up to ``factor`` times its compute all the same.

    A *stall* (``laggard demo --inject stall=...``) is a fixed amount on top, done once in the
    step's first burn: ``stall_seconds`` of the same extra compute (thread CPU time), or of
    ``time.sleep`` with ``stall_mode = "sleep"`` (a wait that no CPU clock sees).

    Attributes:
        factor: extra work as a fraction of the step's own compute; 0 injects nothing.
        stall_seconds: this step's stall, seconds (set by the worker before the step; 0: none).
        stall_mode: ``compute`` or ``sleep``.
        optimizer_seconds: the previous step's optimizer CPU seconds (set by the worker).
        injected_seconds: extra CPU seconds burned in each step so far (cleared by the reader).
        step_injected_seconds: what this step injected, measured as it ran: CPU seconds burned
            (by ``factor`` and a compute stall) plus wall seconds slept (read and reset by the
            worker after each step, :meth:`take_step_injected`).
        incremental: several burns per step (microbatches), each for the compute since the last.
    """

    def __init__(self, *, incremental: bool = False) -> None:
        self.factor = 0.0
        self.stall_seconds = 0.0
        self.stall_mode = "compute"
        self.optimizer_seconds = 0.0
        self.injected_seconds: list[float] = []
        self.step_injected_seconds = 0.0
        self.incremental = incremental
        self._started = 0.0
        self._optimizer_due = 0.0
        self._fresh = True

    @property
    def active(self) -> bool:
        """Whether this step has anything to inject (the model then runs :class:`Throttle`)."""
        return self.factor > 0 or self.stall_seconds > 0

    def take_step_injected(self) -> float:
        """The seconds this step injected (:attr:`step_injected_seconds`), reset to 0."""
        seconds, self.step_injected_seconds = self.step_injected_seconds, 0.0
        return seconds

    def start_step(self) -> None:
        """Mark the start of the step's forward pass (this thread's CPU clock)."""
        self._started = time.thread_time()
        self._optimizer_due = self.optimizer_seconds
        self._fresh = True

    def burn_for_step(self) -> None:
        """Burn ``factor`` x this step's compute so far (plus the last optimizer step); with
        ``incremental``, the compute since the previous burn of the step."""
        cpu_before = time.thread_time()
        own = cpu_before - self._started + self._optimizer_due
        seconds = self.factor * own
        burn(seconds)
        self._stall()
        self.step_injected_seconds += time.thread_time() - cpu_before
        if self.incremental:
            self._started, self._optimizer_due = time.thread_time(), 0.0
            if not self._fresh and self.injected_seconds:
                self.injected_seconds[-1] += seconds
                return
            self._fresh = False
        self.injected_seconds.append(seconds)

    def _stall(self) -> None:
        """The step's stall, once (the first burn of the step); a sleep's wall seconds count
        in :attr:`step_injected_seconds` (a compute stall's CPU seconds count with the burn)."""
        seconds, self.stall_seconds = self.stall_seconds, 0.0
        if seconds <= 0:
            return
        if self.stall_mode == "sleep":
            started = time.perf_counter()
            time.sleep(seconds)
            self.step_injected_seconds += time.perf_counter() - started
        else:
            burn(seconds)


class Throttle(torch.autograd.Function):
    """Identity whose backward runs the :class:`StepThrottle`'s extra matrix multiplies.

    Placed after the embedding, its backward runs last, so the slowed rank's last gradient bucket
    (the embedding's) is late, as on a GPU whose clocks are throttled. The extra work sits in the
    backward pass, while the other ranks wait for that bucket: on a CPU-only machine with fewer
    cores than ranks, compute added while every rank computes would also steal the others' CPU
    and slow them too, which a slow GPU does not do to its peers.
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, throttle: StepThrottle) -> torch.Tensor:
        ctx.throttle = throttle
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        ctx.throttle.burn_for_step()
        return grad, None


_BURN_A = torch.randn(96, 96)
_BURN_OUT = torch.empty(96, 96)


def burn(seconds: float) -> None:
    """Run 96x96 float32 matrix multiplies for ``seconds`` of this thread's CPU time.

    CPU time, not wall time: a fixed amount of work, which takes longer when the core is shared,
    like a kernel on a slower GPU.
    """
    deadline = time.thread_time() + seconds
    while time.thread_time() < deadline:
        torch.mm(_BURN_A, _BURN_A, out=_BURN_OUT)
