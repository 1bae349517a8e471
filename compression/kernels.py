"""The CPU inner loops of the codecs, compiled by Numba: one pass over memory each.

Eager torch and numpy spend one pass over the buffer per operation (absolute value, compare,
pack, expand, subtract, ...), so a codec of five operations runs at a fifth of memory speed or
less. Each kernel here does its whole job per element in one loop that LLVM vectorises, reading
and writing each buffer once: the sign codec's scale pass reads the row once, its encode pass
reads it and writes back the residual and the packed bits, its decode pass writes the output
once; top-k's candidate pass reads the bucket once (adding the new gradient on the way).

Compiled on first use (a few seconds for all of them; cached on disk next to this file or in
Numba's user cache, so later processes load them in about half a second) and run without the
GIL, so a codec on the autograd thread does not stall the hook's second-stage thread. Inputs are
contiguous numpy arrays (views of the tensors' memory: no copies); the callers check dtypes and
shapes.

Sign semantics are the IEEE sign bit, as :func:`numpy.signbit` (``-0.0`` is negative), and the
bit order is numpy's ``packbits(bitorder="little")``: bit ``i`` of byte ``j`` is element
``8 j + i``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

try:
    from numba import njit, types
    from numba.extending import intrinsic
except ImportError as exc:  # installed without the torch extra
    raise ImportError("laggard's compression hooks compile their CPU codecs with Numba: "
                      "pip install 'laggard[torch]' (or numba)") from exc


def _kernel(**options: Any) -> Callable[[Callable[..., Any]], Any]:
    """``numba.njit`` without the GIL, cached on disk where Numba finds a writable place (next to
    this file, or the user's cache directory); compiled per process where it does not (a
    read-only install with a read-only home, as in a locked-down container), since Numba's
    ``cache=True`` then raises at import."""
    def compile_lazily(function: Callable[..., Any]) -> Any:
        try:
            return njit(cache=True, nogil=True, **options)(function)
        except RuntimeError:  # "cannot cache function ...: no locator available"
            return njit(nogil=True, **options)(function)
    return compile_lazily


@_kernel(fastmath={"reassoc", "contract"})
def l1_norm(row: np.ndarray) -> float:
    """``sum |row|`` of a float32 row, accumulated in float32 lanes (reassociated so it
    vectorises; relative error ~1e-6 per million elements). NaN or Inf in, NaN or Inf out."""
    total = np.float32(0.0)
    for i in range(row.size):
        total += abs(row[i])
    return total


@_kernel()
def sign_encode(row: np.ndarray, scale: np.float32, packed: np.ndarray) -> None:
    """Pack ``row``'s sign bits into ``packed`` and leave ``row - copysign(scale, row)`` in it.

    Args:
        row: float32 ``(8 B,)``, overwritten with the residual.
        scale: float32, the row's scale (finite, >= 0).
        packed: uint8 ``(B,)``, overwritten.
    """
    bits = row.view(np.uint32)
    for j in range(packed.size):
        byte = np.uint32(0)
        for i in range(8):
            negative = bits[8 * j + i] >> np.uint32(31)
            byte |= negative << np.uint32(i)
            row[8 * j + i] -= -scale if negative else scale
        packed[j] = np.uint8(byte)


@_kernel()
def sign_decode(packed: np.ndarray, scale: np.float32, out: np.ndarray) -> None:
    """``out[8 j + i] = -scale`` where bit ``i`` of ``packed[j]`` is set, else ``scale``.

    Args:
        packed: uint8 ``(B,)``.
        scale: float32 (NaN decodes to NaN everywhere).
        out: float32 ``(8 B,)``, overwritten.
    """
    for j in range(packed.size):
        byte = packed[j]
        for i in range(8):
            out[8 * j + i] = -scale if (byte >> i) & 1 else scale


@_kernel()
def sign_accumulate(packed: np.ndarray, scale: np.float32, out: np.ndarray) -> None:
    """:func:`sign_decode`, added into ``out`` instead of overwriting it."""
    for j in range(packed.size):
        byte = packed[j]
        for i in range(8):
            out[8 * j + i] += -scale if (byte >> i) & 1 else scale


#: Elements tested together by the candidate kernels: a vectorised "any above?" per group, then
#: a scalar scan of the rare groups that have one. Measured here on 25 MB at 1% density: 8 is
#: the fastest of 8-128 for the read-only search (2.6 ms against a 2.5 ms copy), 32 for the
#: search fused with the add (3.5 ms against 2.2 ms; 5.5 ms with groups of 8).
GROUP = 8
ADD_GROUP = 32
_MAGNITUDE = np.uint32(0x7FFFFFFF)


def threshold_bits(threshold: float) -> np.uint32:
    """The bits of a float32 magnitude threshold, as the candidate kernels compare them (the
    bits of finite non-negative floats order like the floats)."""
    return np.array([threshold], dtype=np.float32).view(np.uint32)[0]


@_kernel()
def collect_above(values: np.ndarray, limit: np.uint32, positions: np.ndarray,
                  picked: np.ndarray) -> int:
    """Entries with ``|values[i]| >= threshold``, in order: positions and values.

    Args:
        values: float32 ``(N,)``, finite.
        limit: :func:`threshold_bits` of the threshold (> 0).
        positions: int64 ``(C,)``, written from the start.
        picked: float32 ``(C,)``, the values at those positions (saves the caller a gather of
            random positions from memory).

    Returns:
        How many entries qualify, or -1 when more than ``C`` do (the caller then falls back to
        an exact selection).
    """
    bits = values.view(np.uint32)
    count, n = 0, values.size
    full = n - n % GROUP
    for start in range(0, full, GROUP):
        hit = np.uint32(0)
        for i in range(start, start + GROUP):  # a fixed trip count: vectorised
            hit |= np.uint32((bits[i] & _MAGNITUDE) >= limit)
        if hit:
            count = _scan(values, start, start + GROUP, limit, positions, picked, count)
            if count < 0:
                return -1
    return _scan(values, full, n, limit, positions, picked, count)


@_kernel()
def add_collect_above(values: np.ndarray, gradient: np.ndarray, limit: np.uint32,
                      positions: np.ndarray, picked: np.ndarray) -> int:
    """``values[:G] += gradient`` (``G = gradient.size <= N``), then :func:`collect_above`, in
    one pass: the error-feedback add and the candidate search of top-k read memory once. The
    add is always complete, even when the candidates overflow (-1)."""
    count, added = 0, gradient.size
    full = added - added % ADD_GROUP
    for start in range(0, full, ADD_GROUP):
        hit = np.uint32(0)
        for i in range(start, start + ADD_GROUP):
            value = values[i] + gradient[i]
            values[i] = value
            # the bits of the register, not of memory: a bits view of ``values`` could be
            # read before this write lands (LLVM takes numba's arrays as not aliasing)
            hit |= np.uint32((_bits(value) & _MAGNITUDE) >= limit)  # type: ignore[call-arg]
        if hit and count >= 0:  # after an overflow, only the add goes on
            count = _scan(values, start, start + ADD_GROUP, limit, positions, picked, count)
    for i in range(full, added):
        values[i] += gradient[i]
    count = _scan(values, full, added, limit, positions, picked, count)
    if count < 0:
        return -1
    rest = collect_above(values[added:], limit, positions[count:], picked[count:])
    if rest < 0:
        return -1
    positions[count : count + rest] += added
    return count + rest


@intrinsic
def _bits(typingctx, value):  # type: ignore[no-untyped-def]
    """The IEEE bits of a float32 in a register (an LLVM bitcast; numba has no scalar view)."""
    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        return builder.bitcast(args[0], context.get_value_type(types.uint32))
    return types.uint32(types.float32), codegen


@_kernel(inline="always")
def _scan(values: np.ndarray, start: int, end: int, limit: np.uint32, positions: np.ndarray,
          picked: np.ndarray, count: int) -> int:
    """Append the entries of ``[start, end)`` at or above ``limit``; -1 once the outputs are
    full (or were already)."""
    if count < 0:
        return -1
    for i in range(start, end):
        value = values[i]
        if (_bits(value) & _MAGNITUDE) >= limit:  # type: ignore[call-arg]
            if count == positions.size:
                return -1
            positions[count] = i
            picked[count] = value
            count += 1
    return count


@_kernel()
def scatter_add(out: np.ndarray, values: np.ndarray, positions: np.ndarray, region: int,
                weight: np.float32) -> bool:
    """``out[positions[r, j] + r region] += weight values[r, j]`` for every row ``r`` of the
    sparse rows, dropping positions at or past ``out.size`` (padding regions).

    Args:
        out: float32 ``(N,)``, added into.
        values: float32 ``(R, k)``.
        positions: int32 ``(R, k)``, offsets in row ``r``'s region (``region`` 0: positions in
            ``out`` itself).
        region: elements per region.
        weight: multiplies every value.

    Returns:
        False, with nothing added, when a value is NaN or Inf (a sender's NaN flag).
    """
    rows, k = values.shape
    for r in range(rows):
        for j in range(k):
            if not np.isfinite(values[r, j]):
                return False
    for r in range(rows):
        base = r * region
        for j in range(k):
            where = base + positions[r, j]
            if where < out.size:
                out[where] += weight * values[r, j]
    return True


@_kernel()
def take_topk(values: np.ndarray, positions: np.ndarray, picked: np.ndarray, kth: np.float32,
              k: int, out_positions: np.ndarray, out_values: np.ndarray, zero: bool) -> None:
    """The exact top ``k`` by magnitude of the candidates a collect kernel found, given the k-th
    largest candidate magnitude ``kth`` (numpy's ``partition`` finds it faster than Numba's):
    those above it, then ties in order until there are k.

    Args:
        values: float32 ``(N,)``, the buffer the candidates came from; with ``zero``, the
            chosen entries are set to 0 in it (what error feedback keeps is the rest).
        positions, picked: the candidates' positions and values, ``(C,)``, ``C >= k``.
        kth: the k-th largest of ``|picked|``.
        k: entries to take, >= 1.
        out_positions: ``(k,)`` of any integer dtype, the chosen positions.
        out_values: float32 ``(k,)``, their values.
        zero: zero the chosen entries in ``values``.
    """
    taken = 0
    for i in range(positions.size):
        if taken == k:  # only a wrong kth gets here: never write past the outputs
            break
        if abs(picked[i]) > kth:
            out_positions[taken] = positions[i]
            out_values[taken] = picked[i]
            taken += 1
    for i in range(positions.size):
        if taken == k:
            break
        if abs(picked[i]) == kth:
            out_positions[taken] = positions[i]
            out_values[taken] = picked[i]
            taken += 1
    if zero:
        for i in range(k):
            values[out_positions[i]] = 0


def warm_up() -> None:
    """Compile (or load from the disk cache) every kernel for the argument types the codecs pass,
    on tiny inputs: a hook calls this when it is made, so the first compressed training step
    does not pay Numba's 0.5 s (cached) to several seconds (first compile) inside backward."""
    values, gradient = np.ones(64, dtype=np.float32), np.ones(64, dtype=np.float32)
    payload = np.zeros((2, 16), dtype=np.uint8)
    scale = np.float32(1.0)
    l1_norm(values)
    sign_encode(values.copy(), scale, payload[0, :8])
    sign_decode(payload[0, :8], scale, values)
    sign_accumulate(payload[0, :8], scale, values)
    positions, picked = np.empty(64, dtype=np.int64), np.empty(64, dtype=np.float32)
    limit = threshold_bits(0.5)
    collect_above(values, limit, positions, picked)
    count = add_collect_above(values, gradient, limit, positions, picked)
    entries = np.zeros((1, 8), dtype=np.int32)  # a hook's payload: values' bits, positions
    for chosen in (entries[0, 4:], np.empty(4, dtype=np.int64)):
        take_topk(values, positions[:count], picked[:count], np.float32(2.0), 4, chosen,
                  entries[0, :4].view(np.float32), True)
    rows = np.zeros((2, 8), dtype=np.int32)
    scatter_add(values, rows[:, :4].view(np.float32), rows[:, 4:], 4, np.float32(0.5))
