"""Re-export of :mod:`laggard.nvml.library`, the NVML wrapper, for imports of its old path.

The wrapper moved to the package :mod:`laggard.nvml` so that the training side (which may not
import the collectors) reaches NVML through the same one module that imports ``pynvml``.
"""

from laggard.nvml.library import (
    BACKOFF_FIRST_SECONDS,
    BACKOFF_MAX_SECONDS,
    CLOCK_EVENT_REASONS,
    GpuLostError,
    NoDataError,
    NvmlLibrary,
    first_constant,
    normalise_bus_id,
    shared_library,
)

__all__ = ["BACKOFF_FIRST_SECONDS", "BACKOFF_MAX_SECONDS", "CLOCK_EVENT_REASONS", "GpuLostError",
           "NoDataError", "NvmlLibrary", "first_constant", "normalise_bus_id", "shared_library"]
