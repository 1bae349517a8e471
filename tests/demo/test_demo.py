"""``laggard demo`` end to end: a real agent, PyTorch's launcher, real gloo ranks."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
from support import budget, free_port, scrape

pytest.importorskip("torch")
psutil = pytest.importorskip("psutil")

from laggard.demo import local as demo  # noqa: E402
from laggard.demo.flags import add_arguments  # noqa: E402
from laggard.demo.report import format_report  # noqa: E402

#: Short runs: 3 ranks (the fewest that can outvote one), 10-step windows.
SHORT = ["--world-size", "3", "--window", "10", "--slow-rank", "1"]


def _start(*flags: str, metrics_port: int | None = None) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "laggard.cli", "demo", *flags]
    if metrics_port is not None:
        cmd += ["--metrics-address", f"127.0.0.1:{metrics_port}"]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            stdin=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _per_rank_series(text: str, metric: str) -> set[str]:
    """Ranks that have at least one sample of ``metric`` in an exposition."""
    ranks = set()
    for line in text.splitlines():
        if line.startswith(metric + "{") and 'rank="' in line:
            ranks.add(line.split('rank="', 1)[1].split('"', 1)[0])
    return ranks


@pytest.mark.slow
def test_demo_names_the_slowed_rank_and_the_agent_exports_every_rank(tmp_path):
    report_path = tmp_path / "report.json"
    port = free_port()
    html_path = tmp_path / "report.html"
    proc = _start(*SHORT, "--steps", "200", "--slowdown", "2.0", "--slow-from", "20",
                  "--report", str(report_path), "--html", str(html_path), metrics_port=port)
    scrapes: list[str] = []

    def scrape_during_the_run() -> None:
        # poll until a scrape holds every rank's phase medians, while training still runs
        while proc.poll() is None:
            try:
                text = scrape(f"http://127.0.0.1:{port}/metrics", timeout=2)
            except OSError:
                time.sleep(0.2)
                continue
            if len(_per_rank_series(text, "laggard_rank_phase_median_seconds")) == 3:
                scrapes.append(text)
                return
            time.sleep(0.2)

    scraper = threading.Thread(target=scrape_during_the_run)
    scraper.start()
    out, _ = proc.communicate(timeout=budget(240))
    scraper.join()
    assert proc.returncode == 0, out[-4000:]

    assert scrapes, "no scrape during the run held all three ranks"
    text = scrapes[0]
    # The default series set (issue 34): each rank's window medians, the run's phase histogram.
    for metric in ("laggard_rank_phase_median_seconds", "laggard_rank_step_median_seconds"):
        assert _per_rank_series(text, metric) == {"0", "1", "2"}, metric
    assert 'phase="collective_wait"' in text and 'phase="compute"' in text
    assert "laggard_run_step_phase_seconds_bucket{" in text and 'phase="forward"' in text

    report = json.loads(report_path.read_text())
    assert set(report) >= {"world_size", "steps", "injected", "findings", "ranks", "loss",
                           "metrics_url"}
    injected = report["injected"]
    assert {k: injected[k] for k in ("rank", "slowdown", "from_step")} == {
        "rank": 1, "slowdown": 2.0, "from_step": 20}
    # exact injection: each step's compute doubled, whatever the load (measured, not assumed)
    assert 0.7 < injected["measured_slowdown"] < 1.4
    stragglers = [f for f in report["findings"] if f["rank"] is not None]
    assert [f["rank"] for f in stragglers] == [1], report["findings"]
    finding = stragglers[0]
    assert finding["detector"] == "straggler" and finding["kind"] == "compute"
    assert finding["step"] >= 20 and finding["message"] and finding["evidence"]
    assert {r["rank"] for r in report["ranks"]} == {0, 1, 2}
    slow = report["ranks"][1]
    others = [r for r in report["ranks"] if r["rank"] != 1]
    assert all(slow["compute_seconds_median"] > r["compute_seconds_median"] for r in others)
    assert all(slow["collective_wait_seconds_median"] < r["collective_wait_seconds_median"]
               for r in others)
    assert report["loss"]["last"] < report["loss"]["first"]
    assert report["metrics_url"] == f"http://127.0.0.1:{port}/metrics"
    assert report["comm"]["bytes"] > 0
    assert "straggler: rank 1" in out and "why: its excess added up" in out
    assert "injected: rank 1 100% slower compute from step 20; measured" in out
    assert "; found at step" in out and "evidence:" not in out
    assert "check that GPU's clocks" not in out.split("injected: rank 1")[1]
    assert "the agent stopped with the demo (--keep-agent keeps /metrics up)" in out
    assert 10_000 < html_path.stat().st_size < 2_000_000
    assert "step   100/200" in out  # progress while it ran


@pytest.mark.slow
def test_demo_without_slowdown_names_no_straggler_and_keeps_the_agent_up(tmp_path):
    report_path = tmp_path / "report.json"
    port = free_port()
    proc = _start(*SHORT, "--steps", "120", "--slowdown", "1.0", "--slow-from", "0",
                  "--report", str(report_path), "--keep-agent", metrics_port=port)
    lines = []
    started, ceiling = time.monotonic(), budget(240)
    assert proc.stdout is not None
    for line in proc.stdout:  # the report, then the agent stays up (no terminal: until a signal)
        lines.append(line)
        if line.startswith("the agent is still up"):
            break
        assert time.monotonic() - started < ceiling, "".join(lines)
    out = "".join(lines)
    assert f"http://127.0.0.1:{port}/metrics and http://127.0.0.1:{port}/findings" in out
    assert "laggard_rank_step_median_seconds" in scrape(f"http://127.0.0.1:{port}/metrics",
                                                        timeout=5)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=budget(60))
    assert proc.returncode == 0  # the signal is how a kept agent ends: the run succeeded
    with pytest.raises(OSError):
        scrape(f"http://127.0.0.1:{port}/metrics", timeout=2)
    report = json.loads(report_path.read_text())
    assert [f for f in report["findings"] if f["rank"] is not None] == []
    assert "straggler: none found" in out and "injected: no slowdown; no straggler named" in out


@pytest.mark.slow
def test_ctrl_c_stops_every_process_the_demo_started():
    proc = _start(*SHORT, "--steps", "100000")
    started, ceiling = time.monotonic(), budget(120)
    lines = []
    for line in proc.stdout:  # wait until training is under way
        lines.append(line)
        if line.startswith("step "):
            break
        assert time.monotonic() - started < ceiling, "".join(lines)
    # the agent, the launcher and its 3 ranks (each rank in a session of its own)
    children = psutil.Process(proc.pid).children(recursive=True)
    assert len(children) >= 5, children
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=budget(60))
    assert proc.returncode == 128 + signal.SIGINT, out[-3000:]
    _, alive = psutil.wait_procs(children, timeout=budget(10))
    assert alive == [], alive


def test_bad_flags_get_a_clear_error_and_status_2():
    proc = subprocess.run([sys.executable, "-m", "laggard.cli", "demo",
                           "--world-size", "4", "--slow-rank", "4"],
                          capture_output=True, text=True, timeout=budget(60))
    assert proc.returncode == 2
    assert "--slow-rank must be in [0, 3]" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_a_full_disk_for_the_windows_is_said_once_and_the_run_goes_on(tmp_path):
    proc = _start(*SHORT, "--steps", "60", "--slowdown", "1.0", "--windows", "/dev/full",
                  "--html", str(tmp_path / "r.html"))
    out, _ = proc.communicate(timeout=budget(240))
    assert proc.returncode == 1, out[-3000:]  # an output asked for was not written
    assert out.count("laggard: cannot write the windows file /dev/full: [Errno 28]") == 1, out
    assert ("windows file: no window was saved to /dev/full: [Errno 28] No space left on device "
            "(all 6 windows lost;") in out
    assert "injected: no slowdown; no straggler named" in out  # the run and its report complete
    assert "cannot write the HTML report: no window was saved" in out
    assert not (tmp_path / "r.html").exists()
    assert os.path.exists("/dev/full") and not os.path.isfile("/dev/full")  # left be


@pytest.mark.parametrize("world", ["1", "2"])
def test_fewer_than_three_ranks_are_refused_up_front(world):
    started, ceiling = time.monotonic(), budget(30)
    proc = subprocess.run([sys.executable, "-m", "laggard.cli", "demo", "--world-size", world],
                          capture_output=True, text=True, timeout=budget(60))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert lines == ["laggard demo: --world-size must be at least 3: the straggler detector "
                     "names a rank only against the median of at least 3 ranks"], proc.stderr
    assert proc.stdout == ""  # no agent, no launcher: refused before anything starts
    assert time.monotonic() - started < ceiling


def test_report_from_a_worker_result():
    args = argparse.Namespace(slow_rank=1, slowdown=1.5, slow_from=20, window=10,
                              compression="none")
    nan = None

    def medians(compute: float, wait: float) -> list[float | None]:
        return [compute, 0.001, wait, nan, compute + 0.011, wait + 0.005, 1e6]

    result = {
        "world_size": 3, "steps": 40,
        "loss": {"first": 5.5, "last": 2.1},
        # the CPU clock's seven step columns (the device clock's four are absent)
        "stat_names": ["compute_seconds", "data_seconds", "collective_wait_seconds",
                       "transfer_seconds", "step_seconds", "collective_seconds", "comm_bytes"],
        "windows": [
            {"step": 9, "medians": [medians(0.03, 0.01)] * 3},
            {"step": 19, "medians": [medians(0.03, 0.01)] * 3},
            {"step": 29, "medians": [medians(0.03, 0.02), medians(0.045, 0.001),
                                     medians(0.03, 0.02)]},
            {"step": 39, "medians": [medians(0.03, 0.02), medians(0.047, 0.002),
                                     medians(0.03, 0.02)]},
        ],
        "findings": [{"detector": "straggler", "kind": "compute", "severity": "warning",
                      "message": "rank 1 slow", "rank": 1, "node": "n", "gpu": None,
                      "local_rank": 1, "step": 39, "evidence": {"slowdown": 0.5}}],
        "cleared": [{"detector": "straggler", "kind": "compute", "severity": "warning",
                     "message": "rank 1: compute slowdown cleared", "rank": 1, "step": 59,
                     "cleared": True, "evidence": {"reason": "recovered"}}],
    }
    report = demo.build_report(result, args, "http://127.0.0.1:1/metrics")
    assert set(report["findings"][0]) == {"detector", "kind", "rank", "step", "severity",
                                          "evidence", "message"}
    assert report["table_from_step"] == 20  # windows wholly after the slowdown started
    assert report["ranks"][1]["compute_seconds_median"] == pytest.approx(0.046)
    assert report["ranks"][0]["collective_wait_seconds_median"] == pytest.approx(0.02)
    assert report["comm"]["exposed_seconds"] == pytest.approx(0.02)
    assert report["comm"]["hidden_seconds"] == pytest.approx(0.005)
    assert report["comm"]["bytes"] == 1e6
    text = demo.format_report(report, [0, 1, 2])
    assert "straggler: rank 1 (compute), first flagged at step 39" in text
    assert "cleared at step 59" in text
    assert report["cleared"] == [{"detector": "straggler", "kind": "compute", "rank": 1,
                                  "step": 59}]
    assert ("injected: rank 1 50% slower compute from step 20; measured 53.3% from step 20 on "
            "(the table); found at step 39, after 20 slowed steps") in text
    assert "+53.3%" in next(line for line in text.splitlines() if line.startswith("   1 "))
    assert report["injected"]["measured_slowdown"] == pytest.approx(0.046 / 0.03 - 1)
    assert "why: its excess added up" not in text  # this finding carries no test evidence
    assert "ranks 0-2" in text


def test_a_finding_is_explained_in_one_sentence_with_two_numbers():
    finding = {"detector": "straggler", "kind": "compute", "rank": 2, "step": 259,
               "message": "rank 2: forward+backward 25% slower than the median rank",
               "evidence": {"noise": 0.014, "evidence": 0.09, "wait_deficit": 0.88,
                            "median_work_seconds": 0.0206, "transfer_slowdown": None}}
    report = {"table_from_step": 200, "ranks": [], "findings": [finding], "cleared": [],
              "comm": {"bytes": None}, "loss": {"first": 5.8, "last": 1.5},
              "metrics_url": "http://127.0.0.1:1/metrics",
              "injected": {"rank": 2, "slowdown": 1.25, "from_step": 200,
                           "measured_slowdown": 0.254}}
    text = format_report(report)
    assert ("why: its excess added up window after window to the decision interval, against a "
            "rank-to-rank noise of 1.4% of a step's work; it waits 18.1 ms per step less than "
            "the median rank in the collective") in text
    assert "transfer_slowdown" not in text and "evidence:" not in text
    assert text.endswith("injected: rank 2 25% slower compute from step 200; measured 25.4% from "
                         "step 200 on (the table); found at step 259, after 60 slowed steps")


def _rank(rank: int, compute: float) -> dict[str, Any]:
    return {"rank": rank, "compute_seconds_median": compute, "collective_wait_seconds_median":
            0.01, "data_seconds_median": 0.001, "step_seconds_median": 0.05}


def _report(findings: list[dict[str, Any]], cleared: list[dict[str, Any]],
            windows_file: dict[str, Any] | None = None) -> dict[str, Any]:
    """A default-run report: rank 2 23.2% slower than the others' median from step 200."""
    return {"table_from_step": 200, "findings": findings, "cleared": cleared,
            "ranks": [_rank(0, 0.020), _rank(1, 0.0201), _rank(2, 0.02464), _rank(3, 0.0199)],
            "comm": {"bytes": None}, "loss": {"first": 5.8, "last": 1.5},
            "metrics_url": "http://127.0.0.1:1/metrics", "windows_file": windows_file,
            "injected": {"rank": 2, "slowdown": 1.25, "from_step": 200,
                         "measured_slowdown": 0.02464 / 0.020 - 1}}


