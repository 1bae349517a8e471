"""``laggard cluster-demo``: a cluster on one machine, a fault on one node, and laggard naming it.

N emulated nodes (network namespaces on one bridge, links shaped with ``tc``; see
:mod:`laggard.demo.netns`) each run a ``laggard agent`` and M training ranks; one job
spans all of them with ``torch.distributed`` on gloo over TCP, launched on every node by PyTorch's
own launcher (``torch.distributed.run --nnodes N --node_rank i``); a real Prometheus on this
machine scrapes every agent and evaluates laggard's alert rules. One fault is injected:

* ``slow-rank``: extra real compute in one rank's forward and backward passes (as a throttled GPU);
* ``link``: that node's link shaped to a lower rate (a link that trained down, a bad cable);
* ``loss``: random packet loss on that node's link (needs the kernel's netem qdisc).

The run ends with the report: the finding (node, rank, cause: compute or link), the alert that
fired in Prometheus, and each node's link measured by a bounded transfer from the monitoring
host. Everything is removed at the end, on Ctrl-C and on failure; the run is bounded by
``--timeout``.

Why one module of ~650 lines: it is one command's script, its steps in the order they run
(validate, build the cluster, start agents and Prometheus, run the job, inject, report, tear
down); the namespaces themselves are :mod:`laggard.demo.netns`, the servers
:mod:`laggard.demo.harness`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from laggard.demo.hang import (
    HangInjection,
    describe_injection,
    format_hang,
    hang_outcome,
    read_json_lines,
)
from laggard.demo.harness import (
    NotReadyError,
    PrometheusServer,
    laggard_rules,
    wait_until_ready,
)
from laggard.demo.netns import (
    EmulatedCluster,
    LinkShape,
    NamespaceError,
    Node,
    check_can_create,
)

#: Ports inside every node's namespace (each node has its own network stack, so all share them).
AGENT_PORT = 9477
INTAKE_PORT = 9478
MASTER_PORT = 29500
#: Collectors that mean something on an emulated node (no GPUs, no InfiniBand there).
NODE_COLLECTORS = ("host", "netdev")
#: Alert rules' ``for:`` durations are cut to this for the demo: its whole run lasts minutes.
DEMO_ALERT_FOR = "5s"
#: Seconds of line rate each way of the per-node link check, and its byte bounds: long enough
#: that start-up and scheduling noise stay small, bounded at 0.3 s of a 100 Mbit/s link.
LINK_CHECK_SECONDS = 0.25
LINK_CHECK_MIN_BYTES, LINK_CHECK_MAX_BYTES = 4 << 20, 32 << 20
#: A link measured below this fraction of the median link is named.
SLOW_LINK_RATIO = 0.5

#: Alerts raised from the in-job detectors' findings.
_IN_JOB_ALERTS = ("LaggardStraggler", "LaggardSlowLink")
#: The alert that names the ranks holding a hung job up.
HANG_ALERT = "LaggardJobHung"
#: ``laggard demo --inject hang`` kinds the cluster runs (its ranks are on the CPU: no device).
CLUSTER_HANG_KINDS = ("python", "spin", "data", "skip")

_RATE_UNITS = {"": 1, "bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9,
               "k": 1e3, "m": 1e6, "g": 1e9}


def parse_rate(text: str) -> float:
    """A link rate in tc's notation (``1gbit``, ``100mbit``, ``10G``) -> bits per second.

    Raises:
        argparse.ArgumentTypeError: not a rate.
    """
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*?)(?:/s|ps)?\s*", text)
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _RATE_UNITS:
        raise argparse.ArgumentTypeError(f"not a rate: {text!r} (try 1gbit, 100mbit, 10gbit)")
    bps = float(m.group(1)) * _RATE_UNITS[unit]
    if bps <= 0:
        raise argparse.ArgumentTypeError(f"rate must be positive: {text!r}")
    return bps


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``laggard cluster-demo``."""
    parser.add_argument("--nodes", type=int, default=3, help="emulated nodes (default 3)")
    parser.add_argument("--ranks-per-node", type=int, default=1, metavar="M",
                        help="training ranks per node (default 1)")
    parser.add_argument("--rate", type=parse_rate, default=1e9,
                        help="link rate of every node, tc notation (default 1gbit)")
    parser.add_argument("--delay-ms", type=float, default=0.2,
                        help="one-way delay added on every link, ms (default 0.2; needs the "
                             "kernel's netem qdisc, reported as not applied without it)")
    parser.add_argument("--fault", choices=["slow-rank", "link", "loss", "hang", "none"],
                        default="slow-rank", help="what to inject (default slow-rank); hang: "
                        "the fault node's first rank hangs at --fault-at-step in the way "
                        "--hang-kind says, named in the job and by Prometheus' LaggardJobHung")
    parser.add_argument("--hang-kind", default="data", choices=CLUSTER_HANG_KINDS,
                        help="hang: python, spin, data or skip, as `laggard demo --inject "
                             "hang=...` (default data)")
    parser.add_argument("--hang-bound", type=float, default=90.0, metavar="SECONDS",
                        help="hang: stop the job this long after the hang at the latest, "
                             "named or not (default 90)")
    parser.add_argument("--fault-node", type=int, default=1,
                        help="node index to inject it on (default 1)")
    parser.add_argument("--slowdown", type=float, default=1.5,
                        help="slow-rank: the rank's compute is this many times its own "
                             "(default 1.5)")
    parser.add_argument("--fault-rate", type=parse_rate, default=100e6,
                        help="link: the degraded link's rate (default 100mbit)")
    parser.add_argument("--loss-percent", type=float, default=2.0,
                        help="loss: packets dropped on the faulty link, %% (default 2)")
    parser.add_argument("--steps", type=int, default=240, help="training steps (default 240)")
    parser.add_argument("--fault-at-step", type=int, default=-1, metavar="S",
                        help="inject the fault when rank 0 reaches step S, so the detectors "
                             "see the job before it (default: a third of --steps)")
    parser.add_argument("--window", type=int, default=10,
                        help="steps per in-job detection window (default 10)")
    parser.add_argument("--compression", default="none",
                        help="gradient compression hook: none, fp16, sign, topk, powersgd, "
                             "onebit_adam")
    parser.add_argument("--scrape-interval", type=float, default=1.0,
                        help="Prometheus scrape and rule evaluation interval, s (default 1)")
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="bound on the whole run, s (default 600)")
    parser.add_argument("--json", dest="json_path", default="",
                        help="also write the report as JSON to this file")
    parser.add_argument("--keep-logs", default="", metavar="DIR",
                        help="copy the agents', job's and Prometheus' logs and the job's result "
                             "to DIR at the end")


