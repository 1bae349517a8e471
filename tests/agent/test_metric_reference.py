"""docs/metrics.md, the metric reference, stays in sync with what a real agent exports."""

import os
import re
import socket
import time

from prometheus_client.parser import text_string_to_metric_families
from support import FIXTURES, REPO, budget

from laggard.wire import CollectiveTiming, GroupProgress, Heartbeat, StepRecord, WindowReport

METRICS_DOC = REPO / "docs" / "metrics.md"


def documented_in(text: str) -> set[str]:
    """The metric families a reference page lists: the first cell of each table row."""
    return set(re.findall(r"^\| `(laggard_[a-z0-9_]+)` \|", text, flags=re.M))


def _documented() -> set[str]:
    return documented_in(METRICS_DOC.read_text())


#: Family-name suffix (before ``_total``) -> the unit its HELP names.
UNIT_WORDS = {"_bytes_per_second": "bytes per second", "_seconds": "seconds", "_bytes": "bytes",
              "_hertz": "hertz", "_watts": "watts", "_celsius": "celsius", "_joules": "joules",
              "_ratio": "ratio"}


def help_style_problems(helps: dict[str, str]) -> list[str]:
    """HELP texts not in the house style: a sentence (capital letter or digit first, a period
    last) that names the base unit the family's name ends with."""
    problems = []
    for name, text in sorted(helps.items()):
        if not text or not (text[0].isupper() or text[0].isdigit()) or not text.endswith("."):
            problems.append(f"{name}: not a sentence: {text!r}")
        base = name.removesuffix("_total")
        unit = next((w for s, w in UNIT_WORDS.items() if base.endswith(s)), None)
        if unit is not None and unit not in text.lower():
            problems.append(f"{name}: does not name its unit ({unit}): {text!r}")
    return problems


def _sets(text: str) -> dict[str, str]:
    """Family -> its ``set`` cell (``default``, ``default (stalled)``, ``opt-in``)."""
    return dict(re.findall(r"^\| `(laggard_[a-z0-9_]+)` \| [^|]* \| [^|]* \| ([^|]*?) \|",
                           text, flags=re.M))


def _exported(agent_factory, tmp_path, *flags: str) -> tuple[dict[str, str], set[str]]:
    """The families a live agent started with ``flags`` exports (name -> HELP; an empty
    family has its HELP and TYPE lines too), and those with a sample."""
    kmsg = tmp_path / "kern.log"
    kmsg.write_text("")
    agent = agent_factory(
        "--collector.interval", "0.2", "--collector.nvml.fake-gpus", "2",
        "--collector.nvml.all-fields",  # the opt-in GPU families are documented too
        "--path.sysfs", str(FIXTURES / "infiniband" / "sys"), "--path.kmsg", str(kmsg),
        "--collector.nccl_inspector.dir", str(tmp_path),
        "--collector.flight_recorder.path", str(tmp_path),
        "--intake.socket", str(tmp_path / "intake.sock"),  # its sender-lookup counter
        "--collector.netdev.device-include", "lo",  # the one interface every host has
        *flags,
    )
    record = StepRecord(rank=0, world_size=1, step=0, phases={"forward": 0.1}, step_seconds=0.2,
                        collective_wait_seconds=0.01,
                        collectives=[CollectiveTiming("allreduce", 0.01, 100)],
                        comm={"total_seconds": 0.1, "exposed_seconds": 0.01, "bytes": 10,
                              "raw_bytes": 40})
    report = WindowReport(step=0, world_size=1, scores={0: 0.1},
                          findings=[{"detector": "straggler", "kind": "compute",
                                     "severity": "warning", "rank": 0},
                                    {"detector": "straggler", "kind": "job_slowdown",
                                     "severity": "warning"}],
                          detector_stats={"windows": 1})
    # A heartbeat with a collective group and a P2P pair, each with work in flight: every
    # progress family has a sample.
    # The rank's process lives (this one): with the default set its progress is exported
    # while it is stalled only, and it is not; --intake.rank-histograms exports it always.
    heartbeat = Heartbeat(rank=0, world_size=1, step=1, pid=os.getpid(), phase="forward",
                          phase_seconds=0.1, groups=[
                              GroupProgress("g0[0]", issued=3, completed=2, op="allreduce",
                                            issued_age_seconds=0.1),
                              GroupProgress("g1[0]", issued=2, completed=1, op="send",
                                            issued_age_seconds=0.1, peer=0)])
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for payload in (record.encode(), report.encode(), heartbeat.encode()):
            s.sendto(payload, ("127.0.0.1", agent.intake_port))
    sets = _sets(METRICS_DOC.read_text())
    expected = {name for name, kind in sets.items()
                if "--intake.rank-histograms" in flags or kind == "default"}
    deadline = time.monotonic() + budget(10)
    names: dict[str, str] = {}
    sampled: set[str] = set()
    while time.monotonic() < deadline:
        families = list(text_string_to_metric_families(agent.scrape()))
        names = {f.name + ("_total" if f.type == "counter" else ""): f.documentation
                 for f in families if f.name.startswith("laggard_")
                 and not f.name.startswith("laggard_agent_process")}
        sampled = {f.name + ("_total" if f.type == "counter" else "") for f in families
                   if f.samples}
        # Stop once every documented family is there (or on timeout, reported by the caller):
        # collectors and the intake fill in over their first rounds.
        if expected <= names.keys():
            break
        time.sleep(0.2)
    return names, sampled