#: The detector's compute finding of a default run: 18% over its last 5 windows.
COMPUTE = {"detector": "straggler", "kind": "compute", "rank": 2, "step": 279,
           "message": "rank 2: forward+backward 18% slower than the median rank in its last 5 "
                      "windows (+3.6 ms per step), ...",
           "evidence": {"compute_slowdown": 0.1714, "median_work_seconds": 0.021,
                        "median_compute_seconds": 0.020, "windows": 5, "noise": 0.01,
                        "evidence": 0.2, "decision_interval": 0.19}}
JOB = {"detector": "straggler", "kind": "job_slowdown", "rank": None, "step": 119,
       "message": "whole job 14.0% slower than its best (...), not one rank: ...",
       "evidence": {"slowdown": 0.14}}


def test_each_slowdown_figure_is_said_for_what_it_is():
    text = format_report(_report([JOB, COMPUTE], []))
    lines = text.splitlines()
    table = next(line for line in lines if line.startswith("   2 "))
    assert "+23.2%" in table
    assert ("  slowdown: 18% when raised (the finding's figure: the median of its last 5 windows "
            "up to step 279, those whose evidence raised it); +23.2% from step "
            "200 on (the table's 'vs others', the last line's 'measured')") in lines
    assert lines[-1] == ("injected: rank 2 25% slower compute from step 200; measured 23.2% from "
                         "step 200 on (the table); found at step 279, after 80 slowed steps, at "
                         "18% in its last windows")
    # the whole-job finding raised first comes after the rank finding, said open or cleared
    rank_at = lines.index("straggler: rank 2 (compute), first flagged at step 279")
    also = [i for i, line in enumerate(lines) if line.startswith("also: whole job")]
    assert also and also[0] > rank_at
    assert lines[also[0]].endswith("(step 119; still open at the end)")
    cleared = {"detector": "straggler", "kind": "job_slowdown", "rank": None, "step": 179}
    text = format_report(_report([JOB, COMPUTE], [cleared]))
    assert "also: whole job 14.0% slower than its best (...), not one rank: ... (step 119; " \
           "cleared at step 179)" in text


