"""AgentConfig: everything the node agent is told on its command line.

The agent's own settings (the HTTP address, the intake, the sampling interval, the filesystem
roots) are fields here; each collector's flags are declared in its own module
(``laggard.collectors.NAME``) and their values kept in :attr:`AgentConfig.collector_flags`.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from laggard.collectors.base import Flag
from laggard.wire import DEFAULT_INTAKE_ADDRESS, DEFAULT_INTAKE_SOCKET, parse_address

__all__ = ["AgentConfig", "DEFAULT_LISTEN_ADDRESS", "DEFAULT_INTAKE_ADDRESS",
           "DEFAULT_INTAKE_SOCKET", "DEFAULT_SOCKET_MODE", "is_loopback_host", "parse_address"]

#: 9400 is dcgm-exporter's and 9100 node_exporter's; laggard takes the next free pair.
DEFAULT_LISTEN_ADDRESS = "127.0.0.1:9477"
#: Exposition samples the intake's per-rank families may hold (``--intake.max-series``): about
#: 60 ranks with five phases, two ops and two heartbeat groups each (a node runs 8); at most
#: ~1.3 MB of text even with 64-character names, rendered in ~0.1 s of CPU.
DEFAULT_MAX_SERIES = 10_000
#: Seconds after its last record at which a rank is forgotten (``--intake.rank-ttl``): longer
#: than a checkpoint save or an evaluation pause, short enough that a finished job's straggler
#: flags do not page for long.
DEFAULT_RANK_TTL_SECONDS = 300.0
#: Least seconds without progress (no step, no collective completed) after which a rank is
#: stalled (``--intake.stall-seconds``): a few heartbeats, well over a fast step's jitter.
DEFAULT_STALL_SECONDS = 5.0
#: A rank is stalled after this many of its median step times without progress when that is
#: longer (``--intake.stall-step-factor``): a step 3x its usual time is no hang yet.
DEFAULT_STALL_STEP_FACTOR = 3.0
#: Training runs the intake tracks at once (``--intake.max-runs``): a node shared by a few jobs,
#: with room for the runs that ended but have not expired yet.
DEFAULT_MAX_RUNS = 16
#: Distinct phase names, and op names, kept per rank; further ones are dropped and counted.
MAX_NAMES_PER_RANK = 16
#: Mode of the intake socket file (``--intake.socket-mode``): write for everyone. Who may send
#: is decided by the socket's directory (a pod that mounts it; search permission on
#: /run/laggard) and by the allow-list on the kernel's uid and gid; the file's owner under
#: systemd's ``DynamicUser=`` is a transient user no job runs as, so 0660 would shut every job
#: out unless ``--intake.socket-group`` names a group the jobs run in.
DEFAULT_SOCKET_MODE = 0o666


def is_loopback_host(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is on the loopback interface only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # another host name: may resolve anywhere


@dataclass(kw_only=True, slots=True)
class AgentConfig:
    """Configuration of ``laggard agent``."""

    listen_address: str = DEFAULT_LISTEN_ADDRESS
    """``host:port`` of the HTTP server that serves ``/metrics``."""

    intake_address: str = ""
    """``host:port`` of the UDP intake for StepRecords (no sender identity); empty string (the
    default) disables it. Loopback only unless ``intake_udp_remote``."""

    intake_udp_remote: bool = False
    """Allow the UDP intake on an address other than loopback (any host or pod that reaches
    it can then send records; logged as a warning)."""

    intake_socket: str = DEFAULT_INTAKE_SOCKET
    """Path of the Unix datagram socket intake (the default intake: sender pid, uid and gid
    from the kernel); empty string disables it."""

    intake_socket_optional: bool = False
    """The socket path was not asked for (the flag's default): failing to bind it (not root,
    another agent holds it) is logged and the agent goes on without it."""

    intake_socket_mode: int = DEFAULT_SOCKET_MODE
    """Permission bits of the socket file (write lets a process send)."""

    intake_socket_group: int | None = None
    """Group id given to the socket file (with mode 0660: the group that may send)."""

    intake_allow_uids: frozenset[int] = frozenset()
    """Uids allowed to send on the socket; with ``intake_allow_gids`` both empty, all are."""

    intake_allow_gids: frozenset[int] = frozenset()
    """Gids (the sender's primary group, from the kernel) allowed to send on the socket."""

    collect_interval: float = 1.0
    """Seconds between two sampling rounds of each collector (``--collector.interval``, 0.1 to
    3600)."""

    collectors: set[str] = field(default_factory=set)
    """Names of the collectors to run."""

    collector_flags: Mapping[str, Any] = field(default_factory=dict)
    """Values of the collectors' own flags, by flag name (``"collector.netdev.max-devices"``:
    ``laggard.collectors.base.Flag.name``); a flag not in it has its default. Read them with
    :meth:`flag`."""

    node: str = ""
    """Value of the ``node`` label where one is needed; defaults to the host name."""

    proc_root: str = "/proc"
    """Root of procfs (tests point it at a fixture tree)."""

    sysfs_root: str = "/sys"
    """Root of sysfs (tests point it at a fixture tree)."""

    max_ranks: int = 4096
    """Most ranks the intake tracks (``--intake.max-ranks``); records of further ranks are
    rejected and counted."""

    max_series: int = DEFAULT_MAX_SERIES
    """Most exposition samples the intake's per-rank families may hold (the series budget)."""

    rank_ttl_seconds: float = DEFAULT_RANK_TTL_SECONDS
    """Seconds without a record or heartbeat after which a rank whose process is not alive (and
    its run's flags, and a run with nothing left) are forgotten."""

    max_runs: int = DEFAULT_MAX_RUNS
    """Most training runs the intake tracks; records of further runs are rejected and
    counted until one expires. The series budget is shared between the runs tracked."""

    stall_seconds: float = DEFAULT_STALL_SECONDS
    """Least seconds without progress after which a rank is stalled (its series stay while its
    heartbeats come or its process lives; ``laggard_rank_stalled_seconds`` counts)."""

    stall_step_factor: float = DEFAULT_STALL_STEP_FACTOR
    """A rank is stalled after this many of its median step times without progress, when that
    is longer than ``stall_seconds``."""

    rank_histograms: bool = False
    """Export each rank's phase, step and collective histograms, its step and comm counters
    and its progress detail (``--intake.rank-histograms``); by default a rank has at most 12
    series and the histograms are kept per run for the node's ranks together (issue 34)."""

    def __post_init__(self) -> None:
        if not 0.1 <= self.collect_interval <= 3600:
            raise ValueError(f"collect interval {self.collect_interval} s outside [0.1, 3600]")
        if self.max_ranks < 1:
            raise ValueError("max ranks must be at least 1")
        if not 1 <= self.max_runs <= 4096:
            raise ValueError(f"intake max runs {self.max_runs} outside [1, 4096]")
        if self.max_series < 100:
            raise ValueError("intake max series must be at least 100")
        if not 1 <= self.rank_ttl_seconds <= 86400:
            raise ValueError(f"rank TTL {self.rank_ttl_seconds} s outside [1, 86400]")
        if not 0.5 <= self.stall_seconds <= 86400:
            raise ValueError(f"stall seconds {self.stall_seconds} outside [0.5, 86400]")
        if not 1 <= self.stall_step_factor <= 1000:
            raise ValueError(f"stall step factor {self.stall_step_factor} outside [1, 1000]")
        # Imported here: the registry imports every collector module, which the intake (it
        # reads this module's constants) does not need.
        from laggard.agent import registry

        unknown = set(self.collector_flags) - set(registry.flags())
        if unknown:
            raise ValueError(f"no collector has the flag(s) {', '.join(sorted(unknown))}")
        registry.check(self)  # raises ValueError naming the flag
        for address in (self.listen_address, self.intake_address):
            if address:
                parse_address(address)
        if self.intake_address and not self.intake_udp_remote:
            host = parse_address(self.intake_address)[0]
            if not is_loopback_host(host):
                raise ValueError(
                    f"UDP intake on {self.intake_address}: not a loopback address; any host "
                    "that reaches it could send records (pass --intake.udp-allow-remote to "
                    "accept that, or use the Unix socket intake)")
        if not 0 <= self.intake_socket_mode <= 0o777:
            raise ValueError(f"intake socket mode {self.intake_socket_mode:o} is not in 0..777")

    def flag(self, flag: Flag) -> Any:
        """The value of a collector's flag: the one given, else the flag's default."""
        return self.collector_flags.get(flag.name, flag.default)