@dataclass(slots=True)
class Report:
    """What the demo found, printed at the end and written with ``--json``."""

    fault: dict[str, Any]
    nodes: list[dict[str, Any]] = field(default_factory=list)
    findings: list[dict[str, Any]] = field(default_factory=list)
    alerts: list[dict[str, Any]] = field(default_factory=list)
    link_check: list[dict[str, Any]] = field(default_factory=list)
    verdict: dict[str, Any] = field(default_factory=dict)
    ranks: dict[str, str] = field(default_factory=dict)
    job: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}  # type: ignore[attr-defined]


class DemoError(RuntimeError):
    """The demo cannot go on (a process died, a deadline passed); the message says why."""


def _pump(stream: Any, path: Path, echo: threading.Event | None) -> None:
    """Copy a process' output to ``path`` until it ends, and to stdout while ``echo`` is set."""
    with open(path, "w") as sink:
        for line in stream:
            sink.write(line)
            sink.flush()
            if echo is not None and echo.is_set():
                print(f"  {line}", end="", flush=True)


def link_check_bytes(rate_bps: float) -> int:
    """Bytes each way of the link check of links at ``rate_bps``."""
    return int(min(LINK_CHECK_MAX_BYTES,
                   max(LINK_CHECK_MIN_BYTES, rate_bps / 8 * LINK_CHECK_SECONDS)))


def measure_links(cluster: EmulatedCluster, deadline: float) -> list[dict[str, Any]]:
    """Each node's link measured with a bounded TCP transfer to and from this machine.

    The monitoring host sits on the bridge behind no shaping, so each transfer crosses exactly
    one node's link: node -> host measures its uplink, host -> node its downlink.

    Returns:
        One dict per node: ``node``, ``up_bps``, ``down_bps`` (goodput, bit/s).
    """
    results = []
    nbytes = link_check_bytes(cluster.link.rate_bps or 10e9)
    for node in cluster.nodes:
        up = _transfer(cluster, node, nbytes, upload=True, deadline=deadline)
        down = _transfer(cluster, node, nbytes, upload=False, deadline=deadline)
        results.append({"node": node.name, "address": node.address, "up_bps": up,
                        "down_bps": down})
    return results


_LINK_PEER = r"""
import socket, sys, time
mode, host, port, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
s = socket.create_connection((host, port), timeout=10)
s.settimeout(10)
if mode == "send":
    block, left = b"\0" * 65536, n
    while left > 0:
        s.sendall(block[:left]); left -= min(left, 65536)
    s.shutdown(socket.SHUT_WR); s.recv(1)
else:
    got = 0
    while got < n:
        chunk = s.recv(1 << 20)
        if not chunk: break
        got += len(chunk)
s.close()
"""


