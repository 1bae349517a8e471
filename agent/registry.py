"""Which collectors exist: every module of :mod:`laggard.collectors` that ends with
``COLLECTOR = CollectorSpec(...)``.

One name in four places, as node_exporter does: the file ``collectors/NAME.py``, the flag
``--collector.NAME``, the ``collector`` label, and ``CollectorSpec.name``. A collector's flags,
defaults, help and factory sit in its own file (node_exporter's ``init()`` registration); this
module only finds them, so adding a collector is adding a file.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Mapping
from typing import Any

import laggard.collectors
from laggard.collectors.base import (
    MAX_INTERVAL_SECONDS,
    MIN_INTERVAL_SECONDS,
    AgentSettings,
    Collector,
    CollectorSpec,
    Flag,
)

__all__ = ["build", "check", "collectors", "flags"]


@functools.cache
def collectors() -> Mapping[str, CollectorSpec]:
    """Every collector, by name, in name order (imports each collector module once).

    Raises:
        ValueError: two modules register the same collector or flag name, or a spec's name is
            not its module's.
    """
    found: dict[str, CollectorSpec] = {}
    seen_flags: set[str] = set()
    for module in sorted(pkgutil.iter_modules(laggard.collectors.__path__), key=lambda m: m.name):
        spec = getattr(importlib.import_module(f"laggard.collectors.{module.name}"),
                       "COLLECTOR", None)
        if not isinstance(spec, CollectorSpec):
            continue  # a helper module (base, tailer, histogram)
        if spec.name != module.name:
            raise ValueError(f"collectors/{module.name}.py registers {spec.name!r}: one name for "
                             "the file, the flag and the label")
        for flag in (*spec.flags, spec.interval_flag):
            if flag.name in seen_flags:
                raise ValueError(f"flag --{flag.name} declared twice")
            seen_flags.add(flag.name)
        found[spec.name] = spec
    return found


def flags() -> dict[str, Flag]:
    """Every collector flag, by its name (``"collector.netdev.max-devices"``): each
    collector's own, and its ``--collector.NAME.interval``."""
    return {flag.name: flag for spec in collectors().values()
            for flag in (*spec.flags, spec.interval_flag)}


def check(settings: AgentSettings) -> None:
    """Run each collector's ``check`` on the flags' values.

    Raises:
        ValueError: a collector flag out of range or flags that do not go together; the
            message names the flag.
    """
    for spec in collectors().values():
        interval = settings.flag(spec.interval_flag)
        if interval is not None and not MIN_INTERVAL_SECONDS <= interval <= MAX_INTERVAL_SECONDS:
            raise ValueError(f"--{spec.interval_flag.name} {interval}: outside "
                             f"[{MIN_INTERVAL_SECONDS}, {MAX_INTERVAL_SECONDS:g}] s")
        if spec.check is not None:
            spec.check(settings)


def build(name: str, settings: AgentSettings, context: Any) -> Collector:
    """Build collector ``name`` from the agent's settings and context.

    Raises:
        KeyError: unknown collector name.
        Exception: whatever the collector's factory raises (the agent reports it as failing).
    """
    return collectors()[name].build(settings, context)