def test_a_windows_file_that_could_not_be_written_is_said_with_what_was_lost():
    from laggard.demo.report import windows_file_line

    lost = {"path": "/dev/full", "windows": 30, "unsaved": 30,
            "error": "[Errno 28] No space left on device"}
    text = format_report(_report([COMPUTE], [], lost))
    assert ("windows file: no window was saved to /dev/full: [Errno 28] No space left on device "
            "(all 30 windows lost; rank 0's log said so once, training went on); `laggard "
            "report` has nothing to read") in text.splitlines()
    some = {**lost, "unsaved": 4}
    assert windows_file_line({"windows_file": some}).startswith(
        "windows file: 4 of 30 windows could not be saved to /dev/full: ")
    assert windows_file_line({"windows_file": {**lost, "unsaved": 0}}) == ""
    assert windows_file_line({}) == ""


def test_fake_gpu_flags_tie_the_throttle_to_the_slowed_rank() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)

    def scenario(*flags: str) -> str:
        args = parser.parse_args(["--slow-rank", "2", *flags])
        return demo.fake_gpu_scenario(args)

    assert scenario() == ""
    assert scenario("--fake-gpus") == "steady"
    assert scenario("--throttle-slow-gpu") == "throttle:2:sw_thermal"
    assert scenario("--throttle-slow-gpu", "sw_power_cap") == "throttle:2:sw_power_cap"
    args = parser.parse_args(["--use-agent", "127.0.0.1:9477"])
    args.slow_from = 0
    assert "--intake-address" in demo._check_args(args)


@pytest.mark.slow
def test_throttle_slow_gpu_names_the_reason_in_the_finding(tmp_path):
    report_path = tmp_path / "report.json"
    proc = _start(*SHORT, "--steps", "160", "--slowdown", "2.0", "--slow-from", "20",
                  "--throttle-slow-gpu", "--report", str(report_path))
    out, _ = proc.communicate(timeout=budget(240))
    assert proc.returncode == 0, out[-3000:]
    report = json.loads(report_path.read_text())
    named = [f for f in report["findings"] if f["rank"] is not None]
    assert named and {f["rank"] for f in named} == {1}
    assert "; compute: GPU 1 (" in named[0]["message"]
    assert "sw_thermal active in 100% of the window, SM clock 1.41 of 1.98 GHz" in \
        named[0]["message"]
    assert named[0]["evidence"]["gpu_state"]["cause"] == ["sw_thermal"]
