"""A sign codec with error feedback that runs near memory speed on CPU: numpy kernels on views.

Encoding rows of ``p`` (one scale per row, ``s = |p|_1 / d``; Karimireddy et al., ICML 2019,
Algorithm 2; the per-chunk form of 1-bit Adam's compressed all-reduce, Tang et al., ICML 2021)
leaves the error ``e = p - s sign(p)`` in place. Eager torch spends a full pass over memory per
operation (compare, pack, expand the signs back, dot product, update: ~5 passes and a
``(256, 8)`` row gather that runs at a fraction of copy speed), so on CPU this module works on
numpy views of the same memory (no copies) with kernels that are each one SIMD pass:

* ``sign`` is the IEEE sign bit (``-0.0`` is negative): ``np.signbit`` then
  ``np.packbits(bitorder="little")`` packs 8 per byte;
* the residual needs no expanded signs: ``p - copysign(s, p)``, with ``copysign`` done on the
  int32 bits (``p``'s sign bit OR ``s``'s bits; numpy's own ``copysign`` is not vectorised);
* each row is processed in cache-sized blocks, one pass for the scale and one for the rest;
* decoding is ``np.take`` of a ``(256, 8)`` table pre-multiplied by the row's scale
  (``mode="clip"``: with the default ``"raise"`` numpy buffers ``out`` and runs 7x slower).

Other devices (CUDA) take the same arithmetic in torch ops (:func:`encode_rows_torch`), tested
equal on CPU; untested on a GPU here.

Wire format of one row: ``c/8`` bytes of packed signs (bit ``i`` of byte ``j`` set when element
``8j+i`` is negative), then the scale as a float64 (8 bytes). A row whose input holds NaN or Inf
is sent with a NaN scale and no signs: a flag every receiver decodes to NaN, never a scale
computed from garbage (callers keep their residual for such rows; see ``finite`` below).
"""

from __future__ import annotations

import numpy as np
import torch

SCALE_BYTES = 8
#: Elements per block (1 MiB of float32): each block's passes run from the core's L2 cache, so
#: memory is read about twice per row, not once per operation.
BLOCK = 1 << 18
_SIGN_BIT = np.int32(-(1 << 31))


def _table() -> np.ndarray:
    bits = (np.arange(256)[:, None] >> np.arange(8)) & 1
    return (1 - 2 * bits).astype(np.float32)  # bit set: negative


#: ``(256, 8)`` float32: byte -> its 8 signs (+1 for a clear bit, -1 for a set bit).
SIGN_TABLE = _table()