def _transfer(cluster: EmulatedCluster, node: Node, nbytes: int, *, upload: bool,
              deadline: float) -> float:
    """Goodput in bit/s of ``nbytes`` between the host and ``node`` (0.0 on failure)."""
    with socket.create_server((cluster.gateway, 0)) as server:
        server.settimeout(max(1.0, min(15.0, deadline - time.monotonic())))
        port = server.getsockname()[1]
        peer = cluster.popen(node, [sys.executable, "-c", _LINK_PEER,
                                    "send" if upload else "recv", cluster.gateway, str(port),
                                    str(nbytes)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            conn, _ = server.accept()
        except OSError:
            return 0.0
        with conn:
            conn.settimeout(15.0)
            start = time.perf_counter()
            try:
                if upload:
                    got = 0
                    while got < nbytes:
                        chunk = conn.recv(1 << 20)
                        if not chunk:
                            break
                        got += len(chunk)
                    seconds = time.perf_counter() - start
                    conn.sendall(b"k")
                else:
                    conn.sendall(b"\0" * nbytes)
                    conn.shutdown(socket.SHUT_WR)
                    peer.wait(15)
                    got, seconds = nbytes, time.perf_counter() - start
            except OSError:
                return 0.0
        with contextlib.suppress(subprocess.TimeoutExpired):
            peer.wait(15)
    return got * 8 / seconds if seconds > 0 else 0.0


def slow_links(link_check: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Nodes whose uplink or downlink runs under SLOW_LINK_RATIO of the median node's."""
    if len(link_check) < 2:
        return []
    named = []
    for direction in ("up_bps", "down_bps"):
        median = statistics.median(n[direction] for n in link_check)
        for n in link_check:
            if median > 0 and n[direction] < SLOW_LINK_RATIO * median and n not in named:
                named.append(n)
    return named


def fault_step(args: argparse.Namespace) -> int:
    """The step at which the fault starts."""
    return args.fault_at_step if args.fault_at_step >= 0 else args.steps // 3


def _last_step(url: str) -> int:
    """Rank 0's last reported step, from its agent's ``laggard_rank_last_step`` (-1 if none)."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            text = response.read().decode()
    except OSError:
        return -1
    for family in text_string_to_metric_families(text):
        if family.name == "laggard_rank_last_step":
            for sample in family.samples:
                if sample.labels.get("rank") == "0":
                    return int(sample.value)
    return -1


class LinkFaultInjector(threading.Thread):
    """Degrades one node's link when rank 0 reaches a step (polling its agent every 0.5 s).

    Args:
        cluster: the cluster. node: whose link. shape: the degraded shape. at_step: when.
    """

    def __init__(self, cluster: EmulatedCluster, node: Node, shape: LinkShape,
                 at_step: int) -> None:
        super().__init__(name="laggard-fault", daemon=True)
        self.cluster, self.node, self.shape, self.at_step = cluster, node, shape, at_step
        self.stop = threading.Event()
        self.applied_at_step: int | None = None
        self.error: str | None = None
        self._metrics = f"http://{cluster.nodes[0].address}:{AGENT_PORT}/metrics"

    def run(self) -> None:
        while not self.stop.wait(0.5):
            step = _last_step(self._metrics)
            if step >= self.at_step:
                try:
                    self.cluster.shape(self.node, self.shape)
                except NamespaceError as exc:
                    self.error = str(exc)
                    return
                self.applied_at_step = step
                print(f"  fault: at step {step}, {self.node.name}'s link degraded to "
                      f"{self.shape.describe()}", flush=True)
                return


def _worker_command(args: argparse.Namespace, cluster: EmulatedCluster, node: Node,
                    result_path: Path, slow_rank: int) -> list[str]:
    master = cluster.nodes[0]
    cmd = [sys.executable, "-m", "torch.distributed.run",
           "--nnodes", str(len(cluster.nodes)), "--node_rank", str(node.index),
           "--nproc_per_node", str(args.ranks_per_node),
           "--master_addr", master.address, "--master_port", str(MASTER_PORT),
           "--max_restarts", "0",
           "-m", "laggard.demo.worker",
           "--steps", str(args.steps), "--window", str(args.window),
           "--intake-address", f"127.0.0.1:{INTAKE_PORT}",
           "--compression", args.compression,
           "--print-every", str(max(1, args.steps // 8))]
    if slow_rank >= 0:
        cmd += ["--slow-rank", str(slow_rank), "--slowdown", str(args.slowdown),
                "--slow-from", str(fault_step(args))]
    if node.index == 0:
        cmd += ["--result", str(result_path)]
    if args.fault == "hang":
        # the nodes share the machine's file system: the hanging rank's marker and rank 0's
        # reports are read by the demo outside the namespaces
        cmd += ["--inject-hang", hang_injection(args).spec(),
                "--hang-marker", str(result_path.parent / "hang-marker.json"),
                "--hang-report", str(result_path.parent / "hang-reports.jsonl")]
    return cmd


def hang_injection(args: argparse.Namespace) -> HangInjection:
    """``--fault hang``: the fault node's first rank hangs at the fault step."""
    return HangInjection(rank=args.fault_node * args.ranks_per_node, step=max(1, fault_step(args)),
                         kind=args.hang_kind)


def _validate(args: argparse.Namespace) -> None:
    if not 2 <= args.nodes <= 16:
        raise DemoError("--nodes must be 2 to 16")
    if not 1 <= args.ranks_per_node <= 8:
        raise DemoError("--ranks-per-node must be 1 to 8")
    if args.nodes * args.ranks_per_node < 3:
        raise DemoError("the straggler detector compares at least 3 ranks: raise --nodes or "
                        "--ranks-per-node")
    if args.fault != "none" and not 0 <= args.fault_node < args.nodes:
        raise DemoError(f"--fault-node must be 0 to {args.nodes - 1}")
    if args.slowdown < 1.0 or args.steps < 2 * args.window or args.window < 2:
        raise DemoError("need --slowdown >= 1, --window >= 2 and --steps >= 2 windows")
    if args.fault_at_step >= args.steps:
        raise DemoError("--fault-at-step must be below --steps")
    if not 0 < args.loss_percent < 100 or args.timeout <= 0:
        raise DemoError("need 0 < --loss-percent < 100 and --timeout > 0")
    if args.fault == "hang":
        error = hang_injection(args).check(args.nodes * args.ranks_per_node, args.steps)
        if error:
            raise DemoError(f"--fault hang: {error}")
        if args.hang_bound <= 0:
            raise DemoError("--hang-bound must be > 0")
    try:
        from laggard.compression import COMPRESSORS
    except ImportError as exc:
        raise DemoError(f"the demo job needs torch: pip install 'laggard[torch]' ({exc})") \
            from exc
    if args.compression not in COMPRESSORS:
        raise DemoError(f"unknown --compression {args.compression!r}; choose one of "
                        f"{', '.join(COMPRESSORS)}")


def run(args: argparse.Namespace) -> int:
    """Run the demo; returns 0 when laggard named the injected fault, 1 when not, 2 on error."""
    try:
        _validate(args)
        check_can_create()
    except (DemoError, NamespaceError) as exc:
        print(f"laggard cluster-demo: {exc}", file=sys.stderr)
        return 2
    deadline = time.monotonic() + args.timeout
    try:
        with tempfile.TemporaryDirectory(prefix="laggard-cluster-") as tmp:
            link = LinkShape(rate_bps=args.rate, delay_s=args.delay_ms / 1e3)
            with EmulatedCluster(args.nodes, link) as cluster:
                try:
                    report = _run_demo(args, cluster, Path(tmp), deadline)
                finally:
                    if args.keep_logs:
                        shutil.copytree(tmp, args.keep_logs, dirs_exist_ok=True,
                                        ignore=shutil.ignore_patterns("tsdb"))
    except KeyboardInterrupt:
        print("\nlaggard cluster-demo: interrupted; every namespace, link and process it "
              "created is removed", file=sys.stderr)
        return 130
    except (DemoError, NamespaceError) as exc:
        print(f"laggard cluster-demo: {exc}; every namespace, link and process it created is "
              "removed", file=sys.stderr)
        return 2
    print_report(report)
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(report.to_dict(), indent=1, default=str))
    return 0 if report.verdict.get("named_correctly", args.fault == "none") else 1


def _run_demo(args: argparse.Namespace, cluster: EmulatedCluster, workdir: Path,
              deadline: float) -> Report:
    """The demo's steps: agents, Prometheus, the fault armed, training, alerts, link check,
    verdict."""
    if args.fault == "loss" and not cluster.netem_available():
        raise NamespaceError("--fault loss needs the kernel's netem qdisc "
                             "(CONFIG_NET_SCH_NETEM), which this kernel lacks")
    fault_node = cluster.nodes[args.fault_node] if args.fault != "none" else None
    slow_rank = (args.fault_node * args.ranks_per_node
                 if args.fault == "slow-rank" else -1)
    report = _describe_cluster(args, cluster, fault_node, slow_rank)
    if args.fault == "hang":
        hang = hang_injection(args)
        report.fault.update(rank=hang.rank, hang_kind=hang.kind, at_step=hang.step,
                            expected_kind=hang.expected_kind)
    _start_agents(cluster, workdir, deadline)
    try:
        prometheus = PrometheusServer(workdir, [f"{n.address}:{AGENT_PORT}"
                                                for n in cluster.nodes],
                                      args.scrape_interval, laggard_rules(DEMO_ALERT_FOR))
    except FileNotFoundError as exc:
        raise DemoError(str(exc)) from None
    try:
        try:
            prometheus.start()
        except NotReadyError as exc:
            raise DemoError(str(exc)) from None
        print(f"  prometheus: {prometheus.url} (alert 'for:' cut to {DEMO_ALERT_FOR} for the "
              "demo)")
        injector = _arm_fault(args, cluster, fault_node, slow_rank)
        if args.fault == "hang":
            _train_until_hang_named(args, cluster, workdir, prometheus, deadline, report)
            _judge_hang(report)
            return report
        # watched while the job runs: a finding ends with its job, and its alert with it
        watch = AlertWatch(prometheus)
        watch.start()
        try:
            _train(args, cluster, workdir, slow_rank, deadline, report)
        finally:
            watch.stop.set()
            watch.join(5)
            if injector is not None:
                injector.stop.set()
                injector.join(5)
        if injector is not None:
            if injector.error:
                raise DemoError(f"could not degrade the link: {injector.error}")
            report.fault["at_step"] = injector.applied_at_step
        elif slow_rank >= 0:
            report.fault["at_step"] = fault_step(args)
        _collect_alerts(prometheus, watch, report, deadline, args)
    finally:
        prometheus.stop()
    report.link_check = measure_links(cluster, deadline)
    _judge(report, args)
    return report


def _describe_cluster(args: argparse.Namespace, cluster: EmulatedCluster, fault_node: Node | None,
                      slow_rank: int) -> Report:
    """A new report holding the fault and the nodes; prints the cluster's shape."""
    report = Report(fault={"kind": args.fault,
                           "node": fault_node.name if fault_node else None,
                           "rank": slow_rank if slow_rank >= 0 else None})
    print(f"laggard cluster-demo: {len(cluster.nodes)} nodes x {args.ranks_per_node} ranks, "
          f"links {cluster.link.describe()}, bridge {cluster.bridge} on {cluster.subnet}")
    for node in cluster.nodes:
        report.nodes.append({"node": node.name, "netns": node.netns, "address": node.address,
                             "shape": cluster.shapes[node.name].qdisc})
    for missing in {m for s in cluster.shapes.values() for m in s.not_applied}:
        report.notes.append(f"not applied on the links: {missing}")
        print(f"  note: not applied on the links: {missing}")
    return report


def _start_agents(cluster: EmulatedCluster, workdir: Path, deadline: float) -> None:
    """One ``laggard agent`` per node (the cluster stops them); waits until each serves."""
    from laggard.agent import registry

    off = [f"--no-collector.{name}" for name in registry.collectors()
           if name not in NODE_COLLECTORS]
    agents = []
    for node in cluster.nodes:
        log = open(workdir / f"agent-{node.name}.log", "w")  # noqa: SIM115 - process lifetime
        agents.append(cluster.popen(node, [
            sys.executable, "-m", "laggard.cli", "agent",
            "--web.listen-address", f"{node.address}:{AGENT_PORT}",
            "--intake.address", f"127.0.0.1:{INTAKE_PORT}",
            # the nodes share one file system: each takes its job's records over its own
            # loopback UDP, none the host's default socket; each node's link is a veth (eth0)
            "--intake.socket", "", "--collector.netdev.device-include", "eth0",
            "--node.name", node.name, "--collector.interval", "0.5",
            # the link fault starts at a step of rank 0: laggard_rank_last_step, a per-rank
            # counter outside the default series budget (docs/metrics.md)
            "--intake.rank-histograms", *off],
            stdout=log, stderr=subprocess.STDOUT))
    for node, agent in zip(cluster.nodes, agents, strict=True):
        try:
            wait_until_ready(f"http://{node.address}:{AGENT_PORT}/metrics",
                             timeout=min(deadline - time.monotonic(), 30),
                             what=f"agent on {node.name}", procs=[agent])
        except NotReadyError as exc:
            raise DemoError(str(exc)) from None
    print("  agents: " + ", ".join(f"http://{n.address}:{AGENT_PORT}/metrics"
                                   for n in cluster.nodes))


def _arm_fault(args: argparse.Namespace, cluster: EmulatedCluster, fault_node: Node | None,
               slow_rank: int) -> LinkFaultInjector | None:
    """Start the link injector for ``link`` and ``loss`` (returned), or say which rank the
    workers slow for ``slow-rank``."""
    if fault_node is not None and args.fault in ("link", "loss"):
        degraded = LinkShape(
            rate_bps=args.fault_rate if args.fault == "link" else args.rate,
            delay_s=args.delay_ms / 1e3,
            loss_ratio=args.loss_percent / 100 if args.fault == "loss" else 0.0)
        injector = LinkFaultInjector(cluster, fault_node, degraded, fault_step(args))
        print(f"  fault: from step {fault_step(args)}, {fault_node.name}'s link will be "
              f"degraded to {degraded.describe()}")
        injector.start()
        return injector
    if args.fault == "hang" and fault_node is not None:
        print(f"  fault: at step {hang_injection(args).step}, rank "
              f"{hang_injection(args).rank} on {fault_node.name} hangs: "
              f"{describe_injection(hang_injection(args))}")
    if slow_rank >= 0:
        print(f"  fault: from step {fault_step(args)}, rank {slow_rank} on "
              f"{cluster.nodes[args.fault_node].name} computes {args.slowdown:g}x its own time "
              "per step")
    return None


def _train(args: argparse.Namespace, cluster: EmulatedCluster, workdir: Path, slow_rank: int,
           deadline: float, report: Report) -> None:
    result_path = workdir / "result.json"
    echo = threading.Event()  # rank 0's progress, until the demo stops the job itself
    echo.set()
    started = time.monotonic()
    print(f"  training {args.steps} steps on {len(cluster.nodes) * args.ranks_per_node} ranks "
          f"(compression {args.compression}); rank 0 prints:")
    jobs, pumps = _start_job(args, cluster, workdir, slow_rank, echo)
    try:
        for node, proc in jobs:
            remaining = deadline - time.monotonic()
            try:
                code = proc.wait(max(0.1, remaining))
            except subprocess.TimeoutExpired:
                raise DemoError(f"the job ran past --timeout ({args.timeout:g} s)") from None
            if code != 0:
                tail = (workdir / f"job-{node.name}.log").read_text()[-2000:]
                raise DemoError(f"the job on {node.name} exited {code}:\n{tail}")
    except BaseException:
        echo.clear()  # what the launchers say while being stopped is in the logs, not here
        raise
    finally:
        for pump in pumps:
            pump.join(2)
    result = json.loads(result_path.read_text())
    report.job = {"seconds": round(time.monotonic() - started, 1), "steps": result["steps"],
                  "world_size": result["world_size"], "loss": result["loss"]}
    report.findings = [f for f in result["findings"]
                       if f.get("detector") in ("straggler", "link")]


def _env() -> dict[str, str]:
    """The job's environment on every node."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "eth0",
            "PYTHONUNBUFFERED": "1", "LOGLEVEL": "WARNING",
            # c10d warns that it cannot reverse-resolve 198.18.0.0/15 peers: harmless here.
            "TORCH_CPP_LOG_LEVEL": "ERROR"}


def _start_job(args: argparse.Namespace, cluster: EmulatedCluster, workdir: Path, slow_rank: int,
               echo: threading.Event) -> tuple[list[tuple[Node, subprocess.Popen[str]]],
                                               list[threading.Thread]]:
    """One launcher per node, its output to ``job-<node>.log`` (rank 0's echoed while ``echo``
    is set); returns the (node, launcher) pairs and the output pumps."""
    jobs, pumps = [], []
    for node in cluster.nodes:
        proc = cluster.popen(node, _worker_command(args, cluster, node, workdir / "result.json",
                                                   slow_rank),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=_env())
        pump = threading.Thread(target=_pump, daemon=True,
                                args=(proc.stdout, workdir / f"job-{node.name}.log",
                                      echo if node.index == 0 else None))
        pump.start()
        jobs.append((node, proc))
        pumps.append(pump)
    return jobs, pumps


def _train_until_hang_named(args: argparse.Namespace, cluster: EmulatedCluster, workdir: Path,
                            prometheus: PrometheusServer, deadline: float,
                            report: Report) -> None:
    """``--fault hang``: run the job until rank 0 has named the hang in its log and Prometheus
    fires :data:`HANG_ALERT` for the hung rank, or ``--hang-bound`` seconds after the hang;
    then stop the job (not gloo's timeout). Fills ``report.job`` with both figures."""
    hang = hang_injection(args)
    marker_path, reports_path = workdir / "hang-marker.json", workdir / "hang-reports.jsonl"
    echo = threading.Event()
    echo.set()
    print(f"  training on {len(cluster.nodes) * args.ranks_per_node} ranks until the hang is "
          "named; rank 0 prints:")
    jobs, pumps = _start_job(args, cluster, workdir, -1, echo)
    marker: dict[str, Any] | None = None
    alert_at: float | None = None
    alert: dict[str, Any] | None = None
    active: list[dict[str, Any]] = []  # the alerts while the job hangs (they resolve after)
    try:
        while True:
            time.sleep(0.5)
            if time.monotonic() > deadline:
                raise DemoError(f"the job ran past --timeout ({args.timeout:g} s)")
            for node, proc in jobs:
                if proc.poll() is not None:
                    tail = (workdir / f"job-{node.name}.log").read_text()[-2000:]
                    raise DemoError(f"the job on {node.name} exited {proc.returncode} before "
                                    f"the hang was named:\n{tail}")
            if marker is None and marker_path.exists():
                with contextlib.suppress(OSError, ValueError):
                    marker = json.loads(marker_path.read_text())
            if marker is None:
                continue
            if alert is None:
                active = prometheus.alerts()
                alert = next((a for a in active if a["labels"].get("alertname") == HANG_ALERT
                              and a["state"] == "firing"), None)
                alert_at = time.time() if alert is not None else None
            named = any(r["time"] >= marker["time"] for r in read_json_lines(reports_path))
            if (named and alert is not None) or time.time() > marker["time"] + args.hang_bound:
                break
    finally:
        echo.clear()  # what the launchers say while being stopped is in the logs
        cluster.stop_processes(procs=[proc for _, proc in jobs])
        for pump in pumps:
            pump.join(2)
    outcome = hang_outcome(hang, marker, read_json_lines(reports_path), args.hang_bound,
                           checked=reports_path.exists())
    report.alerts = [{"alertname": a["labels"]["alertname"], "state": a["state"],
                      "labels": a["labels"], "activeAt": a.get("activeAt"),
                      "summary": a.get("annotations", {}).get("summary")}
                     for a in active]
    report.ranks = {r["metric"]["rank"]: r["metric"].get("node", "")
                    for r in prometheus.query("laggard_rank_info")}
    report.job = {"in_job": outcome, "prometheus": {
        "alert": HANG_ALERT, "firing": alert is not None,
        "seconds_to_firing": (round(alert_at - marker["time"], 1)
                              if alert_at is not None and marker else None),
        "ranks": alert_ranks(alert) if alert is not None else [],
        "labels": alert["labels"] if alert is not None else {},
        "scrape_and_rule_interval_seconds": args.scrape_interval,
        "alert_for": DEMO_ALERT_FOR}}


def alert_ranks(alert: dict[str, Any]) -> list[int]:
    """The ranks an alert names: its ``rank`` label, or the digits of a ``ranks`` label
    (``"2"``, ``"2,5"``)."""
    labels = alert.get("labels", {})
    text = labels.get("rank") or labels.get("ranks") or ""
    return sorted({int(t) for t in re.findall(r"\d+", text)})


def _judge_hang(report: Report) -> None:
    """``--fault hang``: named correctly when rank 0's log named the hung rank with its kind
    and no other, and Prometheus fired the hang alert for that rank alone (with that kind, when
    the alert says one)."""
    in_job, prom = report.job["in_job"], report.job["prometheus"]
    rank = report.fault["rank"]
    report.verdict = {
        "in_job_correct": bool(in_job["correct"]),
        "in_job_seconds": in_job["seconds_to_name"],
        "prometheus_correct": (prom["firing"] and prom["ranks"] == [rank]
                               and prom["labels"].get("kind") in (None,
                                                                  report.fault["expected_kind"])),
        "prometheus_seconds": prom["seconds_to_firing"],
        "alerts_firing": sorted({a["alertname"] for a in report.alerts
                                 if a["state"] == "firing"}),
        "node": report.ranks.get(str(rank)), "rank": rank, "cause": "hang"}
    report.verdict["named_correctly"] = (report.verdict["in_job_correct"]
                                         and report.verdict["prometheus_correct"])


class AlertWatch(threading.Thread):
    """Polls Prometheus's active alerts every ``interval`` seconds until :attr:`stop` is set,
    keeping each laggard in-job alert (:data:`_IN_JOB_ALERTS`) seen, by its labels, firing
    over pending: a straggler's finding ends when its job does and its alert resolves with it,
    so an alert that fired during training is gone from ``/api/v1/alerts`` afterwards."""

    def __init__(self, prometheus: PrometheusServer, interval: float = 0.5) -> None:
        super().__init__(name="laggard-alert-watch", daemon=True)
        self.prometheus, self.interval = prometheus, interval
        self.stop = threading.Event()
        self._seen: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}
        self._lock = threading.Lock()

    def run(self) -> None:
        while not self.stop.wait(self.interval):
            self.poll()

    def poll(self) -> list[dict[str, Any]]:
        """One look at the active alerts; returns laggard's in-job ones, and keeps them."""
        alerts = [a for a in self.prometheus.alerts()
                  if a.get("labels", {}).get("alertname", "").startswith(_IN_JOB_ALERTS)]
        with self._lock:
            for alert in alerts:
                key = tuple(sorted(alert["labels"].items()))
                if self._seen.get(key, {}).get("state") != "firing":
                    self._seen[key] = alert
        return alerts

    def seen(self) -> list[dict[str, Any]]:
        """Every in-job alert seen, once per label set (its firing state when it fired)."""
        with self._lock:
            return list(self._seen.values())

    def fired(self) -> bool:
        """Whether any in-job alert has been seen firing."""
        return any(a.get("state") == "firing" for a in self.seen())


def _collect_alerts(prometheus: PrometheusServer, watch: AlertWatch, report: Report,
                    deadline: float, args: argparse.Namespace) -> None:
    """Unless one already fired during training, wait (bounded) for a laggard straggler alert
    to fire; keep every in-job alert seen, during training or after."""
    wait_until = min(deadline, time.monotonic() + 20 + 4 * args.scrape_interval)
    while not watch.fired() and time.monotonic() <= wait_until:
        watch.poll()
        time.sleep(0.5)
    report.alerts = [{"alertname": a["labels"]["alertname"], "state": a["state"],
                      "labels": a["labels"], "summary": a.get("annotations", {}).get("summary")}
                     for a in watch.seen()]
    report.ranks = {r["metric"]["rank"]: r["metric"].get("node", "")
                    for r in prometheus.query("laggard_rank_info")}


def _judge(report: Report, args: argparse.Namespace) -> None:
    """Name the node, rank and cause from what laggard reported; compare with the fault."""
    raised = [f for f in report.findings
              if f.get("kind") in ("compute", "data", "communication", "link")
              and not f.get("cleared")]
    verdict: dict[str, Any] = {"node": None, "rank": None, "cause": None, "source": None}
    if raised:
        first = raised[0]
        # The node of a rank is the node whose agent receives its records (Prometheus'
        # laggard_rank_info); the finding's own node label is the fallback.
        # A link finding names the node itself (and the first rank on it).
        node = (first.get("node") if first["kind"] == "link" else None) or report.ranks.get(
            str(first.get("rank"))) or first.get("node")
        if first.get("node") and node != first.get("node"):
            report.notes.append(f"the finding says {first['node']} for rank {first['rank']}; "
                                f"its records arrive at {node}'s agent")
        verdict.update(node=node, rank=first.get("rank"),
                       cause="compute" if first["kind"] in ("compute", "data") else "link",
                       source=f"in-job {'link' if first['kind'] == 'link' else 'straggler'} "
                              f"detector: {first.get('message')}")
    else:
        # No rank computes or loads data slower than the others. In a ring all-reduce a slow
        # link slows every rank alike (the in-job detector sees, at most, the whole job slow
        # down), so the link check says which link it is.
        slow = slow_links(report.link_check)
        if len(slow) == 1:
            node = slow[0]["node"]
            ranks = sorted(int(r) for r, n in report.ranks.items() if n == node)
            source = "link check: uplink {:.0f} Mbit/s, downlink {:.0f} Mbit/s".format(
                slow[0]["up_bps"] / 1e6, slow[0]["down_bps"] / 1e6)
            if any(f.get("kind") == "job_slowdown" for f in report.findings):
                source += "; the in-job detector saw the whole job slow down, no rank alone"
            verdict.update(node=node, rank=ranks[0] if len(ranks) == 1 else ranks, cause="link",
                           source=source)
    firing = [a for a in report.alerts if a["state"] == "firing"
              and a["alertname"].startswith(_IN_JOB_ALERTS)]
    verdict["alerts_firing"] = sorted({a["alertname"] for a in firing})
    verdict["alert_ranks"] = sorted({int(a["labels"]["rank"]) for a in firing
                                     if a["labels"].get("rank", "").isdigit()})
    expected = {"slow-rank": "compute", "link": "link", "loss": "link"}.get(args.fault)
    if expected is None:
        verdict["named_correctly"] = verdict["node"] is None
    else:
        verdict["named_correctly"] = (verdict["node"] == report.fault["node"]
                                      and verdict["cause"] == expected
                                      and (expected != "compute"
                                           or verdict["rank"] == report.fault["rank"]))
    report.verdict = verdict


def _print_hang(report: Report) -> None:
    v, prom = report.verdict, report.job["prometheus"]
    print(format_hang(report.job["in_job"]))
    seconds = prom["seconds_to_firing"]
    print(f"prometheus: {HANG_ALERT} " + (
        f"firing {seconds:.1f} s after the hang, ranks {prom['ranks']} (scrape and rule "
        f"interval {prom['scrape_and_rule_interval_seconds']:g} s, for: {prom['alert_for']})"
        if prom["firing"] else "not firing within --hang-bound"))
    for a in report.alerts:
        print(f"alert:     {a['alertname']} {a['state']}: {a['summary']}")
    print("the demo stopped the job instead of waiting for gloo's timeout")
    print(f"verdict:   {'named correctly' if v.get('named_correctly') else 'NOT named correctly'}"
          f" (in the job: {'yes' if v['in_job_correct'] else 'no'}, Prometheus: "
          f"{'yes' if v['prometheus_correct'] else 'no'})")


def print_report(report: Report) -> None:
    """The end-of-run report, for people."""
    v, fault = report.verdict, report.fault
    print("\n=== laggard cluster-demo report ===")
    what = fault["kind"] if fault["node"] is None else f"{fault['kind']} on {fault['node']}"
    if fault.get("rank") is not None:
        what += f" (rank {fault['rank']})"
    if fault.get("at_step") is not None:
        what += f" from step {fault['at_step']}"
    print(f"injected:  {what}")
    if fault["kind"] == "hang":
        _print_hang(report)
        return
    if report.job:
        loss = report.job["loss"]
        print(f"job:       {report.job['world_size']} ranks, {report.job['steps']} steps in "
              f"{report.job['seconds']} s, loss {loss['first']:.3f} -> {loss['last']:.3f}")
    if v.get("node"):
        print(f"found:     node {v['node']}, rank {v['rank']}, cause {v['cause']}")
        print(f"           {v['source']}")
    else:
        print("found:     no rank and no link stands out")
    for f in report.findings:
        if not f.get("cleared"):
            print(f"in-job:    step {f.get('step')}: {f.get('message')}")
    for a in report.alerts:
        print(f"alert:     {a['alertname']} {a['state']}: {a['summary']}")
    if not report.alerts:
        print("alert:     none seen in Prometheus")
    for n in report.link_check:
        print(f"link:      {n['node']} ({n['address']}): up {n['up_bps'] / 1e6:.0f} Mbit/s, "
              f"down {n['down_bps'] / 1e6:.0f} Mbit/s")
    for note in report.notes:
        print(f"note:      {note}")
    verdict = "named correctly" if v.get("named_correctly") else "NOT named correctly"
    print(f"verdict:   {verdict}")
