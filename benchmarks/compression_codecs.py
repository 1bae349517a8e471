"""Codec throughput of the compression hooks against a copy of the same buffer, in one process.

Imported by ``benchmarks/compression.py`` (its part 2). Every row times the codec and then
``y.copy_(x)`` of the same gradient into a buffer allocated once, alternated in one loop, so the
ratio ``throughput / copy`` compares them under the same load; medians over ``reps`` calls.
Times are the thread's CPU time (``time.thread_time``): on a shared machine with more runnable
threads than cores, wall time counts the time the thread waited for a core, more often the
longer the call, which biases the ratio against the codec; CPU time still includes what other
jobs' memory traffic costs it. The whole-hook rows take the process's CPU time
(``time.process_time``), so the work of a two-stage hook's second thread counts too.

* **whole hooks**, on a one-rank gloo group (the collectives move nothing): each compressor on a
  bucket holding the demo model and on a 25 MB bucket (DDP's default);
* **codecs alone** on the 25 MB bucket at W=4 chunks: ``sign (torch)`` is the ``sign`` hook's
  ``compress_rows`` (torch ops) + ``decompress_rows`` (the shared codec's decode, Numba on CPU);
  ``sign (1-bit Adam codec)`` the Numba codec of 1-bit Adam (``signcodec.encode_rows`` with error
  feedback, then ``decode_rows``): the scale, the pack with the residual, and the unpack;
  ``topk`` the hook's own ``select`` (the error-feedback add of the gradient into the residual,
  the sampled threshold, the candidates, the gather of the values and zeroing them in the
  residual) and the scatter of the result; ``fp16`` the two casts.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

#: Elements of the 25 MB bucket (DDP's default ``bucket_cap_mb``): 6 x 1024 x 1024 fp32.
BUCKET_25MB = 6 * 1024 * 1024


def alternate(codec: Callable[[], Any], prepare: Callable[[], Any], copy: Callable[[], Any],
              reps: int, clock: Callable[[], float] = time.thread_time) -> tuple[float, float]:
    """Median seconds of ``codec()`` and of ``copy()``, alternated; ``prepare()`` untimed."""
    codec_s, copy_s = [], []
    for rep in range(reps + 2):
        prepare()
        start = clock()
        codec()
        middle = clock()
        copy()
        end = clock()
        if rep >= 2:  # the first calls allocate residuals, plans, work buffers
            codec_s.append(middle - start)
            copy_s.append(end - middle)
    return statistics.median(codec_s), statistics.median(copy_s)


def hook_state(name: str, params: list[Any]) -> tuple[Any, Any]:
    """``make_hook(name)`` on these parameters; 1-bit Adam with its variance already frozen."""
    import torch

    from laggard.compression import make_hook

    if name != "onebit_adam":
        return make_hook(name)
    model = torch.nn.ParameterList(params)
    state, hook = make_hook(name, model=model, warmup_steps=1)
    for p in params:  # one AdamW step freezes the variance; the hook then compresses
        p.grad = torch.randn_like(p)
    state.optimizer.step()
    return state, hook


def codec_throughput(names: list[str], reps: int) -> list[dict[str, Any]]:
    """Per bucket and compressor: median hook seconds and copy seconds, alternated."""
    import torch

    from laggard.compression.bucket import FlatBucket
    from laggard.demo.model import ByteLM

    torch.set_num_threads(1)
    torch.manual_seed(0)
    buckets = {
        "whole hook, demo model in one bucket": list(ByteLM().parameters()),
        "whole hook, 25 MB bucket (6 x 1024 x 1024)": [torch.nn.Parameter(torch.empty(1024, 1024))
                                            for _ in range(6)],
    }
    rows = []
    for label, params in buckets.items():
        numel = sum(p.numel() for p in params)
        grads = torch.randn(numel, generator=torch.Generator().manual_seed(1))
        copy_into = torch.empty_like(grads)
        for name in names:
            state, hook = hook_state(name, params)
            bucket = FlatBucket(0, params)
            hook_s, copy_s = alternate(
                lambda s=state, h=hook, b=bucket: h(s, b).wait(),
                lambda b=bucket, g=grads: b.buffer().copy_(g),
                lambda y=copy_into, g=grads: y.copy_(g), reps, time.process_time)
            state.close()
            rows.append({"bucket": label, "compressor": name, "bytes": 4 * numel,
                         "hook": hook_s, "copy": copy_s})
    return rows


def codec_only(numel: int, reps: int, world: int = 4) -> list[dict[str, Any]]:
    """The codecs without the hooks around them (module docstring), on ``numel`` fp32."""
    import torch

    from laggard.compression import make_hook
    from laggard.compression.signcodec import (
        chunk_elements,
        chunk_lengths,
        compress_rows,
        decode_rows,
        decompress_rows,
        encode_rows,
    )
    from laggard.compression.topk import scatter_rows

    grads = torch.randn(numel, generator=torch.Generator().manual_seed(1))
    copy_into = torch.empty_like(grads)
    c = chunk_elements(numel, world)
    lengths = chunk_lengths(numel, world)
    work = torch.zeros(world * c)
    decoded = torch.empty(world, c)
    out = torch.empty_like(grads)
    topk_state, _ = make_hook("topk", algorithm="allgather")
    k = topk_state.k(numel)

    def sign_numpy() -> None:
        decode_rows(encode_rows(work.view(world, c), lengths)[0], out=decoded)

    def topk() -> None:
        payload = topk_state.select(work[:numel], grads, k)
        scatter_rows(out, payload.view(1, -1), 0, 1.0)

    codecs = {
        "fp16": lambda: grads.to(torch.float16).to(torch.float32),
        "sign (torch, `sign` hook)": lambda: decompress_rows(
            compress_rows(work.view(world, c), lengths)),
        "sign (1-bit Adam codec)": sign_numpy,
        "topk": topk,
    }
    rows = []
    for name, codec in codecs.items():
        codec_s, copy_s = alternate(codec, lambda: work[:numel].copy_(grads),
                                    lambda: copy_into.copy_(grads), reps)
        rows.append({"bucket": f"{numel * 4 / 1e6:.0f} MB, codec only (W={world} chunks)",
                     "compressor": name, "bytes": 4 * numel, "hook": codec_s, "copy": copy_s})
    topk_state.close()
    return rows
