"""What runs inside the training job: TrainingMonitor, DDP communication hooks, fault injectors.

Needs torch (``pip install 'laggard[torch]'``). The names below are imported on first use, so
``import laggard.integrations`` stays cheap and the CLI's subcommands load only what they need::

    from laggard.integrations import TrainingMonitor, CommTimer, CollectiveTracer
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "TrainingMonitor": "laggard.integrations.monitor",
    "CommTimer": "laggard.integrations.comm_timing",
    "CommStep": "laggard.integrations.comm_timing",
    "allreduce_timing_hook": "laggard.integrations.comm_timing",
    "CollectiveTracer": "laggard.integrations.tracer",
    "instrument_fsdp": "laggard.integrations.trace_sources",
    "instrument_pipeline": "laggard.integrations.trace_sources",
    "attach": "laggard.integrations.trace_sources",
    "GradientIntegrity": "laggard.integrations.integrity",
    "BitFlipInjector": "laggard.integrations.faults",
    "GpuStateParticipant": "laggard.integrations.gpu_state",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'laggard.integrations' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
