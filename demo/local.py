"""``laggard demo``: train a small language model on W local ranks, slow one, and name it.

Starts a node agent (``laggard agent``) on free loopback ports, launches the training job with
PyTorch's own launcher (``python -m torch.distributed.run --standalone``), one process per rank
running :mod:`laggard.demo.worker` on the gloo backend, shows rank 0's progress,
and ends with a report: per-rank medians, the straggler finding, communication per step, loss,
and the agent's metrics URL. ``--report PATH`` writes the same as JSON.

Every process it starts (agent, launcher, ranks) is stopped on exit, on Ctrl-C and on SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import urllib.request
from pathlib import Path
from typing import Any

#: Seconds to wait for the agent's /metrics to answer after starting it.
AGENT_START_TIMEOUT = 15.0
#: Seconds between SIGTERM and SIGKILL when stopping a child process.
STOP_GRACE = 5.0
#: Columns of the per-window medians the worker reports (laggard.integrations.monitor).
_COMPUTE, _DATA, _WAIT, _STEP, _COLLECTIVE, _BYTES = 0, 1, 2, 4, 5, 6
#: ``laggard.integrations.compression.COMPRESSORS`` (not imported: that imports torch).
COMPRESSION_CHOICES = ("none", "fp16", "sign", "topk", "powersgd", "onebit_adam")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``laggard demo``."""
    parser.add_argument("--world-size", type=int, default=4, metavar="W",
                        help="ranks to launch on this machine (default: 4)")
    parser.add_argument("--steps", type=int, default=600,
                        help="training steps (default: 600)")
    parser.add_argument("--slow-rank", type=int, default=None, metavar="R",
                        help="rank to slow down (default: W // 2)")
    parser.add_argument("--slowdown", type=float, default=1.25,
                        help="factor applied to the slow rank's forward+backward time; 1.0 "
                             "injects nothing (default: 1.25)")
    parser.add_argument("--slow-from", type=int, default=None, metavar="S",
                        help="first slowed step (default: a third of --steps)")
    parser.add_argument("--window", type=int, default=20, metavar="K",
                        help="steps per detection window (default: 20)")
    parser.add_argument("--seed", type=int, default=0, help="model and data seed (default: 0)")
    parser.add_argument("--report", metavar="PATH", help="also write the report as JSON")
    parser.add_argument("--metrics-address", default="127.0.0.1:0", metavar="HOST:PORT",
                        help="where the demo's agent serves /metrics (default: a free "
                             "loopback port)")
    parser.add_argument("--intake-address", default="127.0.0.1:0", metavar="HOST:PORT",
                        help="UDP address of the demo's agent intake (default: a free "
                             "loopback port)")
    parser.add_argument("--compression", default="none", choices=COMPRESSION_CHOICES,
                        help="gradient compression in the DDP communication hook: none (the "
                             "timed fp32 all-reduce), fp16, sign (1-bit, error feedback), topk "
                             "(1%%, error feedback), powersgd (rank 4), onebit_adam (1-bit "
                             "Adam: AdamW for 100 steps, then the momentum compressed to 1 bit) "
                             "(default: none)")
    parser.add_argument("--inject-bitflip", default="", metavar="SPEC",
                        help="flip one bit and watch the gradient-integrity checks name the rank: "
                             "rank=R,step=S,bucket=B,element=E,bit=N,where=W with W in "
                             "before_send, after_reduce, param (e.g. rank=1,step=30,bucket=0,"
                             "element=100,bit=30,where=after_reduce)")


