"""``laggard agent``: the node agent daemon.

Builds the enabled collectors, samples each on its own thread, receives StepRecords on UDP, and
serves ``/metrics`` (Prometheus text format) and ``/findings`` (JSON) over HTTP until SIGTERM or
SIGINT.
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
    DEFAULT_INTAKE_ADDRESS,
    DEFAULT_LISTEN_ADDRESS,
    DEFAULT_MAX_RUNS,
    DEFAULT_MAX_SERIES,
    DEFAULT_RANK_TTL_SECONDS,
    AgentConfig,
    parse_address,
)
from laggard.agent.context import AgentContext
from laggard.agent.exporter import AgentExporter
from laggard.agent.gpu_index import GpuIndex
from laggard.agent.intake import RankTable, UdpIntake
from laggard.agent.sampler import CollectorThread
from laggard.agent.supervisor import RestartableThread, Supervisor
from laggard.agent.web import make_app, make_http_server
from laggard.collectors.nvml_library import shared_library

log = logging.getLogger("laggard.agent")



def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``laggard agent`` (node_exporter's style: ``--collector.NAME``)."""
    parser.add_argument("--web.listen-address", dest="listen_address",
                        default=DEFAULT_LISTEN_ADDRESS,
                        help="host:port for /metrics, [v6]:port for IPv6 (default "
                             "%(default)s; 9400 is dcgm-exporter's, 9100 node_exporter's)")
    parser.add_argument("--intake-address", default=DEFAULT_INTAKE_ADDRESS,
                        help="host:port of the UDP intake for training ranks "
                             "(default %(default)s; empty to disable)")
    parser.add_argument("--collect-interval", type=float, default=1.0, metavar="SECONDS",
                        help="seconds between sampling rounds, 0.1 to 3600 (default 1)")
    parser.epilog = ("Every --collector.NAME has a --no-collector.NAME that turns it off, "
                     "as in node_exporter.")
    for name, spec in registry.COLLECTORS.items():
        group = parser.add_mutually_exclusive_group()
        state = "on" if spec.default else "off"
        group.add_argument(f"--collector.{name}", dest=f"collector_{name}", action="store_true",
                           default=None, help=f"{spec.help} (default {state})")
        group.add_argument(f"--no-collector.{name}", dest=f"collector_{name}",
                           action="store_false", help=argparse.SUPPRESS)
    parser.add_argument("--path.procfs", dest="proc_root", default="/proc",
                        help="procfs mount point (default %(default)s)")
    parser.add_argument("--path.sysfs", dest="sysfs_root", default="/sys",
                        help="sysfs mount point (default %(default)s)")
    parser.add_argument("--path.kmsg", dest="kmsg_path", default="/dev/kmsg",
                        help="kernel log to read XIDs from: /dev/kmsg, or a syslog or journal "
                             "file (default %(default)s)")
    parser.add_argument("--collector.nccl_inspector.dir", dest="nccl_inspector_dir", default="",
                        metavar="DIR", help="NCCL Inspector output directory (JSON lines) that "
                        "the nccl_inspector collector tails")
    parser.add_argument("--collector.flight_recorder.path", dest="flight_recorder_path",
                        default="", metavar="PATH", help="directory or TORCH_FR_DUMP_TEMP_FILE "
                        "prefix of PyTorch flight-recorder dumps for the flight_recorder collector")
    parser.add_argument("--fake-gpus", type=int, default=0, metavar="N",
                        help="serve N fake GPUs playing a scenario instead of real NVML")
    parser.add_argument("--node", default="", help="node label (default: the host name)")
    parser.add_argument("--max-ranks", type=int, default=4096,
                        help="most training ranks tracked (default %(default)s)")
    parser.add_argument("--intake.max-series", dest="max_series", type=int,
                        default=DEFAULT_MAX_SERIES, metavar="N",
                        help="most exposition samples the intake's per-rank series may hold; "
                             "past it new ranks are rejected and new names dropped, counted "
                             "(default %(default)s)")
    parser.add_argument("--intake.rank-ttl", dest="rank_ttl", type=float,
                        default=DEFAULT_RANK_TTL_SECONDS, metavar="SECONDS",
                        help="forget a rank, its series and straggler flags after this long "
                             "without a record (default %(default)s)")
    parser.add_argument("--intake.max-runs", dest="max_runs", type=int,
                        default=DEFAULT_MAX_RUNS, metavar="N",
                        help="most training runs tracked at once, each with its share of "
                             "--intake.max-series; records of further runs are rejected and "
                             "counted until one expires (default %(default)s)")
    parser.add_argument("--log-level", default="info",
                        choices=["debug", "info", "warning", "error"])


