"""Emulated nodes on one machine: network namespaces on a shared bridge, links shaped with ``tc``.

Each node is a network namespace with one veth pair into a bridge in the initial namespace, like
hosts on one switch: real separate TCP/IP stacks, real packets, real rate limits. The machine
itself sits on the bridge as the "monitoring host" (the bridge's own address), so a Prometheus
started here scrapes every node's agent.

::

    with EmulatedCluster(nodes=3, link=LinkShape(rate_bps=1e9)) as cluster:
        proc = cluster.popen(cluster.nodes[1], ["python", "-m", "laggard.cli", "agent"])
        cluster.shape(cluster.nodes[1], LinkShape(rate_bps=100e6))   # degrade one link
        print(cluster.link_counters(cluster.nodes[1]))

Addresses are taken from 198.18.0.0/15 only (RFC 2544 / RFC 6815: set aside for network
benchmarks, never routed): one free /24 per cluster, the nodes at ``.1``, ``.2``, ..., the bridge
at ``.254``. Every name this module creates starts with ``lgd`` followed by the creating process
id (namespaces ``lgd<pid>n<i>``, bridge ``lgd<pid>br``, host-side veths ``lgd<pid>n<i>``), so
several clusters can coexist, nothing else on the machine is touched, and what a killed run left
behind is recognised and removed by the next one (:func:`sweep_stale`).

A link is shaped in both directions: the node's ``eth0`` egress (what it sends) and the host-side
veth's egress (what it receives), each with a token bucket (``tbf``) at the link rate. Delay and
loss need the kernel's ``netem`` qdisc (``CONFIG_NET_SCH_NETEM``); where the kernel lacks it,
:meth:`EmulatedCluster.shape` raises for loss and reports delay as not applied.

Everything is removed on :meth:`EmulatedCluster.close` (also run by ``__exit__``, on SIGTERM and
SIGHUP while the cluster is open, and at interpreter exit): processes first (their sessions get
SIGTERM, then SIGKILL), then the namespaces (which takes their veth ends and the peers with them),
then the bridge. Needs root (``CAP_NET_ADMIN`` and ``CAP_SYS_ADMIN``) and iproute2.

Why one module of ~600 lines: :class:`EmulatedCluster` owns every namespace, veth, bridge and
qdisc it makes, and its teardown must undo exactly those; the set-up and the teardown are read
together.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import fcntl
import functools
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

#: The only addresses this module hands out (RFC 2544 §C.2.2, RFC 6815: benchmarking range).
BENCHMARK_NET = ipaddress.IPv4Network("198.18.0.0/15")
#: Every interface and namespace name starts with this, then the owning process id.
PREFIX = "lgd"
#: Name of a node's interface inside its namespace.
NODE_DEVICE = "eth0"
#: Most nodes one cluster may have (a /24 holds 253 hosts; more than this on one machine is
#: not an emulation of anything useful).
MAX_NODES = 64
#: Serialises set-up and the stale sweep between concurrent clusters on this machine.
LOCK_PATH = Path("/run/laggard-netns.lock")
#: Seconds a process gets between SIGTERM and SIGKILL at teardown.
TERMINATE_GRACE_SECONDS = 5.0
_PR_SET_PDEATHSIG = 1
_CAP_NET_ADMIN, _CAP_SYS_ADMIN = 12, 21
_CLONE_NEWUTS = 0x04000000


class NamespaceError(RuntimeError):
    """Network namespaces cannot be made here (not root, no iproute2) or a command failed."""


@dataclass(frozen=True, slots=True)
class LinkShape:
    """How one node's link to the bridge is shaped, the same in both directions.

    Attributes:
        rate_bps: line rate in bits per second (token bucket rate), e.g. ``1e9``; 0 = unshaped.
        delay_s: one-way added delay in seconds (needs netem); 0 = none.
        loss_ratio: fraction of packets dropped at random, 0 to 1 (needs netem); 0 = none.
    """

    rate_bps: float = 1e9
    delay_s: float = 0.0002
    loss_ratio: float = 0.0

    def __post_init__(self) -> None:
        if self.rate_bps < 0 or self.delay_s < 0 or not 0 <= self.loss_ratio < 1:
            raise ValueError(f"bad link shape: {self}")

    def describe(self) -> str:
        """One line for people, e.g. ``1 Gbit/s, 0.2 ms, 1% loss``."""
        parts = [_format_rate(self.rate_bps) if self.rate_bps else "unshaped"]
        if self.delay_s:
            parts.append(f"{self.delay_s * 1e3:g} ms")
        if self.loss_ratio:
            parts.append(f"{self.loss_ratio * 100:g}% loss")
        return ", ".join(parts)


@dataclass(frozen=True, slots=True)
class Node:
    """One emulated node.

    Attributes:
        index: 0-based node number (``torch.distributed.run --node_rank``).
        name: its label (``node0``, ...), used as the agent's ``--node.name``.
        netns: network namespace name.
        address: its IPv4 address on the bridge (in 198.18.0.0/15).
        host_veth: the bridge port in the initial namespace: its counters are the node's link
            seen from the switch (its ``rx`` is what the node sent).
    """

    index: int
    name: str
    netns: str
    address: str
    host_veth: str

    def argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` wrapped to run inside this node's namespace."""
        return ["ip", "netns", "exec", self.netns, *argv]


