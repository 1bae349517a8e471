"""The codecs' Numba kernels against numpy's own operations on the same inputs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support import budget

from laggard.compression import kernels


def _values(n: int, seed: int = 0) -> np.ndarray:
    values = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
    if n > 7:
        values[3], values[7] = -0.0, 0.0  # the sign bit decides, as np.signbit does
    return values


@pytest.mark.parametrize("n", [8, 64, 8 * 1001])
def test_sign_encode_packs_sign_bits_and_leaves_the_residual(n: int) -> None:
    values = _values(n)
    row = values.copy()
    scale = np.float32(kernels.l1_norm(row) / n)
    assert scale == pytest.approx(np.abs(values.astype(np.float64)).mean(), rel=1e-5)
    packed = np.empty(n // 8, dtype=np.uint8)
    kernels.sign_encode(row, scale, packed)
    assert np.array_equal(packed, np.packbits(np.signbit(values), bitorder="little"))
    assert np.array_equal(row, values - np.copysign(scale, values))


def test_sign_decode_and_accumulate_expand_the_bits() -> None:
    values = _values(8 * 513, seed=1)
    packed = np.packbits(np.signbit(values), bitorder="little")
    out = np.full(values.size, 7.0, dtype=np.float32)
    kernels.sign_decode(packed, np.float32(0.5), out)
    assert np.array_equal(out, np.where(np.signbit(values), -0.5, 0.5).astype(np.float32))
    kernels.sign_accumulate(packed, np.float32(0.25), out)
    assert np.array_equal(out, np.where(np.signbit(values), -0.75, 0.75).astype(np.float32))
    kernels.sign_decode(packed, np.float32(np.nan), out)
    assert np.isnan(out).all()


def test_l1_norm_of_non_finite_rows_is_not_finite() -> None:
    values = _values(100)
    values[50] = np.nan
    assert not np.isfinite(kernels.l1_norm(values))
    values[50] = np.inf
    assert not np.isfinite(kernels.l1_norm(values))


@pytest.mark.parametrize("n", [0, 5, 8, 1003, 100_003])
def test_collect_above_finds_every_position_in_order(n: int) -> None:
    values = _values(n, seed=2)
    threshold = 2.0
    out, picked = np.empty(n + 1, dtype=np.int64), np.empty(n + 1, dtype=np.float32)
    count = kernels.collect_above(values, kernels.threshold_bits(threshold), out, picked)
    expected = np.flatnonzero(np.abs(values) >= np.float32(threshold))
    assert count == expected.size
    assert np.array_equal(out[:count], expected)
    assert np.array_equal(picked[:count], values[expected])


def test_add_collect_above_adds_everything_then_collects() -> None:
    values, gradient = _values(10_007, seed=3), _values(9_001, seed=4)
    expected_values = values.copy()
    expected_values[: gradient.size] += gradient
    out, picked = np.empty(10_007, dtype=np.int64), np.empty(10_007, dtype=np.float32)
    count = kernels.add_collect_above(values, gradient, kernels.threshold_bits(2.5), out, picked)
    assert np.array_equal(values, expected_values)
    expected = np.flatnonzero(np.abs(expected_values) >= np.float32(2.5))
    assert count == expected.size and np.array_equal(out[:count], expected)
    assert np.array_equal(picked[:count], expected_values[expected])


def test_candidate_overflow_is_reported_and_the_add_still_completes() -> None:
    values, gradient = _values(4096, seed=5), _values(4096, seed=6)
    small, picked = np.empty(10, dtype=np.int64), np.empty(10, dtype=np.float32)
    limit = kernels.threshold_bits(0.1)  # most entries qualify: far more than 10
    assert kernels.collect_above(values, limit, small, picked) == -1
    expected = values + gradient
    assert kernels.add_collect_above(values, gradient, limit, small, picked) == -1
    assert np.array_equal(values, expected)


def test_take_topk_takes_the_largest_then_ties_and_zeroes_them() -> None:
    values = np.array([0.5, -3.0, 2.0, -2.0, 2.0, 1.0, -0.1, 4.0], dtype=np.float32)
    positions = np.arange(8, dtype=np.int64)
    chosen, picked = np.empty(3, dtype=np.int32), np.empty(3, dtype=np.float32)
    # top 3 by magnitude: 4.0, -3.0, then one of the three 2.0 ties (the first in order)
    kernels.take_topk(values, positions, values.copy(), np.float32(2.0), 3, chosen, picked,
                      True)
    assert chosen.tolist() == [1, 7, 2]
    assert picked.tolist() == [-3.0, 4.0, 2.0]
    assert values.tolist() == [0.5, 0.0, 0.0, -2.0, 2.0, 1.0, np.float32(-0.1), 0.0]


def test_scatter_add_places_each_region_and_refuses_a_nan_flag() -> None:
    out = np.zeros(10, dtype=np.float32)
    values = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
    positions = np.array([[0, 3], [1, 4]], dtype=np.int32)
    # regions of 6: row 1's offsets land at 7 and 10 (past the end: padding, dropped)
    assert kernels.scatter_add(out, values, positions, 6, np.float32(0.5))
    assert out.tolist() == [0.5, 0, 0, 1.0, 0, 0, 0, 1.5, 0, 0]
    values[1, 0] = np.nan
    assert not kernels.scatter_add(out, values, positions, 6, np.float32(1.0))
    assert out.tolist() == [0.5, 0, 0, 1.0, 0, 0, 0, 1.5, 0, 0]  # nothing added


def test_kernels_compile_in_a_read_only_install_with_a_read_only_home(tmp_path: Path) -> None:
    """Numba's ``cache=True`` raises at import when no cache location is writable; the kernels
    then compile per process (a locked-down container). Read-only bind mounts in a private mount
    namespace stand in for one."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare for the read-only mounts")
    home, package = tmp_path / "home", Path(kernels.__file__).parent
    home.mkdir()
    script = (f"mount --bind {package} {package} && mount -o remount,bind,ro {package} && "
              f"mount --bind {home} {home} && mount -o remount,bind,ro {home} && "
              f"touch {package}/probe 2>/dev/null && exit 3; "
              f"HOME={home} XDG_CACHE_HOME={home}/.cache {sys.executable} -c "
              "'import numpy as np; from laggard.compression import kernels; "
              "print(kernels.l1_norm(np.ones(16, np.float32)))'")
    proc = subprocess.run(["unshare", "-m", "bash", "-c", script], capture_output=True,
                          text=True, timeout=budget(120), cwd=tmp_path)
    if proc.returncode and "mount" in proc.stderr:
        pytest.skip(f"read-only mounts not permitted here: {proc.stderr.strip()[-200:]}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "16.0"


def test_warm_up_compiles_every_signature_the_codecs_use(one_rank_group: None) -> None:
    """After ``warm_up`` (run when a hook is made), the codecs' real calls compile nothing more:
    the first training step does not pay Numba's compile or load."""
    import torch

    from laggard.compression import make_hook
    from laggard.compression.signcodec import (
        accumulate_rows,
        decode_rows,
        encode_rows,
    )
    from laggard.compression.topk import scatter_rows, select_topk

    state, _ = make_hook("topk")  # warms the kernels up
    compiled = {name: len(kernel.signatures) for name, kernel in vars(kernels).items()
                if hasattr(kernel, "signatures")}
    values, gradient = torch.randn(200_000), torch.randn(200_000)
    select_topk(values, 2_000, torch.Generator(), add=gradient)
    state.select(values, gradient, 2_000)  # the payload's int32 positions
    state.close()
    payload, _ = encode_rows(torch.randn(4, 800), torch.full((4,), 800.0))
    decode_rows(payload, out=torch.empty(4, 800))
    decode_rows(payload, out=torch.zeros(4, 800), accumulate=True)
    accumulate_rows(payload, torch.zeros(800), 0.25)
    scatter_rows(torch.zeros(100), torch.zeros(2, 8, dtype=torch.int32), 50, 0.5)
    assert {name: len(kernel.signatures) for name, kernel in vars(kernels).items()
            if hasattr(kernel, "signatures")} == compiled