class Scratch:
    """Reusable numpy work buffers, one per (name, shape, dtype): a fresh buffer per call would
    fault in new pages every step (as slow as the kernels themselves). Not thread-safe: one per
    thread that encodes."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[str, tuple[int, ...], str], np.ndarray] = {}

    def get(self, name: str, shape: tuple[int, ...], dtype: type) -> np.ndarray:
        key = (name, shape, np.dtype(dtype).str)
        buffer = self._buffers.get(key)
        if buffer is None:
            buffer = self._buffers[key] = np.empty(shape, dtype=dtype)
        return buffer


def row_bytes(c: int) -> int:
    """Payload bytes of one encoded row of ``c`` elements (``c`` a multiple of 8)."""
    return c // 8 + SCALE_BYTES


def encode_rows(rows: torch.Tensor, lengths: torch.Tensor,
                scratch: Scratch | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sign-compress each row with its own scale, leaving the compression error in ``rows``.

    Args:
        rows: float32 ``(R, c)``, contiguous, ``c`` a multiple of 8; padding past a row's length
            should be zero (it is then decoded as ``+-scale`` and must be ignored by the caller).
            Overwritten with ``rows - C(rows)``, except rows that are not finite (left as they
            were but unspecified: keep the previous residual for them).
        lengths: float32 ``(R,)``, real elements per row (the ``d`` of ``|p|_1 / d``), >= 1.
        scratch: work buffers to reuse across calls (CPU only).

    Returns:
        ``(payload, finite)``: uint8 ``(R, c/8 + 8)`` (packed signs, then the float64 scale) and
        bool ``(R,)``, False where the row held NaN or Inf (payload: NaN scale, zero bits).

    Raises:
        ValueError: not float32, not 2-D and contiguous, or ``c`` not a multiple of 8.
    """
    if rows.dtype != torch.float32 or rows.dim() != 2 or not rows.is_contiguous() \
            or rows.shape[1] % 8:
        raise ValueError(f"need contiguous float32 (R, c) rows with c % 8 == 0, got "
                         f"{rows.dtype} {tuple(rows.shape)}")
    if rows.device.type != "cpu":
        return encode_rows_torch(rows, lengths)
    r, c = rows.shape
    a = rows.numpy()
    scratch = scratch if scratch is not None else Scratch()
    magnitude = scratch.get("magnitude", (BLOCK,), np.float32)
    signs = scratch.get("signs", (BLOCK,), np.bool_)
    payload = np.empty((r, row_bytes(c)), dtype=np.uint8)
    scale = np.empty(r, dtype=np.float32)
    for i in range(r):
        scale[i] = _l1(a[i], magnitude) / lengths[i].item()
    finite = np.isfinite(scale)
    scale[~finite] = np.nan
    payload[:, c // 8 :] = scale.astype(np.float64).view(np.uint8).reshape(r, SCALE_BYTES)
    for i in np.flatnonzero(finite):
        _encode_row(a[i], scale[i], payload[i, : c // 8], magnitude, signs)
    payload[~finite, : c // 8] = 0
    return torch.from_numpy(payload), torch.from_numpy(finite)


def _l1(row: np.ndarray, magnitude: np.ndarray) -> float:
    total = 0.0
    for j in range(0, row.size, BLOCK):
        block = row[j : j + BLOCK]
        m = np.abs(block, out=magnitude[: block.size])
        total += float(m.sum(dtype=np.float32))  # numpy's pairwise sum within a block
    return total


def _encode_row(row: np.ndarray, scale: np.float32, packed: np.ndarray, magnitude: np.ndarray,
                signs: np.ndarray) -> None:
    """Pack ``row``'s signs into ``packed`` and leave ``row - copysign(scale, row)`` in it."""
    scale_bits = np.float32(scale).view(np.int32)
    for j in range(0, row.size, BLOCK):
        block = row[j : j + BLOCK]
        n = block.size
        b = signs[:n]
        packed[j // 8 : (j + n) // 8] = np.packbits(np.signbit(block, out=b), bitorder="little")
        # copysign(scale, row) as bits: the row's sign bit OR the scale's bits (numpy's own
        # copysign is not vectorised), then one subtraction
        sent = magnitude[:n].view(np.int32)
        np.bitwise_and(block.view(np.int32), _SIGN_BIT, out=sent)
        np.bitwise_or(sent, scale_bits, out=sent)
        np.subtract(block, sent.view(np.float32), out=block)


def encode_rows_torch(rows: torch.Tensor,
                      lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`encode_rows` in torch operations, for any device (the reference on CPU)."""
    from laggard.integrations.compression.bits import pack_bits

    r, c = rows.shape
    magnitude = rows.abs()
    scale = magnitude.sum(1) / lengths.to(rows.device)
    finite = torch.isfinite(scale)
    scale = torch.where(finite, scale, torch.full_like(scale, float("nan")))
    payload = torch.empty(r, row_bytes(c), dtype=torch.uint8, device=rows.device)
    payload[:, : c // 8] = pack_bits(torch.signbit(rows))
    payload[:, c // 8 :] = scale.to(torch.float64).view(torch.uint8).view(r, SCALE_BYTES)
    payload[~finite, : c // 8] = 0
    negative = torch.signbit(rows)
    rows.copy_((magnitude - scale.unsqueeze(1)) * (1 - 2 * negative.to(rows.dtype)))
    return payload, finite


def scales(payload: torch.Tensor) -> torch.Tensor:
    """The float64 scale of each row of a payload ``(R, c/8 + 8)``."""
    return payload[:, -SCALE_BYTES:].reshape(-1).clone().view(torch.float64)


def decode_rows(payload: torch.Tensor, out: torch.Tensor | None = None,
                weight: float = 1.0, accumulate: bool = False) -> torch.Tensor:
    """Expand a payload to ``weight * scale * sign``; NaN-flagged rows become NaN.

    Args:
        payload: uint8 ``(R, c/8 + 8)`` from :func:`encode_rows`.
        out: float32 ``(R, c)`` to write (or add) into; a new tensor when None.
        weight: multiplies every value (``1/W`` to average W rows while decoding them).
        accumulate: add into ``out`` instead of overwriting it.

    Returns:
        ``out``, float32 ``(R, c)``.
    """
    r, width = payload.shape
    c = 8 * (width - SCALE_BYTES)
    if out is None:
        out = torch.zeros(r, c, device=payload.device) if accumulate \
            else torch.empty(r, c, device=payload.device)
    row_scales = scales(payload).to(torch.float32) * weight
    if payload.device.type != "cpu":
        table = torch.from_numpy(SIGN_TABLE).to(payload.device)
        values = table[payload[:, : c // 8].long()].view(r, c) * row_scales.view(r, 1)
        return out.add_(values) if accumulate else out.copy_(values)
    signs, target = payload.numpy()[:, : c // 8], out.numpy().reshape(r, c // 8, 8)
    scratch = np.empty((c // 8, 8), dtype=np.float32) if accumulate else None
    for i, s in enumerate(row_scales.numpy()):
        table = SIGN_TABLE * s
        if scratch is None:
            np.take(table, signs[i], axis=0, out=target[i], mode="clip")
        else:
            np.take(table, signs[i], axis=0, out=scratch, mode="clip")
            np.add(target[i], scratch, out=target[i])
    return out


def accumulate_rows(payload: torch.Tensor, out: torch.Tensor, weight: float,
                    scratch: Scratch | None = None) -> torch.Tensor:
    """Add ``weight * decode(row)`` of every row of ``payload`` into the one row ``out``.

    The server stage of the compressed all-reduce: ``out`` (its error feedback) plus the mean of
    the W chunks it received, without materialising the ``(W, c)`` decoded matrix.

    Args:
        payload: uint8 ``(R, c/8 + 8)``.
        out: float32 ``(c,)``, contiguous.
        weight: multiplies every decoded value (``1/W`` for the mean).
        scratch: work buffers to reuse across calls (CPU only).

    Returns:
        ``out``.
    """
    r, width = payload.shape
    c = 8 * (width - SCALE_BYTES)
    if payload.device.type != "cpu":
        return out.add_(decode_rows(payload, weight=weight).sum(0))
    scratch = scratch if scratch is not None else Scratch()
    decoded = scratch.get("decoded", (c // 8, 8), np.float32)
    signs, target = payload.numpy()[:, : c // 8], out.numpy().reshape(c // 8, 8)
    for i, s in enumerate((scales(payload).to(torch.float32) * weight).numpy()):
        np.take(SIGN_TABLE * s, signs[i], axis=0, out=decoded, mode="clip")
        np.add(target, decoded, out=target)
    return out


def nan_row(c: int) -> torch.Tensor:
    """A one-row payload flagged as not finite (NaN scale, no signs): ``(1, c/8 + 8)`` uint8."""
    payload = torch.zeros(1, row_bytes(c), dtype=torch.uint8)
    payload[0, c // 8 :] = torch.tensor([float("nan")], dtype=torch.float64).view(torch.uint8)
    return payload