@dataclass(frozen=True, slots=True)
class LinkCounters:
    """Byte and packet counters of a node's link, from the node's side.

    Attributes:
        tx_bytes: bytes the node sent (the bridge port's receive counter).
        rx_bytes: bytes the node received (the bridge port's transmit counter).
        tx_packets, rx_packets: the same in packets.
        dropped: packets dropped by the bridge port in either direction.
    """

    tx_bytes: int
    rx_bytes: int
    tx_packets: int
    rx_packets: int
    dropped: int

    def __sub__(self, other: LinkCounters) -> LinkCounters:
        return LinkCounters(self.tx_bytes - other.tx_bytes, self.rx_bytes - other.rx_bytes,
                            self.tx_packets - other.tx_packets,
                            self.rx_packets - other.rx_packets, self.dropped - other.dropped)


@dataclass(slots=True)
class ShapeResult:
    """What :meth:`EmulatedCluster.shape` applied.

    Attributes:
        shape: the shape asked for.
        qdisc: the tc qdisc chain installed, e.g. ``tbf`` or ``netem+tbf``.
        not_applied: what the kernel could not do (e.g. ``delay: no sch_netem``).
    """

    shape: LinkShape
    qdisc: str
    not_applied: list[str] = field(default_factory=list)


def check_can_create() -> None:
    """Raise :class:`NamespaceError` with the reason when namespaces cannot be made here."""
    if os.name != "posix" or not Path("/proc/self/ns/net").exists():
        raise NamespaceError("network namespaces need Linux")
    if os.geteuid() != 0 or not _has_capabilities(_CAP_NET_ADMIN, _CAP_SYS_ADMIN):
        raise NamespaceError("creating network namespaces needs root (CAP_NET_ADMIN and "
                             "CAP_SYS_ADMIN); run as root, e.g. with sudo")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise NamespaceError(f"`{tool}` not found: install iproute2")


