"""Which collectors exist, which run by default, and how each is built from the config.

One name in four places, as node_exporter does: the file ``collectors/NAME.py``, the flag
``--collector.NAME``, the ``collector`` label, and the key here.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from laggard.agent.config import AgentConfig
from laggard.collectors.base import Collector


@dataclass(frozen=True, slots=True)
class CollectorSpec:
    """How to build one collector.

    Attributes:
        module: module holding the factory.
        factory: name of a callable ``(AgentConfig, AgentContext) -> Collector`` in ``module``.
        default: whether it runs unless ``--no-collector.NAME`` is given.
        help: one line for ``--help``.
    """

    module: str
    factory: str
    default: bool
    help: str


COLLECTORS: dict[str, CollectorSpec] = {
    "host": CollectorSpec("laggard.collectors.host", "from_config", True,
                          "CPU, memory and load of this host (psutil)"),
    "netdev": CollectorSpec("laggard.collectors.netdev", "from_config", True,
                            "per-interface counters from /proc/net/dev, physical and RDMA "
                            "interfaces unless --collector.netdev.device-include/-exclude"),
    "nvml": CollectorSpec("laggard.collectors.nvml", "from_config", True,
                          "GPU clocks, clock-event reasons, temperature, power, ECC via NVML"),
    "xid": CollectorSpec("laggard.collectors.xid", "from_config", True,
                         "every GPU Xid and NVSwitch SXid, from NVML events and the kernel log"),
    "infiniband": CollectorSpec("laggard.collectors.infiniband", "from_config", True,
                                "InfiniBand/RoCE port counters from /sys/class/infiniband"),
    "nccl_inspector": CollectorSpec("laggard.collectors.nccl_inspector", "from_config", False,
                                    "NCCL collective timings tailed from NCCL Inspector's "
                                    "JSONL directory (--collector.nccl_inspector.dir)"),
    "flight_recorder": CollectorSpec("laggard.collectors.flight_recorder", "from_config", False,
                                     "ranks behind in PyTorch flight-recorder dumps "
                                     "(--collector.flight_recorder.path)"),
}


def build(name: str, config: AgentConfig, context: object) -> Collector:
    """Import and build collector ``name``.

    Raises:
        KeyError: unknown collector name.
    """
    spec = COLLECTORS[name]
    factory: Callable[[AgentConfig, object], Collector] = getattr(
        importlib.import_module(spec.module), spec.factory
    )
    return factory(config, context)
