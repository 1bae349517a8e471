"""``laggard agent``: the node agent daemon.

Builds the enabled collectors, samples each on its own thread, receives StepRecords on a Unix
datagram socket (and UDP where asked), and serves ``/metrics`` (Prometheus text format) and
``/findings`` (JSON) over HTTP until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import logging
import signal
import socket
import sys
import threading
from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector

from laggard.agent import registry
from laggard.agent.config import (
    DEFAULT_INTAKE_SOCKET,
    DEFAULT_LISTEN_ADDRESS,
    DEFAULT_MAX_RUNS,
    DEFAULT_MAX_SERIES,
    DEFAULT_RANK_TTL_SECONDS,
    DEFAULT_SOCKET_MODE,
    DEFAULT_STALL_SECONDS,
    DEFAULT_STALL_STEP_FACTOR,
    AgentConfig,
    is_loopback_host,
    parse_address,
)
from laggard.agent.context import AgentContext
from laggard.agent.exporter import AgentExporter
from laggard.agent.gpu_index import GpuIndex
from laggard.agent.run_table import RankTable
from laggard.agent.sampler import CollectorThread
from laggard.agent.supervisor import RestartableThread, Supervisor
from laggard.agent.udp_intake import UdpIntake
from laggard.agent.unix_intake import UnixIntake, parse_id_list, queue_limit
from laggard.agent.web import make_app, make_http_server
from laggard.agent.workload import WorkloadLabels
from laggard.collectors import nvml as nvml_collector

log = logging.getLogger("laggard.agent")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``laggard agent``, in node_exporter's and Prometheus' style: dotted namespaces
    (``--web.*``, ``--intake.*``, ``--path.*``, ``--log.*``, ``--collector.NAME[.*]``).

    The agent's own flags are here; each collector's come from its module
    (``COLLECTOR.flags``, through :mod:`laggard.agent.registry`).
    """
    parser.add_argument("--web.listen-address", dest="listen_address",
                        default=DEFAULT_LISTEN_ADDRESS, metavar="HOST:PORT",
                        help="host:port for /metrics, [v6]:port for IPv6 (default "
                             "%(default)s; 9400 is dcgm-exporter's, 9100 node_exporter's)")
    parser.add_argument("--intake.socket", dest="intake_socket", default=None, metavar="PATH",
                        help="Unix datagram socket the training ranks send to, with their pid "
                             f"and uid from the kernel (default {DEFAULT_INTAKE_SOCKET}, skipped "
                             "with a warning if it cannot be made; empty to disable)")
    parser.add_argument("--intake.socket-mode", dest="intake_socket_mode", type=_octal,
                        default=DEFAULT_SOCKET_MODE, metavar="OCTAL",
                        help=f"permission bits of the socket file (default "
                             f"{DEFAULT_SOCKET_MODE:04o}: who may send is decided by the "
                             "directory and the allow-lists)")
    parser.add_argument("--intake.socket-group", dest="intake_socket_group", type=_group,
                        default=None, metavar="GROUP",
                        help="group (name or gid) of the socket file, for a mode such as 0660")
    parser.add_argument("--intake.allow-uids", dest="intake_allow_uids", type=parse_id_list,
                        default=frozenset(), metavar="UID,...",
                        help="only these uids (or the gids below) may send on the socket; "
                             "others are refused and counted (default: all)")
    parser.add_argument("--intake.allow-gids", dest="intake_allow_gids", type=parse_id_list,
                        default=frozenset(), metavar="GID,...",
                        help="only these primary gids (or the uids above) may send")
    parser.add_argument("--intake.address", dest="intake_address", default="",
                        metavar="HOST:PORT",
                        help="host:port of a UDP intake as well (no sender identity: any local "
                             "process can send); loopback only unless --intake.udp-allow-remote "
                             "(default: off)")
    parser.add_argument("--intake.udp-allow-remote", dest="intake_udp_remote",
                        action="store_true",
                        help="allow --intake.address on a non-loopback address (any host or pod "
                             "that reaches it can send records; logged as a warning)")
    parser.add_argument("--intake.max-ranks", dest="max_ranks", type=int, default=4096,
                        metavar="N", help="most training ranks tracked (default %(default)s)")
    parser.add_argument("--intake.max-series", dest="max_series", type=int,
                        default=DEFAULT_MAX_SERIES, metavar="N",
                        help="most exposition samples the intake's per-rank series may hold; "
                             "past it new ranks are rejected and new names dropped, counted "
                             "(default %(default)s)")
    parser.add_argument("--intake.rank-ttl", dest="rank_ttl", type=float,
                        default=DEFAULT_RANK_TTL_SECONDS, metavar="SECONDS",
                        help="forget a rank, its series and straggler flags after this long "
                             "without a record or heartbeat, unless its process lives "
                             "(default %(default)s)")
    parser.add_argument("--intake.stall-seconds", dest="stall_seconds", type=float,
                        default=DEFAULT_STALL_SECONDS, metavar="SECONDS",
                        help="a rank without progress (no step, no collective completed) for "
                             "this long, or --intake.stall-step-factor times its median step "
                             "if longer, is stalled: kept while its heartbeats come or its "
                             "process lives (default %(default)s)")
    parser.add_argument("--intake.stall-step-factor", dest="stall_step_factor", type=float,
                        default=DEFAULT_STALL_STEP_FACTOR, metavar="N",
                        help="stalled after N median step times without progress, when longer "
                             "than --intake.stall-seconds (default %(default)s)")
    parser.add_argument("--intake.max-runs", dest="max_runs", type=int,
                        default=DEFAULT_MAX_RUNS, metavar="N",
                        help="most training runs tracked at once, each with its share of "
                             "--intake.max-series; records of further runs are rejected and "
                             "counted until one expires (default %(default)s)")
    parser.add_argument("--intake.rank-histograms", dest="rank_histograms",
                        action="store_true",
                        help="also export each rank's phase, step and collective histograms, "
                             "step and comm counters, and its group progress while it runs "
                             "(~150 series a rank instead of at most 12; docs/metrics.md)")
    parser.add_argument("--path.procfs", dest="proc_root", default="/proc", metavar="PATH",
                        help="procfs mount point (default %(default)s)")
    parser.add_argument("--path.sysfs", dest="sysfs_root", default="/sys", metavar="PATH",
                        help="sysfs mount point (default %(default)s)")
    parser.add_argument("--node.name", dest="node", default="", metavar="NAME",
                        help="the node label (default: the host name)")
    parser.add_argument("--log.level", dest="log_level", default="info",
                        choices=["debug", "info", "warning", "error"],
                        help="least severity logged (default %(default)s)")
    parser.add_argument("--collector.interval", dest="collect_interval", type=float,
                        default=1.0, metavar="SECONDS",
                        help="seconds between sampling rounds of every collector without an "
                             "interval of its own (--collector.NAME.interval), 0.1 to 3600 "
                             "(default 1)")
    parser.epilog = ("Every --collector.NAME has a --no-collector.NAME that turns it off, "
                     "as in node_exporter.")
    _add_collector_flags(parser)


