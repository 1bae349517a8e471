"""Fixtures shared by the compression tests."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import pytest

# Every compression test needs torch (and most numba): on a node without them (pip install
# laggard, no [torch] extra) the folder is left out at collection instead of failing there.
if importlib.util.find_spec("torch") is None or importlib.util.find_spec("numba") is None:
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture(scope="module")
def one_rank_group() -> Iterator[None]:
    """A default gloo process group of one rank in this process, for hooks called directly."""
    dist = pytest.importorskip("torch.distributed")
    if dist.is_initialized():
        pytest.skip("a default process group exists in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()