def _has_capabilities(*caps: int) -> bool:
    """Whether this process holds every capability bit in ``caps`` (``CapEff`` of
    /proc/self/status; bit numbers from linux/capability.h)."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return True  # cannot tell: let the first command fail with its own message
    m = re.search(r"^CapEff:\s*([0-9a-f]+)", status, re.MULTILINE)
    effective = int(m.group(1), 16) if m else 0
    return all(effective >> cap & 1 for cap in caps)


def _run(argv: Sequence[str], *, check: bool = True, timeout: float = 10.0) -> str:
    """Run an iproute2 command; return stdout. Raises NamespaceError when it fails."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NamespaceError(f"{' '.join(argv)}: {exc}") from exc
    if check and done.returncode != 0:
        raise NamespaceError(f"{' '.join(argv)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _links() -> list[dict[str, Any]]:
    return json.loads(_run(["ip", "-j", "link", "show"]) or "[]")


def _netns_names() -> list[str]:
    return [n["name"] for n in json.loads(_run(["ip", "-j", "netns", "list"]) or "[]")]


def _kill_netns_processes(netns: str) -> None:
    """SIGTERM, then SIGKILL, every process left in ``netns``."""
    for sig, wait in ((signal.SIGTERM, TERMINATE_GRACE_SECONDS), (signal.SIGKILL, 2.0)):
        pids = [int(p) for p in _run(["ip", "netns", "pids", netns], check=False).split()]
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and any(_pid_alive(p) for p in pids):
            time.sleep(0.05)


def _delete_netns(netns: str) -> None:
    _kill_netns_processes(netns)
    _run(["ip", "netns", "del", netns], check=False)


def sweep_stale(prefix: str = PREFIX) -> list[str]:
    """Remove namespaces and interfaces a dead process of this module left behind.

    Only names matching ``<prefix><pid>n<i>``, ``<prefix><pid>n<i>p`` or ``<prefix><pid>br``
    whose ``<pid>`` no longer runs are touched.

    Returns:
        The names removed.
    """
    pattern = re.compile(rf"^{re.escape(prefix)}(\d+)(?:n\d+p?|br)$")
    removed = []
    for netns in _netns_names():
        m = pattern.match(netns)
        if m and not _pid_alive(int(m.group(1))):
            _delete_netns(netns)
            removed.append(netns)
    for link in _links():
        name = link.get("ifname", "")
        m = pattern.match(name)
        if m and not _pid_alive(int(m.group(1))):
            _run(["ip", "link", "del", name], check=False)
            removed.append(name)
    return removed


def _used_subnets() -> set[ipaddress.IPv4Network]:
    """/24s of 198.18.0.0/15 that any address in the initial namespace already sits in."""
    used = set()
    for link in json.loads(_run(["ip", "-j", "-4", "addr", "show"]) or "[]"):
        for info in link.get("addr_info", []):
            addr = ipaddress.IPv4Address(info["local"])
            if addr in BENCHMARK_NET:
                used.add(ipaddress.IPv4Network(f"{addr}/24", strict=False))
    return used


def _pick_subnet(seed: int) -> ipaddress.IPv4Network:
    subnets = list(BENCHMARK_NET.subnets(new_prefix=24))
    used = _used_subnets()
    for k in range(len(subnets)):
        candidate = subnets[(seed + k) % len(subnets)]
        if candidate not in used:
            return candidate
    raise NamespaceError("every /24 of 198.18.0.0/15 is in use")


def _format_rate(bps: float) -> str:
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bps >= scale:
            return f"{bps / scale:g} {unit}"
    return f"{bps:g} bit/s"


def _tbf_args(rate_bps: float) -> list[str]:
    # The bucket must hold at least one GSO super-packet (64 KiB; a smaller bucket makes tbf
    # segment every one) and about 1 ms of line rate, so hrtimer wake-ups keep the rate; the
    # queue holds 20 ms of line rate, a shallow switch buffer that keeps RTT low under load.
    rate_bytes = rate_bps / 8
    burst = max(int(rate_bytes * 1e-3), 96 * 1024)
    limit = max(int(rate_bytes * 20e-3), 2 * burst)
    return ["tbf", "rate", f"{int(rate_bps)}bit", "burst", str(burst), "limit", str(limit)]


def _enter_node(hostname: str) -> None:
    """Runs in the child between fork and exec (``ip netns exec`` then execs in place).

    The kernel sends SIGTERM to the child when the creating thread dies, so even a SIGKILLed
    orchestrator leaves no training job behind. A UTS namespace of its own gives the node its
    own host name, as separate hosts have: the agent's ``node`` label and the ranks' records
    default to it.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    name = hostname.encode()
    if libc.unshare(_CLONE_NEWUTS) == 0:
        libc.sethostname(name, len(name))


class EmulatedCluster:
    """N nodes as network namespaces on one bridge, with shaped links; removed on close.

    Args:
        nodes: number of nodes, 1 to :data:`MAX_NODES`.
        link: the shape of every link at start.
        handle_signals: turn SIGTERM and SIGHUP into ``SystemExit`` while the cluster is open
            (main thread only), so ``finally`` blocks and ``__exit__`` run and remove it.

    Raises:
        NamespaceError: not root, iproute2 missing, or a command failed (whatever was created
            is removed before it propagates).
    """

    def __init__(self, nodes: int = 3, link: LinkShape | None = None, *,
                 handle_signals: bool = True) -> None:
        if not 1 <= nodes <= MAX_NODES:
            raise ValueError(f"nodes must be 1 to {MAX_NODES}, not {nodes}")
        self.link = link or LinkShape()
        self._count = nodes
        self._handle_signals = handle_signals
        self._owner = os.getpid()
        self.bridge = f"{PREFIX}{self._owner}br"
        self.subnet: ipaddress.IPv4Network | None = None
        self.nodes: list[Node] = []
        self.shapes: dict[str, ShapeResult] = {}
        self._procs: list[subprocess.Popen[Any]] = []
        self._lock = threading.Lock()
        self._closed = False
        self._old_handlers: dict[int, Any] = {}
        self._netem: bool | None = None
        self._deferred_signal: int | None = None

    # -- life cycle -------------------------------------------------------------------------

    def __enter__(self) -> EmulatedCluster:
        self.open()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def open(self) -> None:
        """Create the bridge, the namespaces and the shaped links."""
        check_can_create()
        self._install_signal_handlers()
        atexit.register(self.close)
        try:
            try:
                LOCK_PATH.parent.mkdir(parents=True, exist_ok=True)
                lock = open(LOCK_PATH, "w")  # noqa: SIM115 - closed by the with below
            except OSError as exc:
                raise NamespaceError(f"cannot open the set-up lock {LOCK_PATH}: {exc}") from exc
            with lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                sweep_stale()
                self.subnet = _pick_subnet(self._owner)
                self._create()
            self.netem_available()  # probed now, on a link not yet shaped
            for node in self.nodes:
                self.shape(node, self.link)
        except BaseException:
            self.close()
            raise

    def _create(self) -> None:
        assert self.subnet is not None
        hosts = list(self.subnet.hosts())
        gateway = hosts[-1]  # .254
        _run(["ip", "link", "add", self.bridge, "type", "bridge"])
        _run(["ip", "addr", "add", f"{gateway}/{self.subnet.prefixlen}", "dev", self.bridge])
        _disable_ipv6(self.bridge)
        _run(["ip", "link", "set", self.bridge, "up"])
        for i in range(self._count):
            stem = f"{PREFIX}{self._owner}n{i}"
            node = Node(index=i, name=f"node{i}", netns=stem, address=str(hosts[i]),
                        host_veth=stem)
            _run(["ip", "netns", "add", node.netns])
            self.nodes.append(node)  # from here on close() removes it
            _run(["ip", "link", "add", stem, "type", "veth", "peer", "name", f"{stem}p"])
            _disable_ipv6(stem)
            _run(["ip", "link", "set", f"{stem}p", "netns", node.netns])
            ns = ["ip", "-n", node.netns]
            _run([*ns, "link", "set", f"{stem}p", "name", NODE_DEVICE])
            _run([*ns, "addr", "add", f"{node.address}/{self.subnet.prefixlen}",
                  "dev", NODE_DEVICE])
            _run(node.argv(["sh", "-c", "echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6"]),
                 check=False)
            _run([*ns, "link", "set", "lo", "up"])
            _run([*ns, "link", "set", NODE_DEVICE, "up"])
            _run(["ip", "link", "set", stem, "master", self.bridge])
            _run(["ip", "link", "set", stem, "up"])

    def close(self) -> None:
        """Remove every process, namespace, link and the bridge (idempotent; raises nothing of
        its own: a signal that arrived during the teardown is re-delivered once it is done)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._defer_signals()  # a second Ctrl-C must not cut the teardown short
        try:
            self._stop_processes()
            for node in self.nodes:
                with contextlib.suppress(NamespaceError):
                    _delete_netns(node.netns)
                with contextlib.suppress(NamespaceError):
                    if Path(f"/sys/class/net/{node.host_veth}").exists():
                        _run(["ip", "link", "del", node.host_veth], check=False)
            with contextlib.suppress(NamespaceError):
                if Path(f"/sys/class/net/{self.bridge}").exists():
                    _run(["ip", "link", "del", self.bridge], check=False)
        finally:
            self._restore_signal_handlers()
            atexit.unregister(self.close)

    def _stop_processes(self) -> None:
        self.stop_processes()

    def stop_processes(self, procs: Sequence[subprocess.Popen[Any]] | None = None) -> None:
        """SIGTERM, then SIGKILL, the sessions of ``procs`` (of :meth:`popen`; default: all of
        them); waits for each. The namespaces' other processes go at :meth:`close`."""
        live = [p for p in (self._procs if procs is None else procs) if p.poll() is None]
        for sig, grace in ((signal.SIGTERM, TERMINATE_GRACE_SECONDS), (signal.SIGKILL, 2.0)):
            for proc in live:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, sig)
            deadline = time.monotonic() + grace
            for proc in live:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(max(0.0, deadline - time.monotonic()))
            live = [p for p in live if p.poll() is None]
            if not live:
                return

    def _install_signal_handlers(self) -> None:
        if not self._handle_signals or threading.current_thread() is not threading.main_thread():
            return

        def on_signal(signum: int, frame: FrameType | None) -> None:
            raise SystemExit(128 + signum)

        for sig in (signal.SIGTERM, signal.SIGHUP):
            self._old_handlers[sig] = signal.signal(sig, on_signal)
        # Ctrl-C as KeyboardInterrupt even when started with SIGINT ignored (a non-interactive
        # shell's `&` does that, and Python then keeps it ignored): the demo, run by such a
        # script, once trained to its end through the SIGINT meant to stop it.
        self._old_handlers[signal.SIGINT] = signal.signal(signal.SIGINT,
                                                          signal.default_int_handler)

    def _defer_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def note(signum: int, frame: FrameType | None) -> None:
            self._deferred_signal = signum

        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            previous = signal.signal(sig, note)
            self._old_handlers.setdefault(sig, previous)

    def _restore_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, handler in self._old_handlers.items():
            signal.signal(sig, handler)
        self._old_handlers.clear()
        if self._deferred_signal is not None:
            # Re-deliver what arrived during the teardown, now that it is done.
            signum, self._deferred_signal = self._deferred_signal, None
            signal.raise_signal(signum)

    # -- use --------------------------------------------------------------------------------

    @property
    def gateway(self) -> str:
        """The bridge's own address: the machine itself, as seen from the nodes."""
        assert self.subnet is not None
        return str(list(self.subnet.hosts())[-1])

    def popen(self, node: Node, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` inside ``node``'s namespace, in a session of its own, with the node's
        name as host name (its own UTS namespace).

        The process (and its session) is terminated by :meth:`close`. Keyword arguments go to
        :class:`subprocess.Popen` (``env``, ``stdout``, ...).
        """
        if self._closed:
            raise NamespaceError("cluster is closed")
        proc = subprocess.Popen(node.argv(argv), start_new_session=True,
                                preexec_fn=functools.partial(_enter_node, node.name), **kwargs)
        self._procs.append(proc)
        return proc

    def run(self, node: Node, argv: Sequence[str], timeout: float = 30.0,
            **kwargs: Any) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside ``node``'s namespace to completion (bounded by ``timeout``)."""
        proc = self.popen(node, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, **kwargs)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            raise NamespaceError(f"{' '.join(argv)} ran past {timeout} s: {err}") from None
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def netem_available(self) -> bool:
        """Whether this kernel has the netem qdisc (delay and loss); probed once, at open."""
        if self._netem is None:
            probe = self.nodes[0].host_veth
            self._netem = subprocess.run(
                ["tc", "qdisc", "replace", "dev", probe, "root", "netem", "delay", "1ms"],
                capture_output=True).returncode == 0
            subprocess.run(["tc", "qdisc", "del", "dev", probe, "root"], capture_output=True)
        return self._netem

    def shape(self, node: Node, shape: LinkShape) -> ShapeResult:
        """Shape ``node``'s link in both directions, replacing what was there.

        Raises:
            NamespaceError: loss asked for on a kernel without netem, or tc failed.
        """
        wants_netem = bool(shape.delay_s or shape.loss_ratio)
        netem = wants_netem and self.netem_available()
        if shape.loss_ratio and not netem:
            raise NamespaceError("packet loss needs the kernel's netem qdisc "
                                 "(CONFIG_NET_SCH_NETEM), which this kernel lacks")
        result = ShapeResult(shape, qdisc="none")
        if wants_netem and not netem:
            result.not_applied.append("delay: this kernel has no netem qdisc")
        for tc in (["tc", "-n", node.netns], ["tc"]):
            dev = NODE_DEVICE if len(tc) == 3 else node.host_veth
            _run([*tc, "qdisc", "del", "dev", dev, "root"], check=False)
            chain = []
            if netem:
                netem_args = ["netem", "limit", "100000"]
                if shape.delay_s:
                    netem_args += ["delay", f"{shape.delay_s * 1e6:.0f}us"]
                if shape.loss_ratio:
                    netem_args += ["loss", f"{shape.loss_ratio * 100:g}%"]
                _run([*tc, "qdisc", "add", "dev", dev, "root", "handle", "1:", *netem_args])
                chain.append("netem")
            if shape.rate_bps:
                parent = ["parent", "1:1"] if netem else ["root"]
                _run([*tc, "qdisc", "add", "dev", dev, *parent, "handle", "10:",
                      *_tbf_args(shape.rate_bps)])
                chain.append("tbf")
            result.qdisc = "+".join(chain) or "none"
        self.shapes[node.name] = result
        return result

    def link_counters(self, node: Node) -> LinkCounters:
        """The node's link counters, read from the bridge port (``/sys/class/net``)."""
        stats = Path(f"/sys/class/net/{node.host_veth}/statistics")

        def read(name: str) -> int:
            return int((stats / name).read_text())

        # The bridge port receives what the node transmits, and vice versa.
        return LinkCounters(tx_bytes=read("rx_bytes"), rx_bytes=read("tx_bytes"),
                            tx_packets=read("rx_packets"), rx_packets=read("tx_packets"),
                            dropped=read("rx_dropped") + read("tx_dropped"))

    def exists(self) -> dict[str, bool]:
        """Whether each created object is still present (for tests of the teardown)."""
        present = set(_netns_names())
        links = {link.get("ifname") for link in _links()}
        found = {self.bridge: self.bridge in links}
        for node in self.nodes:
            found[node.netns] = node.netns in present
            found[f"{node.host_veth} (veth)"] = node.host_veth in links
        return found


def _disable_ipv6(device: str) -> None:
    # No router solicitations or DAD on our links: their counters then carry only the traffic
    # the job and the monitoring make.
    path = Path(f"/proc/sys/net/ipv6/conf/{device}/disable_ipv6")
    if path.exists():
        with contextlib.suppress(OSError):
            path.write_text("1")