def test_metric_reference_matches_the_exposition(agent_factory, tmp_path):
    helps, _ = _exported(agent_factory, tmp_path, "--intake.rank-histograms")
    exported = set(helps)
    assert "laggard_gpu_sm_clock_hertz" in exported  # the fake GPUs were sampled
    documented = _documented()
    missing = exported - documented
    assert not missing, f"add these to docs/metrics.md: {sorted(missing)}"
    stale = documented - exported
    assert not stale, f"docs/metrics.md lists metrics the agent does not export: {sorted(stale)}"
    # The same agent's HELP texts: one style across collectors (issue 25, point 8).
    problems = help_style_problems(helps)
    assert not problems, "\n".join(problems)


def test_the_default_set_is_what_the_reference_says(agent_factory, tmp_path):
    """Issue 34: without --intake.rank-histograms the agent exports every family marked
    default and none marked opt-in (nor the stalled ones: its rank is not stalled)."""
    # A stall threshold of a day: its one rank is never stalled during the test.
    exported, sampled = _exported(agent_factory, tmp_path, "--intake.stall-seconds", "86400")
    sets = _sets(METRICS_DOC.read_text())
    assert set(sets) == _documented()  # every row has a set
    assert set(sets.values()) == {"default", "default (stalled)", "opt-in"}
    missing = {name for name, kind in sets.items() if kind == "default"} - exported.keys()
    assert not missing, f"marked default, not exported by default: {sorted(missing)}"
    extra = {name for name, kind in sets.items() if kind != "default"} & sampled
    assert not extra, f"marked opt-in or stalled, exported by default: {sorted(extra)}"


def test_the_help_style_check_can_fail():
    assert help_style_problems({"laggard_a_seconds": "Time spent, in seconds.",
                                "laggard_b_total": "1 while it holds."}) == []
    assert len(help_style_problems({"laggard_gpu_power_watts": "power draw",
                                    "laggard_x_bytes_total": "Data sent."})) == 3


def test_the_reference_parser_reads_the_table():
    """The comparison above can fail: a row the parser misses would hide a metric."""
    documented = _documented()
    assert {"laggard_build_info", "laggard_findings_total",
            "laggard_gpu_sm_clock_hertz"} <= documented
    rows = [ln for ln in METRICS_DOC.read_text().splitlines() if ln.startswith("| `laggard_")]
    assert len(documented) == len(rows)  # one family per row, none listed twice
    row = "| `laggard_made_up_total` | counter | | x |\n"
    assert documented_in(row) == {"laggard_made_up_total"}
