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
import time
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from laggard.demo.hang import (
    CheckpointInjection,
    HangInjection,
    format_hang,
    hang_outcome,
    read_json_lines,
)
from laggard.demo.injections import (
    SHAPE_INJECTIONS,
    Injection,
    NodePlacement,
    TokensInjection,
    describe,
    parse_injection,
    parse_slow_ranks,
)
from laggard.demo.report import build_report, format_report, percent, summary_lines
from laggard.detectors.straggler import MIN_RANKS

#: Seconds to wait for the agent's /metrics to answer after starting it.
AGENT_START_TIMEOUT = 15.0
#: Seconds between SIGTERM and SIGKILL when stopping a child process.
STOP_GRACE = 5.0
#: The fewest ranks the demo runs: the fewest the straggler detector compares.
MIN_WORLD_SIZE = MIN_RANKS
#: Seconds between two reads of the hang marker and rank 0's hang reports while the job runs.
HANG_POLL_SECONDS = 0.2


def run(args: argparse.Namespace) -> int:
    """Run the demo; returns the exit status (0 ok, 1 failed, 2 bad flags, 128+N on signal N)."""
    if args.slow_from is None:
        args.slow_from = args.steps // 3
    if args.slowdown is None:
        args.slowdown = 1.0 if args.inject else 1.25
    error = _check_args(args)
    if error:
        print(f"laggard demo: {error}", file=sys.stderr)
        return 2
    # one rank or several (--slow-rank 1,3): a list from here on, the first one the report's
    # "rank"
    args.slow_rank = (parse_slow_ranks(args.slow_rank) if args.slow_rank is not None
                      else [args.world_size // 2])
    try:
        metrics_address = args.use_agent or _with_free_port(args.metrics_address,
                                                            socket.SOCK_STREAM)
        intake_address = _with_free_port(args.intake_address, socket.SOCK_DGRAM)
    except (OSError, ValueError) as exc:
        print(f"laggard demo: {exc}", file=sys.stderr)
        return 2
    children = _Children()
    previous = {s: signal.signal(s, _raise_stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with tempfile.TemporaryDirectory(prefix="laggard-demo-") as tmp:
            try:
                return _run(args, metrics_address, intake_address, Path(tmp), children)
            finally:
                # Every child stopped before the directory they write into is removed (a rank
                # still writing made the removal fail with ENOTEMPTY after a Ctrl-C).
                _stop_children(children, previous)
    except _Stop as stop:
        print(f"\nlaggard demo: {signal.Signals(stop.signum).name}, stopping everything",
              file=sys.stderr)
        return 128 + stop.signum
    finally:
        _stop_children(children, previous)
        for s, handler in previous.items():
            signal.signal(s, handler)


def _stop_children(children: _Children, signals: Iterable[int]) -> None:
    """Stop every child, ignoring further ``signals`` meanwhile so a second Ctrl-C cannot
    orphan a rank (they stay ignored: the caller restores its handlers)."""
    for s in signals:
        signal.signal(s, signal.SIG_IGN)
    children.stop_all()


def fake_gpu_scenario(args: argparse.Namespace) -> str:
    """The fake GPUs' scenario for ``--fake-gpus`` / ``--throttle-slow-gpu`` ("" for none):
    one fake GPU per rank, rank r on GPU r (torchrun's local rank on this one node)."""
    if args.throttle_slow_gpu:
        return f"throttle:{_slow_ranks(args)[0]}:{args.throttle_slow_gpu}"
    return "steady" if args.fake_gpus else ""


def _run(args: argparse.Namespace, metrics_address: str, intake_address: str, tmp: Path,
         children: _Children) -> int:
    metrics_url = f"http://{metrics_address}/metrics"
    agent_log = tmp / "agent.log"
    scenario = fake_gpu_scenario(args)
    fake_gpus = (["--collector.nvml.fake-gpus", str(args.world_size),
                  "--collector.nvml.fake-gpus-scenario", scenario] if scenario else [])
    agent = None if args.use_agent else children.start(
        [sys.executable, "-m", "laggard.cli", "agent",
         "--web.listen-address", metrics_address, "--intake.address", intake_address,
         # the demo's ranks send to this agent's UDP port: it leaves the node's default
         # socket (/run/laggard/intake.sock) to the node's own agent
         "--intake.socket", "", "--collector.interval", "0.5", *fake_gpus],
        stdout=agent_log.open("w"), stderr=subprocess.STDOUT,
    )
    if not _wait_for_agent(metrics_url, agent):
        log = agent_log.read_text()[-2000:] if agent is not None else ""
        print(f"laggard demo: the agent did not start:\n{log}" if agent is not None else
              f"laggard demo: no agent answers at {metrics_url}", file=sys.stderr)
        return 1
    slow = _slow_ranks(args)
    injected = (f"rank{'s' if len(slow) > 1 else ''} {', '.join(map(str, slow))} slowed "
                f"{percent(args.slowdown - 1)} (--slowdown {args.slowdown:g}) from step "
                f"{args.slow_from}" if args.slowdown > 1.0 else "no rank slowed")
    injected += "".join(f"; {describe(i, args.parallel)}" for i in _injections(args))
    layout = (f" (2 pipeline stages x {args.world_size // 2} data-parallel ranks)"
              if args.parallel == "pp" else "")
    if args.parallel == "pp" and args.world_size < 6 and any(
            isinstance(i, TokensInjection) for i in _injections(args)):
        print("laggard demo: note: the longer sequences go through rank "
              f"{next(i.rank for i in _injections(args) if isinstance(i, TokensInjection))}'s "
              "whole pipeline, half of each 2-rank stage: no rank can stand out of its stage's "
              "median; --world-size 6 (3 ranks per stage) names them", file=sys.stderr)
    print(f"laggard demo: {args.world_size} ranks{layout}, {args.steps} steps, {injected}; "
          f"agent metrics at {metrics_url}", flush=True)
    if getattr(args, "nodes", 0):
        print(f"laggard demo: {_placement_line(args)}", flush=True)
    result_path = tmp / "result.json"
    windows_path = Path(args.windows) if args.windows else tmp / "windows.jsonl"
    if windows_path.is_file():
        windows_path.unlink()  # the monitor appends; a device or pipe (/dev/full) is left be
    launcher = children.start(
        [sys.executable, "-m", "torch.distributed.run", "--standalone",
         "--nproc_per_node", str(args.world_size),
         "-m", "laggard.demo.worker",
         "--steps", str(args.steps), "--window", str(args.window),
         "--slow-rank", ",".join(map(str, _slow_ranks(args))), "--slowdown", str(args.slowdown),
         "--slow-from", str(args.slow_from), "--seed", str(args.seed),
         "--nodes", str(getattr(args, "nodes", 0)),
         "--intake-address", intake_address, "--result", str(result_path),
         "--compression", args.compression, "--inject-bitflip", args.inject_bitflip,
         "--windows", str(windows_path),
         "--parallel", args.parallel, *([] if args.prefetch else ["--no-prefetch"]),
         *(["--run-id", args.run] if args.run else []),
         *(["--gpu-state"] if scenario else []),
         "--device", getattr(args, "device", "cpu"),
         *_injection_flags(args, tmp)],
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
             # the launcher's own temporary files (torchelastic_*) inside the demo's, which is
             # removed however the job ends (a hung job is killed, and leaves them otherwise)
             "TMPDIR": str(_job_tmp(tmp)),
             # the demo/test hook of laggard.integrations.gpu_state: the ranks' NVML is the
             # same fake the agent plays
             **({"LAGGARD_FAKE_NVML": f"{args.world_size}:{scenario}"} if scenario else {})},
        stderr=subprocess.PIPE,
    )
    stderr_pump = children.forward_stderr(launcher)
    watch = _watch_job(launcher, args, tmp, children)
    status = launcher.wait()
    stderr_pump.join(timeout=5)  # the launcher's last lines (a rank's error) before the report
    hang = _hang_of(args)
    if hang is not None:
        return _report_hang(args, hang, watch)
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
    report["hang"] = hang_outcome(None, None, watch.reports, args.hang_bound,
                                  checked=watch.checked)
    print(format_report(report, agent_ranks))
    print(format_hang(report["hang"]))
    status = _write_outputs(args, report, windows_path)
    if args.windows and report["windows_file"]["unsaved"]:
        status = 1  # an output asked for was not (wholly) written; the run itself completed
    if args.keep_agent:
        try:
            _wait_for_user(metrics_url)
        except _Stop:
            pass  # the awaited way to end a kept agent: the run itself succeeded
    elif not args.use_agent:
        print("the agent stopped with the demo (--keep-agent keeps /metrics up)")
    return status


def _write_outputs(args: argparse.Namespace, report: dict[str, Any], windows: Path) -> int:
    """``--report`` (JSON) and ``--html`` (the run report page); 1 if one cannot be written."""
    status = 0
    if args.report:
        try:
            Path(args.report).write_text(json.dumps(report, indent=2) + "\n")
        except OSError as exc:
            print(f"laggard demo: cannot write report: {exc}", file=sys.stderr)
            status = 1
    if args.html:
        from laggard.analyze.run_report import write_report

        saved = report["windows_file"]
        if saved["unsaved"] >= saved["windows"] > 0:
            print("laggard demo: cannot write the HTML report: no window was saved (above)",
                  file=sys.stderr)
            return 1
        try:
            size = write_report(windows, Path(args.html), title="laggard demo run report",
                                summary=summary_lines(report))
            print(f"run report: {args.html} ({size / 1e3:.0f} kB; open it in a browser)")
        except (OSError, ValueError, ImportError) as exc:
            print(f"laggard demo: cannot write the HTML report: {exc}", file=sys.stderr)
            status = 1
    return status


def _wait_for_user(metrics_url: str) -> None:
    """Keep the agent up until Enter in a terminal (or Ctrl-C / SIGTERM, which the caller
    handles; without a terminal, only those)."""
    base = metrics_url.rsplit("/", 1)[0]
    how = ("press Enter (or Ctrl-C) to stop it" if sys.stdin is not None and sys.stdin.isatty()
           else "Ctrl-C or SIGTERM stops it")
    print(f"the agent is still up: {metrics_url} and {base}/findings; {how}", flush=True)
    try:
        if sys.stdin is not None and sys.stdin.isatty():
            sys.stdin.readline()
        else:
            threading.Event().wait()  # no terminal: until a signal
    except (OSError, ValueError):
        pass


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
        for proc in reversed(self._procs):  # the launcher before the agent
            self.stop(proc)

    def stop(self, proc: subprocess.Popen[bytes]) -> None:
        """SIGTERM ``proc`` and its descendants, SIGKILL what is left after a grace; from now
        on its complaints about being stopped are not forwarded."""
        from laggard.demo.harness import process_tree, signal_tree

        self._stopping.set()
        if proc.poll() is not None:
            return
        descendants = process_tree(proc.pid)
        signal_tree(proc.pid, descendants, signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_GRACE)
        except subprocess.TimeoutExpired:
            pass
        signal_tree(proc.pid, descendants, signal.SIGKILL)
        proc.wait()


# ------------------------------------------------------------------------------ hangs
@dataclass(slots=True)
class _Watch:
    """What the demo saw of the job's hangs while it ran.

    Attributes:
        marker: what the hanging rank wrote when it hung, or None.
        reports: rank 0's hang reports (JSON lines of ``HangReportWriter``).
        checked: rank 0's monitor reports hangs (it made the report file).
        stopped: why the demo stopped the job (``named``, ``bound``), "" when it ended itself.
    """

    marker: dict[str, Any] | None = None
    reports: list[dict[str, Any]] = field(default_factory=list)
    checked: bool = False
    stopped: str = ""


def _injections(args: argparse.Namespace) -> list[Injection]:
    return [parse_injection(spec) for spec in args.inject]


def _hang_of(args: argparse.Namespace) -> HangInjection | None:
    return next((i for i in _injections(args) if isinstance(i, HangInjection)), None)


def _job_tmp(tmp: Path) -> Path:
    path = tmp / "job-tmp"
    path.mkdir(exist_ok=True)
    return path


def _injection_flags(args: argparse.Namespace, tmp: Path) -> list[str]:
    """The worker's flags for ``--inject``, and where it says a hang began and was named."""
    flags = ["--hang-marker", str(tmp / "hang-marker.json"),
             "--hang-report", str(tmp / "hang-reports.jsonl")]
    for injection in _injections(args):
        flag = ("--inject-hang" if isinstance(injection, HangInjection) else
                "--inject-checkpoint" if isinstance(injection, CheckpointInjection) else
                "--inject-cause")
        flags += [flag, injection.spec()]
    return flags


def _watch_job(launcher: subprocess.Popen[bytes], args: argparse.Namespace, tmp: Path,
               children: _Children) -> _Watch:
    """Wait for the job to end; with an injected hang, stop it once rank 0 names a hang after
    it began, or once ``--hang-bound`` seconds have passed since then without a name."""
    hang = _hang_of(args)
    marker_path, reports_path = tmp / "hang-marker.json", tmp / "hang-reports.jsonl"
    watch = _Watch()
    while launcher.poll() is None:
        time.sleep(HANG_POLL_SECONDS)
        watch.checked = watch.checked or reports_path.exists()
        if hang is None:
            continue
        if watch.marker is None and marker_path.exists():
            try:
                watch.marker = json.loads(marker_path.read_text())
            except (OSError, ValueError):
                continue  # being replaced: read it next time
        if watch.marker is None:
            continue
        began = watch.marker["time"]
        if any(r["time"] >= began for r in read_json_lines(reports_path)):
            watch.stopped = "named"
        elif time.time() > began + args.hang_bound:
            watch.stopped = "bound"
        else:
            continue
        children.stop(launcher)
        break
    watch.checked = watch.checked or reports_path.exists()
    watch.reports = read_json_lines(reports_path)
    return watch


def _report_hang(args: argparse.Namespace, hang: HangInjection, watch: _Watch) -> int:
    """The report of a run with an injected hang; 0 when rank 0 named it rightly in time."""
    outcome = hang_outcome(hang, watch.marker, watch.reports, args.hang_bound,
                           checked=watch.checked)
    outcome["stopped"] = watch.stopped
    print(format_hang(outcome))
    if watch.stopped:
        why = "the hang named" if watch.stopped == "named" else "not named in time"
        print(f"the demo stopped the job ({why}) instead of waiting for gloo's timeout")
    status = 0 if outcome["correct"] else 1
    if args.report:
        doc = {"world_size": args.world_size, "steps": args.steps, "device": args.device,
               "parallel": args.parallel, "hang": outcome}
        try:
            Path(args.report).write_text(json.dumps(doc, indent=2) + "\n")
        except OSError as exc:
            print(f"laggard demo: cannot write report: {exc}", file=sys.stderr)
            status = 1
    return status


# --------------------------------------------------------------------------------- helpers
def _check_args(args: argparse.Namespace) -> str | None:
    if args.world_size < MIN_WORLD_SIZE:
        # Refused up front: with 2 ranks the median is the mean of both, so neither can stand
        # out, and a run would train for its whole length to end "NOT found".
        return (f"--world-size must be at least {MIN_WORLD_SIZE}: the straggler detector "
                f"names a rank only against the median of at least {MIN_WORLD_SIZE} ranks")
    if args.parallel == "pp" and args.world_size % 2:
        return (f"--parallel pp runs 2 pipeline stages x W/2 data-parallel ranks: --world-size "
                f"must be even (got {args.world_size})")
    if args.slow_rank is not None:
        try:
            slow = parse_slow_ranks(args.slow_rank)
        except ValueError as exc:
            return str(exc)
        if not all(0 <= r < args.world_size for r in slow):
            return f"--slow-rank must be in [0, {args.world_size - 1}]"
    error = NodePlacement(args.world_size, getattr(args, "nodes", 0)).check()
    if error:
        return error
    if args.slowdown is not None and (not math.isfinite(args.slowdown) or args.slowdown < 1.0):
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
    error = _check_injections(args)
    if error:
        return error
    if args.use_agent and args.intake_address.endswith(":0"):
        return "--use-agent: give the running agent's --intake-address HOST:PORT too"
    if args.use_agent and (args.fake_gpus or args.throttle_slow_gpu):
        return "--fake-gpus and --throttle-slow-gpu start their own agent: drop --use-agent"
    if args.parallel != "ddp" and (args.compression != "none" or args.inject_bitflip):
        return "--compression and --inject-bitflip are DDP communication hooks: use --parallel ddp"
    emulated = getattr(args, "device", "cpu") == "emulated-async"
    if emulated and args.parallel == "pp":
        return "--parallel pp runs on --device cpu"
    if emulated and (args.compression != "none" or args.inject_bitflip):
        return ("--device emulated-async runs the plain timed all-reduce only: drop "
                "--compression and --inject-bitflip")
    return None


def _check_injections(args: argparse.Namespace) -> str | None:
    """Why ``--inject`` cannot run in this demo (one line), or None."""
    kinds = []
    for spec in args.inject:
        try:
            injection = parse_injection(spec)
        except ValueError as exc:
            return f"--inject: {exc}"
        # the shapes see the emulated nodes (node=... needs --nodes); the others take no nodes
        nodes = ({"nodes": getattr(args, "nodes", 0)}
                 if isinstance(injection, SHAPE_INJECTIONS) else {})
        error = injection.check(args.world_size, args.steps, device=args.device,
                                parallel=args.parallel, **nodes)
        if error:
            return f"--inject {spec}: {error}"
        kinds.append(type(injection))
    if len(set(kinds)) < len(kinds):
        return ("--inject: one injection of each kind at most (hang, checkpoint, gc, tokens, "
                "stage, stall, burst, node, moving)")
    if not math.isfinite(args.hang_bound) or args.hang_bound <= 0:
        return "--hang-bound must be a positive number of seconds"
    return None


def _slow_ranks(args: argparse.Namespace) -> list[int]:
    """``--slow-rank`` as a list (after :func:`run` has read it)."""
    return parse_slow_ranks(args.slow_rank)


def _placement_line(args: argparse.Namespace) -> str:
    """Which ranks sit on which emulated node (``--nodes``)."""
    placement = NodePlacement(args.world_size, args.nodes)
    return "emulated nodes: " + "; ".join(
        f"{name}: ranks {', '.join(map(str, placement.ranks_of(name)))}"
        for name in placement.names)


def _with_free_port(address: str, kind: int) -> str:
    """``host:port``, with port 0 replaced by one that is free now."""
    from laggard.demo.harness import free_port
    from laggard.wire import parse_address

    host, port = parse_address(address)
    if port == 0:
        port = free_port(kind, host)
    return f"{host}:{port}"


def _wait_for_agent(url: str, agent: subprocess.Popen[bytes] | None) -> bool:
    from laggard.demo.harness import NotReadyError, wait_until_ready

    try:
        wait_until_ready(url, timeout=AGENT_START_TIMEOUT, what="agent",
                         procs=[agent] if agent is not None else [])
    except NotReadyError:
        return False
    return True


def _ranks_seen_by_agent(url: str) -> list[int] | None:
    """Ranks with a step time (``laggard_rank_step_median_seconds``, the default set) on the
    agent, or None when it cannot be scraped."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return None
    ranks = set()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "laggard_rank_step_median_seconds":
                ranks.add(int(sample.labels["rank"]))
    return sorted(ranks)
