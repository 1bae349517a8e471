"""The sign codec of the two-stage compressed all-reduce: one payload layout, one sign table.

Both sign hooks use it: ``sign`` (EF-SignSGD, :mod:`.sign`) and 1-bit Adam (:mod:`.onebit_adam`).
A bucket (or 1-bit Adam's flat momentum) is cut into W rows of :func:`chunk_elements` elements,
a whole number of bytes each; each row ``p`` is sent as ``s sign(p)`` with one scale per row,
``s = |p|_1 / d`` (``d``: the row's real, unpadded elements; Karimireddy et al., ICML 2019,
Algorithm 2; the per-chunk form of 1-bit Adam's compressed all-reduce, Tang et al., ICML 2021),
and the error ``e = p - s sign(p)`` is left in place for error feedback.

Payload of one row (uint8, :func:`row_bytes` = ``c/8 + 8`` for ``c`` elements): ``c/8`` bytes of
packed signs, bit ``i`` of byte ``j`` for element ``8j+i`` (``np.packbits(bitorder="little")``),
then the scale as a float64 (8 bytes). A row whose input held NaN or Inf is sent with a NaN
scale and no signs (:func:`nan_row`): a flag every receiver decodes to NaN, never a scale computed
from garbage (callers keep their residual for such rows; see ``finite`` below).

What a set bit means is the sender's convention, and the two hooks differ (each hook's bytes are
its own, unchanged since it was written):

* 1-bit Adam, :func:`encode_rows`: the IEEE sign bit, set where the element is negative
  (``-0.0`` included). Eager torch spends a full pass over memory per operation (compare, pack,
  expand the signs back, dot product, update: ~5 passes), so on CPU the work is done by the
  Numba kernels of :mod:`.kernels` on numpy views of the same memory (no copies): one read of
  the row for its scale, one pass that packs the signs and writes the residual, one write of the
  decoded row. Other devices (CUDA) take the same arithmetic in torch ops
  (:func:`encode_rows_torch`), tested equal on CPU; untested on a GPU here.
* ``sign``, :func:`compress_rows`: set where ``p >= 0`` (sign(0), ``-0.0`` too, is +), in torch
  ops on any device, the scale from a dot product with the signs.

Decoding is one function for both (:func:`decode_rows`): the sign hook's complemented bits decode
as the sign bit's with the scale negated (:func:`decompress_rows`), which is exact.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from laggard.compression import kernels
from laggard.compression.bits import pack_bits
from laggard.integrations.device_reads import on_host

SCALE_BYTES = 8


def _table() -> np.ndarray:
    bits = (np.arange(256)[:, None] >> np.arange(8)) & 1
    return (1 - 2 * bits).astype(np.float32)  # bit set: negative


#: ``(256, 8)`` float32: byte -> its 8 signs (+1 for a clear bit, -1 for a set bit). Unpacking
#: off the CPU kernels is one lookup per byte (a gather writing 32 bytes), the cheapest way torch
#: has to expand bits to floats without a custom kernel.
SIGN_TABLE = _table()
# The same table for the sign hook's convention (set bit: +1): its negation, exact, as a tensor.
_NONNEGATIVE_SIGNS = torch.from_numpy(-SIGN_TABLE)
_device_tables: dict[tuple[torch.device, bool], torch.Tensor] = {}


def sign_table(device: torch.device, nonnegative: bool = False) -> torch.Tensor:
    """:data:`SIGN_TABLE` (or its negation, the ``sign`` hook's convention) as a float32
    ``(256, 8)`` tensor on ``device``. Off the CPU it is computed there, once per device, from
    ``arange`` (exact small integers): a copy from host memory would be a blocking transfer."""
    if device.type == "cpu":
        return _NONNEGATIVE_SIGNS if nonnegative else torch.from_numpy(SIGN_TABLE)
    table = _device_tables.get((device, nonnegative))
    if table is None:
        bits = (torch.arange(256, device=device).unsqueeze(1)
                >> torch.arange(8, device=device)) & 1
        table = (1 - 2 * bits).to(torch.float32)
        table = _device_tables[(device, nonnegative)] = -table if nonnegative else table
    return table


def chunk_elements(numel: int, world_size: int) -> int:
    """Elements per row (chunk) when ``numel`` elements are cut into ``world_size`` rows:
    ``numel / world_size`` rounded up to a multiple of 8 (whole bytes of signs); 8 for 0."""
    return 8 * math.ceil(numel / (8 * world_size)) if numel else 8


def chunk_lengths(numel: int, world_size: int,
                  device: torch.device | None = None) -> torch.Tensor:
    """Real (unpadded) elements of each row, float32 of shape ``(world_size,)`` on ``device``
    (default CPU), at least 1 (a row of padding only divides its zero norm by 1). Made on the
    device itself: the codecs divide by it there, and a host copy would block."""
    c = chunk_elements(numel, world_size)
    starts = torch.arange(world_size, device=device) * c
    return (numel - starts).clamp(0, c).clamp(min=1).to(torch.float32)


def row_bytes(c: int) -> int:
    """Payload bytes of one encoded row of ``c`` elements (``c`` a multiple of 8)."""
    return c // 8 + SCALE_BYTES


def encode_rows(rows: torch.Tensor,
                lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sign-compress each row with its own scale, leaving the compression error in ``rows``.

    Args:
        rows: float32 ``(R, c)``, contiguous, ``c`` a multiple of 8; padding past a row's length
            should be zero (it is then decoded as ``+-scale`` and must be ignored by the caller).
            Overwritten with ``rows - C(rows)``, except rows that are not finite (left as they
            were).
        lengths: float32 ``(R,)``, real elements per row (the ``d`` of ``|p|_1 / d``), >= 1, on
            ``rows``' device (:func:`chunk_lengths` with ``device=``: no copy here).

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
    if not on_host(rows):
        return encode_rows_torch(rows, lengths)
    r, c = rows.shape
    a = rows.numpy()
    payload = np.zeros((r, row_bytes(c)), dtype=np.uint8)
    scale = np.empty(r, dtype=np.float32)
    for i, length in enumerate(lengths.tolist()):
        # row by row, so that the encode pass finds the row still in cache after its scale's
        scale[i] = np.float32(kernels.l1_norm(a[i]) / length)
        if np.isfinite(scale[i]):
            kernels.sign_encode(a[i], scale[i], payload[i, : c // 8])
    finite = np.isfinite(scale)
    scale[~finite] = np.nan
    payload[:, c // 8 :] = scale.astype(np.float64).view(np.uint8).reshape(r, SCALE_BYTES)
    return torch.from_numpy(payload), torch.from_numpy(finite)


def encode_rows_torch(rows: torch.Tensor,
                      lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`encode_rows` in torch operations, for any device (the reference on CPU)."""
    r, c = rows.shape
    magnitude = rows.abs()
    scale = magnitude.sum(1) / lengths  # on rows' device (chunk_lengths(device=))
    finite = torch.isfinite(scale)
    scale = torch.where(finite, scale, torch.full_like(scale, float("nan")))
    payload = torch.empty(r, row_bytes(c), dtype=torch.uint8, device=rows.device)
    payload[:, : c // 8] = pack_bits(torch.signbit(rows))
    payload[:, c // 8 :] = scale.to(torch.float64).view(torch.uint8).view(r, SCALE_BYTES)
    payload[:, : c // 8].masked_fill_(~finite.unsqueeze(1), 0)  # no boolean-mask indexing:
    # it takes a data-dependent nonzero(), a host wait on a device
    negative = torch.signbit(rows)
    rows.copy_((magnitude - scale.unsqueeze(1)) * (1 - 2 * negative.to(rows.dtype)))
    return payload, finite


def compress_rows(rows: torch.Tensor, lengths: torch.Tensor,
                  keep: torch.Tensor | None = None) -> torch.Tensor:
    """The ``sign`` hook's encoding: bit set where ``p >= 0``; the error is left in ``rows``.

    Torch operations on any device; the caller has checked that ``rows`` are finite (the sign
    hook sends :func:`nan_row` otherwise).

    Args:
        rows: float32 ``(R, c)``, ``c`` a multiple of 8, zero-padded past each row's length;
            overwritten with ``rows - C(rows)`` (the new error-feedback residual).
        lengths: float32 ``(R,)``, real elements per row (the ``d`` of the scale), >= 1, on
            ``rows``' device.
        keep: optional 0-d bool tensor on ``rows``' device: where False, ``rows`` are left as
            they were (the update is scaled by 0 on the device: the sign hook's NaN decision,
            taken without a host read; the payload is then the caller's to replace).

    Returns:
        uint8 ``(R, c/8 + 8)``: packed signs, then the scale ``|row|_1 / length`` as float64.

    Raises:
        ValueError: ``c`` is not a multiple of 8 (from the bit packing).
    """
    r, c = rows.shape
    payload = torch.empty(r, row_bytes(c), dtype=torch.uint8, device=rows.device)
    packed = pack_bits(rows >= 0)
    payload[:, : c // 8] = packed
    # the signs as +-1, exactly as the receiver will expand them (sign(0) = +1)
    signs = torch.index_select(sign_table(rows.device, nonnegative=True), 0,
                               packed.view(-1).long()).view(r, c)
    # |row|_1 / d as the dot product with the signs; torch.dot per row runs at memory speed,
    # where vecdot over (R, c) and abs().sum() make a temporary or take a slower path
    l1 = torch.stack([torch.dot(rows[i], signs[i]) for i in range(r)])
    scale = l1 / lengths
    payload[:, c // 8 :] = scale.to(torch.float64).view(torch.uint8).view(r, SCALE_BYTES)
    if keep is not None:
        scale = torch.where(keep, scale, 0.0)  # rows - 0 * sign = rows, exactly
    rows.addcmul_(signs, scale.unsqueeze(1), value=-1)
    return payload


def decompress_rows(payload: torch.Tensor) -> torch.Tensor:
    """Decode a :func:`compress_rows` payload: float32 ``(R, c)`` of ``+scale`` where a bit is
    set, ``-scale`` where it is clear.

    :func:`decode_rows` with the scale negated (``weight=-1``): its set bits mean negative, so
    ``-(-s)`` lands where the sign hook set its bit; negating a float is exact, so the values are
    those of a table of ``+-1`` times the scale, bit for bit.
    """
    return decode_rows(payload, weight=-1.0)


def scales(payload: torch.Tensor) -> torch.Tensor:
    """The float64 scale of each row of a payload ``(R, c/8 + 8)``: shape ``(R,)``."""
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
    if not on_host(payload):
        table = sign_table(payload.device)
        values = table[payload[:, : c // 8].long()].view(r, c) * row_scales.view(r, 1)
        return out.add_(values) if accumulate else out.copy_(values)
    signs, target = payload.numpy()[:, : c // 8], out.numpy()
    kernel = kernels.sign_accumulate if accumulate else kernels.sign_decode
    for i, s in enumerate(row_scales.numpy()):
        kernel(signs[i], s, target[i])
    return out


def accumulate_rows(payload: torch.Tensor, out: torch.Tensor, weight: float) -> torch.Tensor:
    """Add ``weight * decode(row)`` of every row of ``payload`` into the one row ``out``.

    The server stage of the compressed all-reduce: ``out`` (its error feedback) plus the mean of
    the W chunks it received, without materialising the ``(W, c)`` decoded matrix.

    Args:
        payload: uint8 ``(R, c/8 + 8)``.
        out: float32 ``(c,)``, contiguous.
        weight: multiplies every decoded value (``1/W`` for the mean).

    Returns:
        ``out``.
    """
    if not on_host(payload):
        return out.add_(decode_rows(payload, weight=weight).sum(0))
    r, width = payload.shape
    signs, target = payload.numpy()[:, : width - SCALE_BYTES], out.numpy()
    for i, s in enumerate((scales(payload).to(torch.float32) * weight).numpy()):
        kernels.sign_accumulate(signs[i], s, target)
    return out


def nan_row(c: int, device: torch.device | None = None) -> torch.Tensor:
    """A one-row payload flagged as not finite (NaN scale, no signs): ``(1, c/8 + 8)`` uint8,
    made on ``device`` (default CPU) without a host copy."""
    payload = torch.zeros(1, row_bytes(c), dtype=torch.uint8, device=device)
    payload[0, c // 8 :] = torch.full((1,), float("nan"), dtype=torch.float64,
                                      device=device).view(torch.uint8)
    return payload