def _add_collector_flags(parser: argparse.ArgumentParser) -> None:
    """``--collector.NAME`` / ``--no-collector.NAME`` and each collector's own flags, from the
    collector modules' ``COLLECTOR`` specs."""
    for name, spec in registry.collectors().items():
        toggle = parser.add_mutually_exclusive_group()
        state = "on" if spec.default else "off"
        toggle.add_argument(f"--collector.{name}", dest=f"collector_{name}", action="store_true",
                            default=None, help=f"{spec.help} (default {state})")
        toggle.add_argument(f"--no-collector.{name}", dest=f"collector_{name}",
                            action="store_false", help=argparse.SUPPRESS)
        groups: dict[str, Any] = {}
        for flag in (*spec.flags, spec.interval_flag):
            target: Any = parser
            if flag.exclusive:
                if flag.exclusive not in groups:
                    groups[flag.exclusive] = parser.add_mutually_exclusive_group()
                target = groups[flag.exclusive]
            if flag.switch:
                target.add_argument(flag.option, dest=flag.name, action="store_true",
                                    default=flag.default, help=flag.help)
            else:
                target.add_argument(flag.option, dest=flag.name, type=flag.type,
                                    default=flag.default, metavar=flag.metavar, help=flag.help)


def _octal(text: str) -> int:
    """``"0660"`` or ``"0o660"`` -> 0o660 (argparse type)."""
    try:
        return int(text.removeprefix("0o"), 8)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an octal mode") from None


def _group(text: str) -> int:
    """A group name or gid -> gid (argparse type)."""
    if text.isdigit():
        return int(text)
    import grp

    try:
        return grp.getgrnam(text).gr_gid
    except KeyError:
        raise argparse.ArgumentTypeError(f"no group {text!r}") from None


