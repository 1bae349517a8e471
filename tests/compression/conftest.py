"""Fixtures shared by the compression tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="module")
def one_rank_group() -> Iterator[None]:
    """A default gloo process group of one rank in this process, for hooks called directly."""
    dist = pytest.importorskip("torch.distributed")
    if dist.is_initialized():
        pytest.skip("a default process group exists in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()
