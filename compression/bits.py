"""Packing booleans 8 per byte with whole-tensor integer arithmetic (any device, no Python loop).

Bit ``i`` of byte ``j`` holds element ``8*j + i`` (little-endian bit order, the same as
``numpy.packbits(..., bitorder="little")``).

The multiply is the classic SWAR byte gather (Warren, "Hacker's Delight", 2nd ed., §7-2): eight
0/1 bytes of a little-endian 64-bit word times ``0x0102040810204080`` land, one per bit, in the
top byte without carries. int64 products wrap modulo 2**64, which is the arithmetic the trick
needs. (Unpacking is a table lookup or a kernel: see ``signcodec.SIGN_TABLE``.)
"""

from __future__ import annotations

import torch

_GATHER = 0x0102040810204080


def pack_bits(mask: torch.Tensor) -> torch.Tensor:
    """Pack a boolean tensor 8 elements per byte.

    Args:
        mask: bool tensor of shape ``(..., n)``, contiguous, ``n`` a multiple of 8.

    Returns:
        uint8 tensor of shape ``(..., n // 8)``.

    Raises:
        ValueError: ``n`` is not a multiple of 8 or ``mask`` is not bool.
    """
    if mask.dtype != torch.bool or mask.shape[-1] % 8:
        raise ValueError(f"need a bool tensor with a last dimension divisible by 8, got "
                         f"{mask.dtype} {tuple(mask.shape)}")
    words = mask.contiguous().view(torch.uint8).view(torch.int64)
    # the arithmetic shift leaves sign copies above bit 7; the uint8 cast drops them
    return ((words * _GATHER) >> 56).to(torch.uint8)
