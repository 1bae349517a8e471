"""The fingerprint kernels of gradient integrity: a hash of a tensor's exact bytes, float64 sums,
NaN and Inf counts; pure torch functions, each with a host form (Python numbers) and a device
form (tensors on the input's device, no host read) that :mod:`laggard.integrations.integrity`
records and :mod:`laggard.detectors.integrity` compares.

The hash (:func:`fingerprint`) reads the bytes as int64 words (a reinterpreting view, no copy),
sums each block of :data:`BLOCK_WORDS` words with wrapping int64 adds, and combines the block
sums with fixed odd weights: ``h = sum_k w_k * block_k mod 2**64``. Flipping bit ``b`` of any word
changes one block sum by ``+-2**b`` and ``h`` by ``+-w_k 2**b``, never 0 mod 2**64 as ``w_k`` is
odd: **every single-bit flip changes the hash**, and the weights make moved blocks change it too.
It runs at memory speed (a wrapping int64 sum is a plain vectorised add).
"""

from __future__ import annotations

import threading

import torch

from laggard.integrations.device_reads import to_device

#: int64 words per hash block (4 KiB): long enough for the block sums to run at memory speed,
#: short enough that the weighted combination of block sums costs nothing.
BLOCK_WORDS = 512
#: Elements converted to float64 at a time for the sum check (2 MiB of scratch).
SUM_CHUNK = 1 << 18

_weights: dict[torch.device, torch.Tensor] = {}
_weights_lock = threading.Lock()


def _block_weights(count: int, device: torch.device) -> torch.Tensor:
    """The first ``count`` odd int64 block weights (fixed seed: the same on every rank)."""
    with _weights_lock:
        w = _weights.get(device)
        if w is None or w.numel() < count:
            size = max(count, 2 * (w.numel() if w is not None else 1024))
            g = torch.Generator().manual_seed(0x1A66A2D)
            # through pinned memory, non-blocking: a plain copy to a GPU would block the hook
            w = to_device(torch.randint(-(1 << 62), 1 << 62, (size,), dtype=torch.int64,
                                        generator=g) * 2 + 1, device)
            _weights[device] = w
        return w[:count]