def config_from_args(args: argparse.Namespace) -> AgentConfig:
    """Turn parsed flags into an :class:`AgentConfig`.

    Raises:
        ValueError: a flag value out of range (the message names the flag).
    """
    specs = registry.collectors()
    enabled = set()
    for name, spec in specs.items():
        flag = getattr(args, f"collector_{name}", None)
        # Naming a collector's input enables it, unless --no-collector.NAME says otherwise.
        given = spec.enabled_by is not None and getattr(args, spec.enabled_by.name, None)
        if flag or (flag is None and (spec.default or given)):
            enabled.add(name)
    return AgentConfig(
        listen_address=args.listen_address,
        intake_address=args.intake_address,
        intake_udp_remote=args.intake_udp_remote,
        intake_socket=DEFAULT_INTAKE_SOCKET if args.intake_socket is None else args.intake_socket,
        intake_socket_optional=args.intake_socket is None,
        intake_socket_mode=args.intake_socket_mode,
        intake_socket_group=args.intake_socket_group,
        intake_allow_uids=args.intake_allow_uids,
        intake_allow_gids=args.intake_allow_gids,
        collect_interval=args.collect_interval,
        collectors=enabled,
        collector_flags={name: getattr(args, name) for name in registry.flags()
                         if hasattr(args, name)},
        node=args.node or socket.gethostname(),
        proc_root=args.proc_root,
        sysfs_root=args.sysfs_root,
        max_ranks=args.max_ranks,
        max_series=args.max_series,
        rank_ttl_seconds=args.rank_ttl,
        max_runs=args.max_runs,
        stall_seconds=args.stall_seconds,
        stall_step_factor=args.stall_step_factor,
        rank_histograms=args.rank_histograms,
    )


def _gpu_resolver(config: AgentConfig) -> GpuIndex | None:
    """Ranks' devices -> GPU index through the GPU collector's NVML (fake NVML with
    ``--collector.nvml.fake-gpus``); None without the nvml collector: ``gpu`` stays empty,
    uncounted."""
    if "nvml" not in config.collectors:
        return None
    return GpuIndex(nvml_collector.library(config))


def collector_interval(config: AgentConfig, name: str) -> float:
    """Seconds between two rounds of collector ``name``: its ``--collector.NAME.interval``,
    else its own default (``CollectorSpec.interval``), else ``--collector.interval``."""
    value = config.flag(registry.collectors()[name].interval_flag)
    return config.collect_interval if value is None else float(value)


class _UnbuildableCollector:
    """Stands in for a collector whose constructor failed, so its success series reads 0."""

    def __init__(self, name: str, error: str) -> None:
        self.name = name
        self._error = error

    def collect(self) -> Iterable[Any]:
        raise RuntimeError(f"not started: {self._error}")


