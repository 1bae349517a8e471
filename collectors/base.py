"""The collector interface shared by every source the agent samples, and how a collector says
its name, its flags and how it is built.

Modelled on node_exporter (one collector per file, its flags at the top of that file, registered
by name; ``ErrNoData``) and prometheus_client's custom collectors (fresh metric families built on
every call). A collector module ends with ``COLLECTOR = CollectorSpec(...)``;
:mod:`laggard.agent.registry` finds every module of this package that has one, and the daemon
builds ``laggard agent``'s flags from them: nothing about one collector is written elsewhere.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from prometheus_client.metrics_core import Metric

# NoDataError: the source this collector reads does not exist on this machine (no GPU, no
# InfiniBand). Defined beside the NVML wrapper, the lowest layer that raises it, so the training
# side's GPU-state sampler and the collectors catch one class.
from laggard.nvml.library import NoDataError

__all__ = ["AgentSettings", "Collector", "CollectorSpec", "Flag", "NoDataError",
           "interval_flag"]

#: Bounds of a collector's interval (``--collector.NAME.interval``), seconds: below 0.1 s a
#: Python round costs more than the 1 % of a core the agent may take; above an hour a series
#: goes stale in every Prometheus (its 5 min lookback).
MIN_INTERVAL_SECONDS = 0.1
MAX_INTERVAL_SECONDS = 3600.0


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

        The agent calls it every interval and renders what it returns to exposition text once,
        for every scrape until the next round (a scrape never builds a family). A collector
        that samples faster than it publishes (the nvml collector at 0.1 s) returns the very
        list object it returned last time to say "nothing new to publish": the agent then keeps
        the text it rendered.

        Raises:
            NoDataError: the hardware or file this collector reads is absent.
            Exception: anything else is counted as a failed collection by the daemon.

        A collector whose source can say when it has news (the kernel log, NVML events) may
        also have ``wait_for_data(timeout: float) -> bool``: block up to ``timeout`` seconds
        and say whether a round now has something to read. The agent then runs a round when
        data comes (at most ten a second), else every interval.
        """
        ...


@dataclass(frozen=True, slots=True)
class Flag:
    """One command-line flag a collector declares beside its code (node_exporter's
    ``kingpin.Flag(...).Default(...)`` at the top of a collector file).

    Attributes:
        name: the flag without its dashes, dotted: ``"collector.netdev.device-include"``. It is
            also the key of the flag's value in ``AgentConfig.collector_flags``.
        default: the value when the flag is not given (already of the type ``type`` returns).
        help: one line for ``--help``; ``%(default)s`` is replaced by argparse.
        type: turns the text given on the command line into the value; raises ``ValueError``
            or ``argparse.ArgumentTypeError`` for a bad one (argparse then exits with 2).
        metavar: the value's name in ``--help`` (``REGEX``, ``N``).
        exclusive: flags of one collector with the same non-empty ``exclusive`` may not be given
            together (an argparse mutually exclusive group).
        switch: a flag that takes no value and turns something on (``store_true``; ``type``
            and ``metavar`` unused, ``default`` False).
    """

    name: str
    default: Any
    help: str
    type: Callable[[str], Any] = str
    metavar: str | None = None
    exclusive: str = ""
    switch: bool = False

    @property
    def option(self) -> str:
        """The flag as typed: ``--collector.netdev.device-include``."""
        return f"--{self.name}"


class AgentSettings(Protocol):
    """What a collector's factory reads from the agent's configuration
    (``laggard.agent.config.AgentConfig``, which the collectors may not import: they sit below
    the agent)."""

    proc_root: str
    """Root of procfs (``--path.procfs``)."""

    sysfs_root: str
    """Root of sysfs (``--path.sysfs``)."""

    def flag(self, flag: Flag) -> Any:
        """The value of a collector's flag: given on the command line, else its default."""
        ...


@dataclass(frozen=True, slots=True)
class CollectorSpec:
    """A collector's registration: its name, whether it runs by default, its flags and its
    factory. Each collector module ends with ``COLLECTOR = CollectorSpec(...)``.

    Attributes:
        name: the module's name, the ``--collector.NAME`` flag and the ``collector`` label.
        help: one line for ``--help`` (what the collector exports, from where).
        build: ``(settings, context) -> Collector``: ``settings`` is an
            :class:`AgentSettings`, ``context`` the agent's ``AgentContext`` (``findings``,
            ``node``). May raise; the agent then reports the collector as failing.
        default: whether it runs unless ``--no-collector.NAME`` is given.
        flags: the collector's own flags, declared at the top of its module.
        enabled_by: one of ``flags`` whose non-empty value turns the collector on, unless
            ``--no-collector.NAME`` says otherwise (a collector off by default that is useless
            without its input: naming the input asks for it).
        check: ``(settings) -> None``, run when the agent's configuration is made; raises
            ``ValueError`` naming the flag when the flags' values do not go together or are
            out of range, so ``laggard agent`` exits with 2 instead of starting without the
            collector.
        interval: seconds between two rounds unless ``--collector.NAME.interval`` says
            otherwise; None: the agent's ``--collector.interval`` (1 s by default).
    """

    name: str
    help: str
    build: Callable[[Any, Any], Collector]
    default: bool = True
    flags: tuple[Flag, ...] = ()
    enabled_by: Flag | None = None
    check: Callable[[Any], None] | None = None
    interval: float | None = None

    @property
    def interval_flag(self) -> Flag:
        """``--collector.NAME.interval``: this collector's own sampling interval."""
        return interval_flag(self.name, self.interval)


def _interval(text: str) -> float:
    """argparse type of an interval flag: seconds in [0.1, 3600]."""
    value = float(text)
    if not MIN_INTERVAL_SECONDS <= value <= MAX_INTERVAL_SECONDS:
        raise argparse.ArgumentTypeError(
            f"{text} s outside [{MIN_INTERVAL_SECONDS}, {MAX_INTERVAL_SECONDS:g}]")
    return value


def interval_flag(name: str, default: float | None = None) -> Flag:
    """The interval flag of collector ``name`` (every collector has one, as each has its
    ``--collector.NAME`` toggle): seconds between the starts of two of its rounds.

    Args:
        name: the collector's name.
        default: the collector's own default, or None for the agent's ``--collector.interval``.
    """
    fallback = "--collector.interval" if default is None else f"{default:g} s"
    return Flag(f"collector.{name}.interval", default, type=_interval, metavar="SECONDS",
                help=f"seconds between two rounds of the {name} collector, 0.1 to 3600 "
                     f"(default: {fallback})")