def config_from_args(args: argparse.Namespace) -> AgentConfig:
    """Turn parsed flags into an :class:`AgentConfig`.

    Raises:
        ValueError: a flag value out of range.
    """
    enabled = set()
    for name, spec in registry.COLLECTORS.items():
        flag = getattr(args, f"collector_{name}", None)
        if flag or (flag is None and spec.default):
            enabled.add(name)
    # Naming a collector's input enables it, unless --no-collector.NAME says otherwise.
    for name, path in (("nccl_inspector", args.nccl_inspector_dir),
                       ("flight_recorder", args.flight_recorder_path)):
        if path and getattr(args, f"collector_{name}", None) is not False:
            enabled.add(name)
    return AgentConfig(
        listen_address=args.listen_address,
        intake_address=args.intake_address,
        collect_interval=args.collect_interval,
        collectors=enabled,
        node=args.node or socket.gethostname(),
        proc_root=args.proc_root,
        sysfs_root=args.sysfs_root,
        kmsg_path=args.kmsg_path,
        fake_gpus=args.fake_gpus,
        max_ranks=args.max_ranks,
        max_series=args.max_series,
        rank_ttl_seconds=args.rank_ttl,
        max_runs=args.max_runs,
        nccl_inspector_dir=args.nccl_inspector_dir,
        flight_recorder_path=args.flight_recorder_path,
    )


def _gpu_resolver(config: AgentConfig) -> GpuIndex | None:
    """Ranks' devices -> GPU index through the GPU collector's NVML (fake NVML with
    ``--fake-gpus``); None without the nvml collector: ``gpu`` stays empty, uncounted."""
    if "nvml" not in config.collectors:
        return None
    return GpuIndex(shared_library(config.fake_gpus))


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
        OSError: the HTTP or UDP address cannot be bound.
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
            self.threads.append(CollectorThread(collector, config.collect_interval))
        self.table: RankTable | None = None
        self.intake: UdpIntake | None = None
        if config.intake_address:
            self.table = RankTable(config.max_ranks, self.context.findings, self.context.node,
                                   max_series=config.max_series,
                                   rank_ttl_seconds=config.rank_ttl_seconds,
                                   max_runs=config.max_runs,
                                   gpu_resolver=_gpu_resolver(config))
            try:
                self.intake = UdpIntake(config.intake_address, self.table)
            except OSError as exc:
                raise OSError(exc.errno, f"intake udp://{config.intake_address}: "
                                         f"{exc.strerror or exc}") from None
        self.supervisor = Supervisor()
        self.registry = CollectorRegistry()
        self.registry.register(
            AgentExporter(self.threads, self.table, self.context.findings, self.context.node,
                          intake=self.intake, supervisor=self.supervisor)
        )
        ProcessCollector(namespace="laggard_agent", registry=self.registry)
        host, port = parse_address(config.listen_address)
        try:
            self.server = make_http_server(host, port,
                                           make_app(self.registry, self.context.findings))
        except OSError as exc:
            if self.intake is not None:
                self.intake.stop()
            raise OSError(exc.errno, f"--web.listen-address {config.listen_address}: "
                                     f"{exc.strerror or exc}") from None
        self.port: int = self.server.server_port
        self._server_thread = RestartableThread(self.server.serve_forever, "laggard-http")

    def start(self) -> None:
        """Start sampling, the intake, the HTTP server and the supervisor watching them."""
        for thread in self.threads:
            thread.start()
            self.supervisor.watch(thread.thread)
        if self.intake is not None:
            self.intake.start()
            self.supervisor.watch(self.intake.thread)
        self._server_thread.start()
        self.supervisor.watch(self._server_thread)
        self.supervisor.start()

    def stop(self) -> None:
        """Stop everything started by :meth:`start` (idempotent)."""
        # The supervisor first, or it would restart the threads as they stop.
        self.supervisor.stop()
        self.server.shutdown()
        self.server.server_close()
        if self.intake is not None:
            self.intake.stop()
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
    intake = f", intake udp://{config.intake_address.rsplit(':', 1)[0]}:{agent.intake.port}" \
        if agent.intake else ""
    host = parse_address(config.listen_address)[0]
    log.info("serving http://%s:%d/metrics%s; collectors: %s",
             f"[{host}]" if ":" in host else host, agent.port, intake,
             ", ".join(t.collector.name for t in agent.threads) or "none")
    while not stop.wait(0.5):
        pass
    log.info("stopping")
    agent.stop()
    return 0
