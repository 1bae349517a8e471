"""Compression math without torch.distributed: bit packing, the sign and top-k compressors against
float64, per-parameter residuals across a bucket rebuild, and the per-algorithm byte counts."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from laggard.compression import make_hook
from laggard.compression.bits import pack_bits
from laggard.compression.bucket import FlatBucket
from laggard.compression.residuals import BucketLayout, ErrorFeedback
from laggard.compression.signcodec import (
    chunk_elements,
    chunk_lengths,
    compress_rows,
    decompress_rows,
)
from laggard.compression.topk import EXACT_BELOW, select_topk
from laggard.integrations.collective_bytes import (
    allgather_bytes,
    alltoall_bytes,
    ring_allreduce_bytes,
)


def test_pack_bits_matches_numpy_little_endian() -> None:
    mask = torch.rand(3, 8 * 37, generator=torch.Generator().manual_seed(0)) > 0.5
    packed = pack_bits(mask)
    assert packed.dtype == torch.uint8 and packed.shape == (3, 37)
    np.testing.assert_array_equal(packed.numpy(), np.packbits(mask.numpy(), axis=-1,
                                                              bitorder="little"))
    with pytest.raises(ValueError):
        pack_bits(torch.ones(12, dtype=torch.bool))


def test_sign_compression_error_is_exactly_the_documented_identity() -> None:
    # |p - C(p)|^2 = |p|^2 - |p|_1^2 / d per chunk, C(p) = (|p|_1 / d) sign(p)
    rows = torch.randn(4, 1000, generator=torch.Generator().manual_seed(1))
    rows[3, 600:] = 0  # a padded row: 600 real elements
    lengths = torch.tensor([1000.0, 1000.0, 1000.0, 600.0])
    d_all = 600
    p = rows.double().clone()
    residual = rows.clone()
    payload = compress_rows(residual, lengths)
    assert payload.shape == (4, 1000 // 8 + 8)
    sent = decompress_rows(payload).double()
    assert torch.equal(sent[:, :d_all] >= 0, p[:, :d_all] >= 0)  # signs unpacked as packed
    for i, d in enumerate([1000, 1000, 1000, 600]):
        x = p[i, :d]
        scale = x.abs().sum() / d
        reference = torch.where(x >= 0, scale, -scale)
        assert torch.allclose(sent[i, :d], reference, rtol=1e-6)
        expected_error = x.square().sum() - x.abs().sum() ** 2 / d
        assert math.isclose(float((x - sent[i, :d]).square().sum()), float(expected_error),
                            rel_tol=1e-5)
        # what was not sent stays in the residual, exactly
        assert torch.allclose(residual[i, :d].double(), x - sent[i, :d], atol=1e-6)


def test_chunks_cover_the_bucket_in_whole_bytes() -> None:
    for numel, world in [(1, 2), (1000, 3), (4096, 64), (12345, 7)]:
        c = chunk_elements(numel, world)
        assert c % 8 == 0 and c * world >= numel and (c - 8) * world < numel
        lengths = chunk_lengths(numel, world)
        assert int(lengths.sum()) >= numel and lengths.min() >= 1


def test_sampled_topk_selects_the_exact_top_k() -> None:
    g = torch.Generator().manual_seed(2)
    values = torch.randn(EXACT_BELOW * 4, generator=g)
    k = values.numel() // 100
    chosen = select_topk(values, k, torch.Generator().manual_seed(3))
    exact = torch.topk(values.abs(), k).indices
    assert chosen.numel() == k and chosen.unique().numel() == k
    assert set(chosen.tolist()) == set(exact.tolist())


def test_topk_error_bound() -> None:
    # |p - topk(p)|^2 <= (1 - k/d) |p|^2 (Stich et al. 2018, Lemma A.1)
    x = torch.randn(5000, generator=torch.Generator().manual_seed(4)).double()
    k = 50
    chosen = select_topk(x.float(), k, torch.Generator())
    rest = x.clone()
    rest[chosen] = 0
    assert rest.square().sum() <= (1 - k / x.numel()) * x.square().sum()
    assert rest.abs().max() <= x[chosen].abs().min()


def params(*shapes: tuple[int, ...]) -> list[torch.nn.Parameter]:
    return [torch.nn.Parameter(torch.zeros(shape)) for shape in shapes]


def test_residuals_follow_their_parameters_across_a_bucket_rebuild() -> None:
    a, b, c = params((3, 4), (5,), (2, 2))
    feedback = ErrorFeedback()
    first = [FlatBucket(0, [a, b]), FlatBucket(1, [c])]
    for bucket in first:
        flat = feedback.flat(bucket.index(), BucketLayout.of(bucket))
        flat.copy_(torch.arange(flat.numel()) + 100.0 * bucket.index())
    names = {id(a): "a", id(b): "b", id(c): "c"}
    before = feedback.export(names)
    # DDP's rebuild: new bucket 0 takes c and b, bucket 1 takes a
    rebuilt = [FlatBucket(0, [c, b]), FlatBucket(1, [a])]
    flats = [feedback.flat(bk.index(), BucketLayout.of(bk)) for bk in rebuilt]
    assert torch.equal(flats[0][:4], before["c"]) and torch.equal(flats[0][4:], before["b"])
    assert torch.equal(flats[1], before["a"])
    after = feedback.export(names)
    assert all(torch.equal(before[k], after[k]) for k in before)
    # a second call with the same layout serves the same buffer: no copying in steady state
    assert feedback.flat(0, BucketLayout.of(rebuilt[0])) is flats[0]


def test_eviction_lets_the_sign_hook_fold_its_server_residual() -> None:
    a, b = params((8,), (8,))
    seen = []

    def fold(index: int, layout: BucketLayout, flat: torch.Tensor) -> None:
        seen.append((index, layout.key))
        flat[:4] += 1.0  # updates a's residual: the views point into flat

    feedback = ErrorFeedback(on_evict=fold)
    feedback.flat(0, BucketLayout.of(FlatBucket(0, [a, b])))
    rebuilt = feedback.flat(0, BucketLayout.of(FlatBucket(0, [b, a])))
    assert seen == [(0, (id(a), id(b)))]
    assert torch.equal(rebuilt[8:12], torch.ones(4)) and rebuilt[:8].abs().sum() == 0


def test_residual_checkpoint_rejects_what_does_not_fit() -> None:
    a, = params((3, 3))
    feedback = ErrorFeedback()
    with pytest.raises(ValueError, match="unknown parameter"):
        feedback.load({"zzz": torch.zeros(9)}, {"a": a})
    with pytest.raises(ValueError, match="elements"):
        feedback.load({"a": torch.zeros(4)}, {"a": a})
    feedback.load({"a": torch.ones(3, 3)}, {"a": a})
    assert torch.equal(feedback.flat(0, BucketLayout.of(FlatBucket(0, [a]))), torch.ones(9))


def test_make_hook_needs_an_initialised_process_group() -> None:
    if torch.distributed.is_initialized():
        pytest.skip("a default process group exists in this process")
    with pytest.raises(ValueError, match="not initialised"):
        make_hook("none")


def test_sign_payload_beats_fp32_ring_allreduce_25_fold_at_every_world_size() -> None:
    # bytes from the payload tensors compress_rows really builds, one chunk per peer
    numel = 1_000_000
    raw = torch.randn(numel, generator=torch.Generator().manual_seed(5))
    for world in (2, 4, 8, 16, 32, 64):
        c = chunk_elements(numel, world)
        rows = torch.zeros(world * c)
        rows[:numel] = raw
        payload = compress_rows(rows.view(world, c), chunk_lengths(numel, world))
        chunk_bytes = payload[0].numel() * payload.element_size()
        sent = alltoall_bytes(chunk_bytes, world) + allgather_bytes(chunk_bytes, world)
        fp32 = ring_allreduce_bytes(numel * 4, world)
        assert fp32 / sent >= 25, (world, fp32 / sent)
        # and an all-gather of every rank's packed signs would not be:
        if world >= 4:
            assert fp32 / allgather_bytes(numel // 8, world) < 25