class Agent:
    """The running agent: collector threads, intake and HTTP server.

    Args:
        config: what to run.

    Raises:
        OSError: the HTTP or UDP address, or a socket path asked for, cannot be bound.
    """

    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.context = AgentContext(node=config.node or socket.gethostname())
        self.threads: list[CollectorThread] = []
        for name in sorted(config.collectors):
            try:
                collector = registry.build(name, config, self.context)
            except Exception as exc:  # noqa: BLE001 - one broken collector must not stop the rest
                log.warning("collector %s not started: %s: %s", name, type(exc).__name__, exc)
                collector = _UnbuildableCollector(name, f"{type(exc).__name__}: {exc}")
            self.threads.append(CollectorThread(collector, collector_interval(config, name)))
        self.table: RankTable | None = None
        self.intake: UdpIntake | None = None
        self.unix_intake: UnixIntake | None = None
        if config.intake_address or config.intake_socket:
            self.table = RankTable(config.max_ranks, self.context.findings, self.context.node,
                                   max_series=config.max_series,
                                   rank_ttl_seconds=config.rank_ttl_seconds,
                                   max_runs=config.max_runs,
                                   gpu_resolver=_gpu_resolver(config),
                                   stall_seconds=config.stall_seconds,
                                   stall_step_factor=config.stall_step_factor,
                                   proc_root=config.proc_root,
                                   rank_histograms=config.rank_histograms)
        if config.intake_address and self.table is not None:
            try:
                self.intake = UdpIntake(config.intake_address, self.table)
            except OSError as exc:
                raise OSError(exc.errno, f"intake udp://{config.intake_address}: "
                                         f"{exc.strerror or exc}") from None
        if config.intake_socket and self.table is not None:
            self.unix_intake = self._open_unix_intake(config, self.table)
        self.supervisor = Supervisor()
        self.registry = CollectorRegistry()
        self.exporter = AgentExporter(self.threads, self.table, self.context.findings,
                                      self.context.node, intake=self.intake,
                                      supervisor=self.supervisor)
        self.registry.register(self.exporter)
        if self.unix_intake is not None:
            self.registry.register(self.unix_intake)
        ProcessCollector(namespace="laggard_agent", registry=self.registry)
        host, port = parse_address(config.listen_address)
        try:
            self.server = make_http_server(host, port,
                                           make_app(self.registry, self.context.findings,
                                                    prebuilt=self.exporter.prebuilt))
        except OSError as exc:
            self._stop_intakes()
            raise OSError(exc.errno, f"--web.listen-address {config.listen_address}: "
                                     f"{exc.strerror or exc}") from None
        self.port: int = self.server.server_port
        self._server_thread = RestartableThread(self.server.serve_forever, "laggard-http")

    def _open_unix_intake(self, config: AgentConfig, table: RankTable) -> UnixIntake | None:
        """The Unix-socket intake; None if the default path cannot be bound (logged).

        Raises:
            OSError: a path asked for cannot be bound (the UDP intake is stopped first).
        """
        try:
            intake = UnixIntake(config.intake_socket, table, mode=config.intake_socket_mode,
                                group=config.intake_socket_group,
                                allow_uids=config.intake_allow_uids,
                                allow_gids=config.intake_allow_gids,
                                workload=WorkloadLabels(config.proc_root))
        except OSError as exc:
            message = f"--intake.socket {config.intake_socket}: {exc.strerror or exc}"
            if config.intake_socket_optional:
                log.warning("%s; the Unix-socket intake is off (give --intake.socket PATH, or "
                            "--intake.socket '' to silence this)", message)
                return None
            self._stop_intakes()
            raise OSError(exc.errno, message) from None
        qlen = queue_limit()
        if qlen is not None and qlen < 64:
            log.info("net.unix.max_dgram_qlen is %d: a burst of more datagrams than that while "
                     "the intake is busy is refused to the senders (counted by them); raise it "
                     "for nodes with many ranks (sysctl net.unix.max_dgram_qlen=512, then "
                     "restart the agent)", qlen)
        return intake

    def _stop_intakes(self) -> None:
        for intake in (self.intake, self.unix_intake):
            if intake is not None:
                intake.stop()

    def start(self) -> None:
        """Start sampling, the intake, the HTTP server and the supervisor watching them."""
        for thread in self.threads:
            thread.start()
            self.supervisor.watch(thread.thread)
        for intake in (self.intake, self.unix_intake):
            if intake is not None:
                intake.start()
                self.supervisor.watch(intake.thread)
        self._server_thread.start()
        self.supervisor.watch(self._server_thread)
        self.supervisor.start()

    def stop(self) -> None:
        """Stop everything started by :meth:`start` (idempotent)."""
        # The supervisor first, or it would restart the threads as they stop.
        self.supervisor.stop()
        self.server.shutdown()
        self.server.server_close()
        self._stop_intakes()
        for thread in self.threads:
            thread.stop()


def run(args: argparse.Namespace) -> int:
    """Run the agent until SIGTERM or SIGINT; returns the exit status."""
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = config_from_args(args)
        agent = Agent(config)
    except ValueError as exc:
        print(f"laggard agent: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"laggard agent: {exc.strerror or exc}", file=sys.stderr)
        return 2
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    agent.start()
    intakes = []
    if agent.unix_intake is not None:
        intakes.append(f"unix://{agent.unix_intake.path}")
    if agent.intake is not None:
        intakes.append(f"udp://{config.intake_address.rsplit(':', 1)[0]}:{agent.intake.port}")
        if not is_loopback_host(parse_address(config.intake_address)[0]):
            log.warning("UDP intake on %s (--intake.udp-allow-remote): any host or pod that "
                        "reaches it can send step records and findings, with no sender "
                        "identity", config.intake_address)
        if config.intake_allow_uids or config.intake_allow_gids:
            log.warning("the allow-lists apply to the Unix socket only: the UDP intake takes "
                        "datagrams from any process that can reach it")
    intake = f", intake {' and '.join(intakes)}" if intakes else ", no intake"
    host = parse_address(config.listen_address)[0]
    log.info("serving http://%s:%d/metrics%s; collectors: %s",
             f"[{host}]" if ":" in host else host, agent.port, intake,
             ", ".join(t.collector.name for t in agent.threads) or "none")
    while not stop.wait(0.5):
        pass
    log.info("stopping")
    agent.stop()
    return 0
