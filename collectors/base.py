"""The collector interface shared by every source the agent samples.

Modelled on node_exporter (one collector per file, ``ErrNoData``) and prometheus_client's custom
collectors (fresh metric families built on every call).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, runtime_checkable

from prometheus_client.metrics_core import Metric

# NoDataError: the source this collector reads does not exist on this machine (no GPU, no
# InfiniBand). Defined beside the NVML wrapper, the lowest layer that raises it, so the training
# side's GPU-state sampler and the collectors catch one class.
from laggard.nvml.library import NoDataError

__all__ = ["Collector", "NoDataError"]


@runtime_checkable
class Collector(Protocol):
    """One source of metrics.

    ``name`` is the file name, the CLI flag (``--collector.NAME``) and the ``collector`` label.
    Hardware is passed to the constructor (an ``nvml`` module, a ``sysfs_root`` path, a log
    source) and never touched there; all I/O happens in :meth:`collect`.
    """

    name: str

    def collect(self) -> Iterable[Metric]:
        """Sample the source once and return fresh prometheus_client metric families.

        Raises:
            NoDataError: the hardware or file this collector reads is absent.
            Exception: anything else is counted as a failed collection by the daemon.
        """
        ...
