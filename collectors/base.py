"""The collector interface shared by every source the agent samples, and how a collector says
its name, its flags and how it is built.

Modelled on node_exporter (one collector per file, its flags at the top of that file, registered
by name; ``ErrNoData``) and prometheus_client's custom collectors (fresh metric families built on
every call). A collector module ends with ``COLLECTOR = CollectorSpec(...)``;
:mod:`laggard.agent.registry` finds every module of this package that has one, and the daemon
builds ``laggard agent``'s flags from them: nothing about one collector is written elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from prometheus_client.metrics_core import Metric

# NoDataError: the source this collector reads does not exist on this machine (no GPU, no
# InfiniBand). Defined beside the NVML wrapper, the lowest layer that raises it, so the training
# side's GPU-state sampler and the collectors catch one class.
from laggard.nvml.library import NoDataError

__all__ = ["AgentSettings", "Collector", "CollectorSpec", "Flag", "NoDataError"]


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
    """

    name: str
    default: Any
    help: str
    type: Callable[[str], Any] = str
    metavar: str | None = None
    exclusive: str = ""

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
    """

    name: str
    help: str
    build: Callable[[Any, Any], Collector]
    default: bool = True
    flags: tuple[Flag, ...] = ()
    enabled_by: Flag | None = None
    check: Callable[[Any], None] | None = None
