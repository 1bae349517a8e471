"""``laggard.integrations.compression``: the old import path of :mod:`laggard.compression`.

Gradient compression moved to its own package, ``laggard.compression`` (a training-side library
the monitor measures, not observability). Everything that was importable here still is, as the
very same objects: the package's names (``make_hook``, ``COMPRESSORS``, the hook state classes)
and its submodules (``laggard.integrations.compression.topk`` is ``laggard.compression.topk``),
including the two renamed ones: ``.wire`` is :mod:`laggard.integrations.collective_bytes` and
the sign hook's codec lives in :mod:`laggard.compression.signcodec` beside 1-bit Adam's.

New code should import ``laggard.compression``.
"""

from __future__ import annotations

import sys

# The submodules are registered under the old names (no second copy of any module is loaded:
# a class imported through either path is the same class).
from laggard.compression import (  # noqa: F401  (re-exported)
    COMPRESSORS,
    MOMENTUM,
    CompressionState,
    MomentumCompression,
    OneBitAdam,
    base,
    bits,
    bucket,
    compression_hook,
    fp16,
    kernels,
    make_hook,
    momentum,
    none,
    onebit_adam,
    powersgd,
    residuals,
    sign,
    signcodec,
    topk,
    two_stage,
)
from laggard.compression.fp16 import Fp16Compression  # noqa: F401
from laggard.compression.none import NoCompression  # noqa: F401
from laggard.compression.onebit_adam import OneBitAdamCompression  # noqa: F401
from laggard.compression.powersgd import PowerSGDCompression  # noqa: F401
from laggard.compression.sign import SignCompression  # noqa: F401
from laggard.compression.topk import TopKCompression  # noqa: F401
from laggard.integrations import collective_bytes as wire

#: Old submodule name -> the module it now is.
SUBMODULES = {
    "base": base, "bits": bits, "bucket": bucket, "fp16": fp16, "kernels": kernels,
    "momentum": momentum, "none": none, "onebit_adam": onebit_adam, "powersgd": powersgd,
    "residuals": residuals, "sign": sign, "signcodec": signcodec, "topk": topk,
    "two_stage": two_stage, "wire": wire,
}
for _name, _module in SUBMODULES.items():
    sys.modules[f"{__name__}.{_name}"] = _module

__all__ = ["COMPRESSORS", "CompressionState", "MomentumCompression", "OneBitAdam",
           "compression_hook", "make_hook"]