def row_fingerprints(rows: torch.Tensor) -> torch.Tensor:
    """Hash of the bytes of each row of ``rows``.

    Each row's bytes are read as int64 words (a reinterpreting view; only rows whose length is
    not a multiple of 8 bytes are copied); the words are summed per block of
    :data:`BLOCK_WORDS` (wrapping), the last partial block with the row's last ``B mod 8``
    bytes added as unsigned values, and the block sums combined with odd weights.

    Args:
        rows: any dtype, shape ``(R, ...)``; row ``i`` is ``rows[i]``'s bytes.

    Returns:
        int64 ``(R,)`` on ``rows``' device: ``sum_k w_k * blocksum_k mod 2**64`` (module
        docstring); every single-bit change of a row changes its value.
    """
    r = rows.shape[0]
    raw = rows.reshape(r, -1)
    raw = (raw if raw.is_contiguous() else raw.contiguous()).view(torch.uint8)
    nbytes = raw.shape[1]
    aligned = nbytes - nbytes % 8
    prefix = raw[:, :aligned]
    if aligned == 0:
        words = torch.zeros(r, 0, dtype=torch.int64, device=raw.device)
    else:
        flat = prefix.reshape(-1)  # a copy only when rows are not a whole number of words
        try:
            words = flat.view(torch.int64).view(r, -1)
        except RuntimeError:  # not 8-byte aligned in memory: copy once
            words = flat.clone().view(torch.int64).view(r, -1)
    m = aligned // 8
    full = m - m % BLOCK_WORDS
    parts = []
    if full:
        parts.append(words[:, :full].reshape(r, full // BLOCK_WORDS, BLOCK_WORDS).sum(-1))
    if m > full or nbytes > aligned or not full:
        tail = words[:, full:].sum(-1, keepdim=True)
        if nbytes > aligned:
            tail = tail + raw[:, aligned:].sum(-1, dtype=torch.int64, keepdim=True)
        parts.append(tail)
    blocks = torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]
    weights = _block_weights(blocks.shape[1], blocks.device)
    return (blocks * weights).sum(-1)


def fingerprint(tensor: torch.Tensor) -> int:
    """Hash of ``tensor``'s bytes as a Python int in int64 range: the same value as
    ``row_fingerprints(tensor.reshape(1, -1))[0]`` (the sender's hash of a payload must equal
    the receivers' hash of its chunk), with fewer tensor ops for the common one-row case: a
    bucket is hashed on the hook's critical path, where each op's fixed cost matters. A host
    read: on a device, use :func:`fingerprint_tensor`."""
    return int(fingerprint_tensor(tensor))


def fingerprint_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """:func:`fingerprint` as a 0-d int64 tensor on ``tensor``'s device (no host read)."""
    flat = tensor.reshape(-1)
    if not flat.is_contiguous():
        flat = flat.contiguous()
    raw = flat.view(torch.uint8)
    nbytes = raw.numel()
    aligned = nbytes - nbytes % 8
    try:
        words = raw[:aligned].view(torch.int64)
    except RuntimeError:  # not 8-byte aligned in memory
        return row_fingerprints(flat.reshape(1, -1))[0]
    m = aligned // 8
    full = m - m % BLOCK_WORDS
    blocks = full // BLOCK_WORDS
    weights = _block_weights(blocks + 1, words.device)
    h = (words[:full].view(blocks, BLOCK_WORDS).sum(1) * weights[:blocks]).sum() if full else 0
    if m > full or nbytes > aligned or not full:
        tail = words[full:].sum()
        if nbytes > aligned:
            tail = tail + raw[aligned:].sum(dtype=torch.int64)
        h = h + tail * weights[blocks]
    assert isinstance(h, torch.Tensor)  # full, or the tail was added
    return h


def float64_sums(tensor: torch.Tensor, magnitude: bool = True) -> tuple[float, float]:
    """``(sum x, sum |x|)`` of a floating-point tensor, accumulated in float64 (``sum |x|``
    is 0.0 when ``magnitude`` is False, saving a pass).

    The values are converted a chunk of :data:`SUM_CHUNK` at a time into one reused float64
    buffer, which runs several times faster than ``sum(dtype=torch.float64)`` on CPU. The
    rounding error of each sum is at most ``gamma_{n-1}(2**-53) * sum |x|`` (Higham, 2nd ed.,
    §4.2), which :func:`laggard.detectors.integrity.sum_tolerance` accounts for.
    """
    total, magnitudes = float64_sum_tensors(tensor, magnitude)
    return float(total), float(magnitudes) if magnitudes is not None else 0.0


def float64_sum_tensors(tensor: torch.Tensor,
                        magnitude: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`float64_sums` as 0-d float64 tensors on ``tensor``'s device (no host read); the
    magnitude sum is None when ``magnitude`` is False."""
    flat = tensor.reshape(-1)
    scratch = _scratch(flat.device)
    if flat.numel() <= SUM_CHUNK:
        wide = scratch[: flat.numel()].copy_(flat)
        return wide.sum(), wide.abs_().sum() if magnitude else None
    sums, magnitudes = [], []
    for chunk in flat.split(SUM_CHUNK):
        wide = scratch[: chunk.numel()]
        wide.copy_(chunk)
        sums.append(wide.sum())
        if magnitude:
            magnitudes.append(wide.abs_().sum())
    return (torch.stack(sums).sum(),
            torch.stack(magnitudes).sum() if magnitude else None)


_local = threading.local()


def _scratch(device: torch.device) -> torch.Tensor:
    """This thread's reused float64 buffer of :data:`SUM_CHUNK` elements on ``device`` (hooks
    run on the autograd thread and in collective callbacks, so one per thread)."""
    buffers = _local.__dict__.setdefault("buffers", {})
    buffer = buffers.get(device)
    if buffer is None:
        buffer = buffers[device] = torch.empty(SUM_CHUNK, dtype=torch.float64, device=device)
    return buffer


def nonfinite_counts(tensor: torch.Tensor) -> tuple[int, int]:
    """``(NaN count, Inf count)`` of a floating-point tensor; ``(0, 0)`` for integer ones.

    A plain sum (memory speed) is finite iff there is no NaN or Inf, unless finite values
    overflow it; only then are the exact counts taken, so the answer is always exact.
    """
    if not tensor.is_floating_point():
        return 0, 0
    if bool(torch.isfinite(tensor.sum())):
        return 0, 0
    return int(torch.isnan(tensor).sum()), int(torch.isinf(tensor).sum())


def nonfinite_count_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """:func:`nonfinite_counts` as an int64 ``(2,)`` tensor on ``tensor``'s device, no host
    read: both counts are always taken (two passes; the host path's shortcut is a host read)."""
    if not tensor.is_floating_point():
        return torch.zeros(2, dtype=torch.int64, device=tensor.device)
    return torch.stack([torch.isnan(tensor).sum(), torch.isinf(tensor).sum()])


def device_pair(values: tuple[int, int], device: torch.device) -> torch.Tensor:
    """``values`` (two ints) as an int64 ``(2,)`` tensor made on ``device`` by fills (no host
    copy)."""
    pair = torch.zeros(2, dtype=torch.int64, device=device)
    pair[0], pair[1] = values
    return pair


def bits_tensor(value: torch.Tensor) -> torch.Tensor:
    """The int64 bit pattern of a 0-d float64 tensor, as
    :func:`laggard.detectors.integrity.bits_of` of its value (no host read)."""
    return value.reshape(1).view(torch.int64)


__all__ = [
    "BLOCK_WORDS", "SUM_CHUNK", "bits_tensor", "device_pair", "fingerprint", "fingerprint_tensor",
    "float64_sum_tensors", "float64_sums", "nonfinite_count_tensor", "nonfinite_counts",
    "row_fingerprints",
]
