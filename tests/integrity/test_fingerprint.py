"""Fingerprints, float64 sums, NaN/Inf counts and the bit-flip injector, in one process."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch", reason="the integrity check needs torch "
                                            "(pip install 'laggard[torch]')")

from laggard.integrations.faults import BitFlipInjector, flip_bit  # noqa: E402
from laggard.integrations.integrity_fingerprints import (  # noqa: E402
    BLOCK_WORDS,
    fingerprint,
    float64_sums,
    nonfinite_counts,
    row_fingerprints,
)


@pytest.mark.parametrize("dtype, bits", [(torch.float32, 32), (torch.bfloat16, 16),
                                         (torch.float16, 16), (torch.int32, 32)])
def test_every_single_bit_flip_changes_the_hash(dtype: torch.dtype, bits: int) -> None:
    x = (torch.randn(3 * BLOCK_WORDS * 2 + 5) * 100).to(dtype)
    clean = fingerprint(x)
    for element in (0, 1, BLOCK_WORDS * 2 - 1, x.numel() - 1):
        for bit in range(bits):
            y = x.clone()
            flip_bit(y, element, bit)
            assert fingerprint(y) != clean, (element, bit)


def test_moved_blocks_and_unaligned_rows() -> None:
    x = torch.randn(4 * BLOCK_WORDS * 2)
    swapped = torch.cat([x[2 * BLOCK_WORDS:4 * BLOCK_WORDS], x[:2 * BLOCK_WORDS],
                         x[4 * BLOCK_WORDS:]])
    assert fingerprint(swapped) != fingerprint(x)
    rows = torch.randint(0, 256, (5, 13), dtype=torch.uint8)  # 13 bytes: no wider word fits
    hashes = row_fingerprints(rows)
    assert hashes.tolist() == [fingerprint(r) for r in rows]
    rows[3, 12] ^= 0x80
    assert (row_fingerprints(rows) != hashes).tolist() == [False, False, False, True, False]


def test_float64_sums_match_exact_sums() -> None:
    x = torch.randn(1_000_003) * torch.logspace(-20, 20, 1_000_003)
    total, magnitude = float64_sums(x)
    exact = math.fsum(x.double().tolist())
    exact_abs = math.fsum(x.double().abs().tolist())
    bound = x.numel() * 2.0**-53 * exact_abs
    assert abs(total - exact) <= bound and abs(magnitude - exact_abs) <= bound


def test_nonfinite_counts_are_exact() -> None:
    x = torch.full((1000,), 60000.0, dtype=torch.float16)  # the plain sum overflows to inf
    assert nonfinite_counts(x) == (0, 0)
    x[3], x[4], x[5] = float("nan"), float("inf"), float("-inf")
    assert nonfinite_counts(x) == (1, 2)
    assert nonfinite_counts(torch.arange(5)) == (0, 0)


def test_flip_bit_follows_ieee754() -> None:
    x = torch.tensor([1.0, 2.0])
    assert flip_bit(x, 0, 31) == (1.0, -1.0)        # sign
    assert flip_bit(x, 1, 23) == (2.0, 4.0)         # lowest exponent bit
    assert flip_bit(x, 0, 30)[1] == -math.inf       # -1.0 with the exponent MSB set: -inf
    b = torch.tensor([1.0], dtype=torch.bfloat16)
    assert flip_bit(b, 0, 15) == (1.0, -1.0)        # bf16 sign bit is bit 15


def test_injector_fires_once_at_its_place() -> None:
    inj = BitFlipInjector.parse("rank=1,step=3,bucket=0,element=5,bit=31,where=before_send")
    x = torch.ones(8)
    assert not inj.maybe_flip("before_send", 0, 3, 0, x)
    assert not inj.maybe_flip("after_reduce", 1, 3, 0, x)
    assert not inj.maybe_flip("before_send", 1, 3, 1, x)
    assert inj.maybe_flip("before_send", 1, 3, 0, x)
    assert x[5] == -1 and (inj.old, inj.new) == (1.0, -1.0)
    assert not inj.maybe_flip("before_send", 1, 3, 0, x)


@pytest.mark.parametrize("spec, error", [
    ("rank=1,step=3", "missing"),
    ("rank=1,step=3,bucket=0,element=5,bit=1,where=wire", "where"),
    ("rank=1,step=x,bucket=0,element=5,bit=1,where=param", "invalid literal"),
    ("rank=1,step=3,bucket=0,element=5,bit=1,where=param,colour=red", "unknown"),
    ("rank=-1,step=3,bucket=0,element=5,bit=1,where=param", ">= 0"),
])
def test_injector_spec_errors(spec: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        BitFlipInjector.parse(spec)
