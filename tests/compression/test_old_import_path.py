"""``laggard.integrations.compression``, the old home of :mod:`laggard.compression`, re-exports it:
every name and submodule users imported from there is the very same object."""

from __future__ import annotations

import importlib

import pytest

pytest.importorskip("torch")
pytest.importorskip("numba")

import laggard.compression as compression  # noqa: E402
import laggard.integrations.compression as old  # noqa: E402

SUBMODULES = ("base", "bits", "bucket", "fp16", "kernels", "momentum", "none", "onebit_adam",
              "powersgd", "residuals", "sign", "signcodec", "topk", "two_stage")


def test_the_package_names_are_the_same_objects() -> None:
    for name in compression.__all__:
        assert getattr(old, name) is getattr(compression, name), name
    for name in ("make_hook", "COMPRESSORS", "MOMENTUM", "TopKCompression", "SignCompression",
                 "PowerSGDCompression", "Fp16Compression", "NoCompression",
                 "OneBitAdamCompression", "OneBitAdam", "MomentumCompression"):
        assert getattr(old, name) is getattr(compression, name), name
    assert old.TopKCompression is compression.COMPRESSORS["topk"]
    assert old.SignCompression is compression.COMPRESSORS["sign"]
    assert old.OneBitAdamCompression is compression.COMPRESSORS["onebit_adam"]


@pytest.mark.parametrize("name", SUBMODULES)
def test_the_old_submodule_paths_are_the_new_modules(name: str) -> None:
    new = importlib.import_module(f"laggard.compression.{name}")
    assert importlib.import_module(f"laggard.integrations.compression.{name}") is new
    assert getattr(old, name) is new


def test_the_renamed_modules_keep_their_old_paths() -> None:
    from laggard.integrations import collective_bytes
    from laggard.integrations.compression.sign import chunk_elements, compress_rows
    from laggard.integrations.compression.wire import ring_allreduce_bytes, tensor_bytes

    assert importlib.import_module("laggard.integrations.compression.wire") is collective_bytes
    assert ring_allreduce_bytes is collective_bytes.ring_allreduce_bytes
    assert tensor_bytes is collective_bytes.tensor_bytes
    signcodec = importlib.import_module("laggard.compression.signcodec")
    assert compress_rows is signcodec.compress_rows
    assert chunk_elements is signcodec.chunk_elements


def test_the_lazy_names_of_laggard_integrations_are_the_same_objects() -> None:
    import laggard.integrations as integrations

    assert integrations.make_hook is compression.make_hook is old.make_hook
    assert integrations.COMPRESSORS is compression.COMPRESSORS