def run(args: argparse.Namespace) -> int:
    """Run the demo; returns the exit status (0 ok, 1 failed, 2 bad flags, 128+N on signal N)."""
    if args.slow_from is None:
        args.slow_from = args.steps // 3
    error = _check_args(args)
    if error:
        print(f"laggard demo: {error}", file=sys.stderr)
        return 2
    if args.slow_rank is None:
        args.slow_rank = args.world_size // 2
    try:
        metrics_address = _with_free_port(args.metrics_address, socket.SOCK_STREAM)
        intake_address = _with_free_port(args.intake_address, socket.SOCK_DGRAM)
    except (OSError, ValueError) as exc:
        print(f"laggard demo: {exc}", file=sys.stderr)
        return 2
    children = _Children()
    previous = {s: signal.signal(s, _raise_stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with tempfile.TemporaryDirectory(prefix="laggard-demo-") as tmp:
            return _run(args, metrics_address, intake_address, Path(tmp), children)
    except _Stop as stop:
        print(f"\nlaggard demo: {signal.Signals(stop.signum).name}, stopping everything",
              file=sys.stderr)
        return 128 + stop.signum
    finally:
        # Ignore further signals while stopping, so a second Ctrl-C cannot orphan a rank.
        for s in previous:
            signal.signal(s, signal.SIG_IGN)
        children.stop_all()
        for s, handler in previous.items():
            signal.signal(s, handler)


def _run(args: argparse.Namespace, metrics_address: str, intake_address: str, tmp: Path,
         children: _Children) -> int:
    metrics_url = f"http://{metrics_address}/metrics"
    agent_log = tmp / "agent.log"
    agent = children.start(
        [sys.executable, "-m", "laggard.cli", "agent",
         "--web.listen-address", metrics_address, "--intake-address", intake_address,
         "--collect-interval", "0.5"],
        stdout=agent_log.open("w"), stderr=subprocess.STDOUT,
    )
    if not _wait_for_agent(metrics_url, agent):
        print(f"laggard demo: the agent did not start:\n{agent_log.read_text()[-2000:]}",
              file=sys.stderr)
        return 1
    injected = (f"rank {args.slow_rank} slowed {args.slowdown:g}x from step {args.slow_from}"
                if args.slowdown > 1.0 else "no rank slowed")
    print(f"laggard demo: {args.world_size} ranks, {args.steps} steps, {injected}; "
          f"agent metrics at {metrics_url}", flush=True)
    result_path = tmp / "result.json"
    launcher = children.start(
        [sys.executable, "-m", "torch.distributed.run", "--standalone",
         "--nproc_per_node", str(args.world_size),
         "-m", "laggard.demo.worker",
         "--steps", str(args.steps), "--window", str(args.window),
         "--slow-rank", str(args.slow_rank), "--slowdown", str(args.slowdown),
         "--slow-from", str(args.slow_from), "--seed", str(args.seed),
         "--intake-address", intake_address, "--result", str(result_path),
         "--compression", args.compression, "--inject-bitflip", args.inject_bitflip],
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"},
        stderr=subprocess.PIPE,
    )
    stderr_pump = children.forward_stderr(launcher)
    status = launcher.wait()
    stderr_pump.join(timeout=5)  # the launcher's last lines (a rank's error) before the report
    if not result_path.exists():
        print(f"laggard demo: training failed (launcher exit status {status})", file=sys.stderr)
        return 1
    if status != 0:
        # Rank 0 writes the result only after a barrier that every rank reaches after its
        # last step: the run is complete, and a rank failed while exiting.
        print(f"laggard demo: note: a rank failed while exiting after the run completed "
              f"(launcher exit status {status}); the results are complete", file=sys.stderr)
    result = json.loads(result_path.read_text())
    agent_ranks = _ranks_seen_by_agent(metrics_url)
    report = build_report(result, args, metrics_url)
    print(format_report(report, agent_ranks))
    if args.report:
        try:
            Path(args.report).write_text(json.dumps(report, indent=2) + "\n")
        except OSError as exc:
            print(f"laggard demo: cannot write report: {exc}", file=sys.stderr)
            return 1
    return 0


# --------------------------------------------------------------------------------- report
def build_report(result: dict[str, Any], args: argparse.Namespace,
                 metrics_url: str) -> dict[str, Any]:
    """The demo's report from rank 0's result (see ``demo_worker.train``).

    Per-rank values are medians over the detection windows that lie wholly after ``slow_from``
    (all windows when none does) of each window's per-rank median.

    Returns:
        A JSON-serialisable dict: ``world_size``, ``steps``, ``injected``, ``findings``,
        ``ranks``, ``loss``, ``metrics_url``, and ``comm`` (job medians per step: ``bytes``
        sent per rank, ``collective_seconds``, ``exposed_seconds``, ``hidden_seconds``).
    """
    windows = result["windows"]
    after = [w for w in windows if w["step"] - args.window + 1 >= args.slow_from]
    chosen = after or windows
    ranks = []
    for rank in range(result["world_size"]):
        def median(column: int, rank: int = rank) -> float | None:
            return _median([w["medians"][rank][column] for w in chosen])

        ranks.append({
            "rank": rank,
            "compute_seconds_median": median(_COMPUTE),
            "collective_wait_seconds_median": median(_WAIT),
            "data_seconds_median": median(_DATA),
            "step_seconds_median": median(_STEP),
            "collective_seconds_median": median(_COLLECTIVE),
            "comm_bytes_median": median(_BYTES),
        })
    collective = _median([r["collective_seconds_median"] for r in ranks])
    comm_bytes = _median([r["comm_bytes_median"] for r in ranks])
    fp32_bytes = result.get("fp32_allreduce_bytes")
    exposed = _median([r["collective_wait_seconds_median"] for r in ranks])
    findings = [
        {key: f.get(key) for key in
         ("detector", "kind", "rank", "step", "severity", "evidence", "message")}
        for f in result["findings"]
    ]
    return {
        "world_size": result["world_size"],
        "steps": result["steps"],
        "injected": {"rank": args.slow_rank, "slowdown": args.slowdown,
                     "from_step": args.slow_from},
        "findings": findings,
        "ranks": ranks,
        "loss": result["loss"],
        "metrics_url": metrics_url,
        "comm": {
            "hook": args.compression,
            "bytes": comm_bytes,
            "fp32_allreduce_bytes": fp32_bytes,
            "compression_ratio": fp32_bytes / comm_bytes if fp32_bytes and comm_bytes else None,
            "collective_seconds": collective,
            "exposed_seconds": exposed,
            "hidden_seconds": (None if collective is None or exposed is None
                               else max(0.0, collective - exposed)),
        },
        "table_from_step": chosen[0]["step"] - args.window + 1 if chosen else 0,
        # findings that ended during the run (the detector's "cleared" findings)
        "cleared": [{"detector": f.get("detector"), "kind": f.get("kind"),
                     "rank": f.get("rank"), "step": f.get("step")}
                    for f in result.get("cleared", [])],
    }


def format_report(report: dict[str, Any], agent_ranks: list[int] | None = None) -> str:
    """The report as text for a terminal."""
    lines = ["", f"per-rank medians from step {report['table_from_step']} (ms; compute and data "
                 "in each rank's thread CPU time, the rest wall time)",
             f"{'rank':>4}  {'compute':>8}  {'collective wait':>15}  {'data':>6}  {'step':>7}"]
    for r in report["ranks"]:
        lines.append(f"{r['rank']:>4}  {_ms(r['compute_seconds_median']):>8}  "
                     f"{_ms(r['collective_wait_seconds_median']):>15}  "
                     f"{_ms(r['data_seconds_median']):>6}  {_ms(r['step_seconds_median']):>7}")
    stragglers = [f for f in report["findings"] if f["rank"] is not None]
    others = [f for f in report["findings"] if f["rank"] is None]
    lines.append("")
    if not any(f.get("detector", "straggler") == "straggler" for f in stragglers):
        lines.append("straggler: none found")
    for f in stragglers:  # integrity findings (--inject-bitflip) carry their own detector name
        lines.append(f"{f.get('detector') or 'straggler'}: rank {f['rank']} ({f['kind']}), "
                     f"first flagged at step {f['step']}")
        lines.append(f"  {f['message']}")
        lines.append("  evidence: " + ", ".join(f"{k}={v}" for k, v in f["evidence"].items()))
        ended = [c["step"] for c in report.get("cleared", [])
                 if (c["rank"], c["kind"]) == (f["rank"], f["kind"])
                 and c["step"] is not None and c["step"] > f["step"]]
        if ended:
            lines.append(f"  cleared at step {ended[0]} (below threshold for a few windows)")
    for f in others:
        lines.append(f"also: {f['message']} (step {f['step']})")
    comm = report["comm"]
    if comm["bytes"]:
        lines.append(
            f"communication per step ({comm['hook']}): {comm['bytes'] / 1e6:.3f} MB sent per "
            f"rank{_ratio(comm.get('compression_ratio'))}, "
            f"{_ms(comm['collective_seconds'])} ms in collectives, "
            f"{_ms(comm['exposed_seconds'])} ms exposed, {_ms(comm['hidden_seconds'])} ms "
            "hidden behind backward")
    loss = report["loss"]
    lines.append(f"loss (mean over ranks; progress lines show rank 0's): {_num(loss['first'])} "
                 f"at the first step, {_num(loss['last'])} at the last")
    seen = ("" if agent_ranks is None else
            f" (it received step records from ranks {_ranges(agent_ranks)})" if agent_ranks
            else " (it received no step records)")
    lines.append(f"metrics: {report['metrics_url']}{seen}; the agent stops with the demo")
    injected = report["injected"]
    if injected["slowdown"] > 1.0:
        named = any(f["rank"] == injected["rank"] for f in stragglers)
        lines.append(f"injected: rank {injected['rank']} x{injected['slowdown']:g} from step "
                     f"{injected['from_step']}: " + ("found" if named else "NOT found"))
    return "\n".join(lines)


# ------------------------------------------------------------------------------ processes
class _Stop(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _raise_stop(signum: int, frame: object) -> None:
    raise _Stop(signum)


class _Children:
    """The processes the demo started; each in its own session, stopped by process id."""

    def __init__(self) -> None:
        self._procs: list[subprocess.Popen[bytes]] = []
        self._stopping = threading.Event()

    def start(self, cmd: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        # Own session: a terminal's Ctrl-C reaches only the demo, which then stops the
        # children in order (launcher first, so it does not restart ranks).
        proc = subprocess.Popen(cmd, start_new_session=True, **kwargs)
        self._procs.append(proc)
        return proc

    def forward_stderr(self, proc: subprocess.Popen[bytes]) -> threading.Thread:
        """Copy ``proc``'s stderr to ours until the demo stops it.

        Once the demo is stopping (Ctrl-C, SIGTERM), the launcher's tracebacks about the signal
        it was sent say nothing the demo has not said already, so they are dropped.
        """

        def pump() -> None:
            assert proc.stderr is not None
            for line in iter(proc.stderr.readline, b""):
                if not self._stopping.is_set():
                    sys.stderr.buffer.write(line)
                    sys.stderr.flush()

        thread = threading.Thread(target=pump, name="laggard-demo-stderr", daemon=True)
        thread.start()
        return thread

    def stop_all(self) -> None:
        """SIGTERM every child and its descendants, SIGKILL what is left after a grace."""
        self._stopping.set()
        for proc in reversed(self._procs):  # the launcher before the agent
            if proc.poll() is not None:
                continue
            descendants = _descendants(proc.pid)
            _signal_tree(proc.pid, descendants, signal.SIGTERM)
            try:
                proc.wait(timeout=STOP_GRACE)
            except subprocess.TimeoutExpired:
                pass
            _signal_tree(proc.pid, descendants, signal.SIGKILL)
            proc.wait()


def _descendants(pid: int) -> list[int]:
    import psutil

    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def _signal_tree(pid: int, descendants: list[int], signum: int) -> None:
    # The launcher starts each rank in a session of its own: signal its process group too, in
    # case a rank started helpers.
    for target in [pid, *descendants]:
        for kill in (os.killpg, os.kill):
            try:
                kill(target, signum)
            except (ProcessLookupError, PermissionError):
                pass


# --------------------------------------------------------------------------------- helpers
def _check_args(args: argparse.Namespace) -> str | None:
    if args.world_size < 1:
        return "--world-size must be at least 1"
    if args.slow_rank is not None and not 0 <= args.slow_rank < args.world_size:
        return f"--slow-rank must be in [0, {args.world_size - 1}]"
    if not math.isfinite(args.slowdown) or args.slowdown < 1.0:
        return "--slowdown must be a number >= 1.0"
    if args.window < 2:
        return "--window must be at least 2"
    if args.steps < args.window:
        return "--steps must be at least --window"
    if not 0 <= args.slow_from < args.steps:
        return "--slow-from must be in [0, --steps)"
    if args.inject_bitflip:
        from laggard.integrations.faults import BitFlipInjector

        try:
            flip = BitFlipInjector.parse(args.inject_bitflip)
        except ValueError as exc:
            return f"--inject-bitflip: {exc}"
        if flip.rank >= args.world_size or flip.step >= args.steps:
            return "--inject-bitflip: rank and step must lie inside the run"
    if args.world_size < 3:
        print("laggard demo: note: naming a straggler needs at least 3 ranks", file=sys.stderr)
    return None


def _with_free_port(address: str, kind: int) -> str:
    """``host:port``, with port 0 replaced by one that is free now."""
    from laggard.demo.harness import free_port
    from laggard.wire import parse_address

    host, port = parse_address(address)
    if port == 0:
        port = free_port(kind, host)
    return f"{host}:{port}"


def _wait_for_agent(url: str, agent: subprocess.Popen[bytes]) -> bool:
    from laggard.demo.harness import NotReadyError, wait_until_ready

    try:
        wait_until_ready(url, timeout=AGENT_START_TIMEOUT, what="agent", procs=[agent])
    except NotReadyError:
        return False
    return True


def _ranks_seen_by_agent(url: str) -> list[int] | None:
    """Ranks with ``laggard_steps_total`` on the agent, or None when it cannot be scraped."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return None
    ranks = set()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "laggard_steps_total" and sample.value > 0:
                ranks.add(int(sample.labels["rank"]))
    return sorted(ranks)


def _median(values: list[float | None]) -> float | None:
    finite = sorted(v for v in values if v is not None and math.isfinite(v))
    if not finite:
        return None
    mid = len(finite) // 2
    return finite[mid] if len(finite) % 2 else (finite[mid - 1] + finite[mid]) / 2


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{1e3 * seconds:.1f}"


def _ratio(ratio: float | None) -> str:
    if ratio is None or abs(ratio - 1) < 0.05:  # no compression: nothing to compare
        return ""
    return f", {ratio:.1f}x less than an fp32 all-reduce"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _ranges(ranks: list[int]) -> str:
    if ranks == list(range(ranks[0], ranks[-1] + 1)) and len(ranks) > 2:
        return f"{ranks[0]}-{ranks[-1]}"
    return ", ".join(map(str, ranks))
