"""RankTable and heartbeats: a rank that stops stepping is stalled, not stale (issue 24).

A fake clock drives time and a procfs tree under ``tmp_path`` plays the rank processes (a
``PID/stat`` file per process, its start time in field 22), so that exits and pid reuse happen
when the test says.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support import registry_of

from laggard.agent.context import FindingLog
from laggard.agent.progress import GROUP_SAMPLES, MAX_GROUPS_PER_RANK
from laggard.agent.run_metrics import RunMetrics
from laggard.agent.run_state import RANK_DETAIL_SAMPLES
from laggard.agent.run_state import RANK_SAMPLES as DEFAULT_RANK_SAMPLES
from laggard.agent.run_table import RankTable
from laggard.agent.sender import SenderIdentity
from laggard.wire import GroupProgress, Heartbeat, StepRecord

#: A rank's cost in the tables here, which keep each rank's histograms (--intake.rank-histograms).
RANK_SAMPLES = DEFAULT_RANK_SAMPLES + RANK_DETAIL_SAMPLES


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class _Proc:
    """A procfs tree with the processes a test starts and ends."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(exist_ok=True)

    def start(self, pid: int, start_ticks: int, state: str = "S") -> None:
        fields = [state, "1"] + ["0"] * 17 + [str(start_ticks)] + ["0"] * 30
        (self.root / str(pid)).mkdir(exist_ok=True)
        (self.root / str(pid) / "stat").write_text(f"{pid} (python3 (x)) {' '.join(fields)}\n")

    def end(self, pid: int) -> None:
        (self.root / str(pid) / "stat").unlink()
        (self.root / str(pid)).rmdir()


@pytest.fixture
def clock() -> _Clock:
    return _Clock()


@pytest.fixture
def proc(tmp_path: Path) -> _Proc:
    return _Proc(tmp_path / "proc")


def _table(clock: _Clock, proc: _Proc, **kw) -> RankTable:
    return RankTable(rank_histograms=True, max_ranks=64, findings=FindingLog(), default_node="n0",
                     rank_ttl_seconds=20, clock=clock, proc_root=str(proc.root), **kw)


def _beat(rank: int = 0, step: int = 5, *, world_size: int = 2, run: str = "r", pid=None,
          groups=(), **kw) -> bytes:
    return Heartbeat(rank=rank, world_size=world_size, step=step, run=run, pid=pid,
                     groups=list(groups), **kw).encode()


def _step(rank: int = 0, step: int = 5, *, world_size: int = 2, run: str = "r",
          seconds: float | None = 0.1) -> bytes:
    return StepRecord(rank=rank, world_size=world_size, step=step, run=run,
                      step_seconds=seconds).encode()


def _value(table: RankTable, name: str, **labels: str) -> float | None:
    return registry_of(RunMetrics(table)).get_sample_value(name,
                                                           {"run": "r", "rank": "0", **labels})


def _process_state(table: RankTable, rank: int = 0) -> str | None:
    for family in registry_of(RunMetrics(table)).collect():
        if family.name == "laggard_rank_process_state":
            for sample in family.samples:
                if sample.labels["rank"] == str(rank):
                    return sample.labels["state"]
    return None


def test_a_heartbeat_exports_the_ranks_progress_per_group_and_pair(clock, proc):
    table = _table(clock, proc)
    table.ingest(_beat(phase="data", phase_seconds=2.0, groups=[
        GroupProgress("g0[0,1]", issued=20, completed=19, op="allreduce",
                      issued_age_seconds=1.5),
        GroupProgress("g1[0,1]", issued=7, completed=7, op="send", peer=1)]))
    clock.now += 3
    assert table.rejected == {}
    assert _value(table, "laggard_rank_heartbeat_age_seconds") == 3
    assert _value(table, "laggard_rank_current_phase_seconds", phase="data") == 5
    assert _value(table, "laggard_rank_collective_issued", group="g0[0,1]") == 20
    assert _value(table, "laggard_rank_collective_completed", group="g0[0,1]") == 19
    assert _value(table, "laggard_rank_collective_inflight_seconds", group="g0[0,1]",
                  op="allreduce") == 4.5
    assert _value(table, "laggard_rank_p2p_issued", group="g1[0,1]", peer="1") == 7
    assert _value(table, "laggard_rank_p2p_completed", group="g1[0,1]", peer="1") == 7
    # Nothing in flight in the pair: no in-flight series; P2P never in the collective families.
    assert _value(table, "laggard_rank_p2p_inflight_seconds", group="g1[0,1]", peer="1",
                  op="send") is None
    assert _value(table, "laggard_rank_collective_issued", group="g1[0,1]") is None
    assert _value(table, "laggard_rank_stalled_seconds") == 0
    assert _process_state(table) == "unknown"  # no pid
    assert table.series == RANK_SAMPLES + 2 * GROUP_SAMPLES
    # Known from its heartbeat alone (hung in its first step): no step record, no last-seen
    # time (a dashboard's "seconds since the last step record" would read 1970).
    assert _value(table, "laggard_steps_total") == 0
    assert _value(table, "laggard_rank_last_step") == -1
    assert _value(table, "laggard_rank_last_seen_timestamp_seconds") is None


def test_steps_stop_heartbeats_go_on_stalled_and_kept_past_the_ttl(clock, proc):
    table = _table(clock, proc)
    for step in range(10):
        table.ingest(_step(step=step, seconds=0.1))
        clock.now += 0.1
    assert _value(table, "laggard_rank_stall_threshold_seconds") == 5  # max(5, 3 x 0.1)
    for _ in range(60):  # a minute of heartbeats, no step: three TTLs
        table.ingest(_beat(step=10, phase="collective_wait"))
        clock.now += 1
    stalled = _value(table, "laggard_rank_stalled_seconds")
    assert stalled == pytest.approx(60.0, abs=0.2)
    assert _value(table, "laggard_steps_total") == 10  # its series stay
    # The heartbeats stop and no pid is known: forgotten a TTL after the last one.
    clock.now += 19
    assert _value(table, "laggard_steps_total") == 10
    clock.now += 2
    assert _value(table, "laggard_steps_total") is None
    assert table.forgotten["stale"] == 1
    assert table.series == 0


def test_progress_in_a_group_or_a_new_step_is_no_stall(clock, proc):
    table = _table(clock, proc)
    table.ingest(_step(step=0, seconds=0.1))
    for i in range(30):  # one long step (an evaluation loop) completing collectives
        clock.now += 1
        table.ingest(_beat(step=1, groups=[GroupProgress("g0[0,1]", issued=i + 1,
                                                          completed=i + 1)]))
        assert _value(table, "laggard_rank_stalled_seconds") == 0
    for i in range(30):  # then steps move on in the heartbeats alone
        clock.now += 1
        table.ingest(_beat(step=2 + i, groups=[GroupProgress("g0[0,1]", issued=30,
                                                              completed=30)]))
        assert _value(table, "laggard_rank_stalled_seconds") == 0
    clock.now += 5.5
    assert _value(table, "laggard_rank_stalled_seconds") == pytest.approx(5.5)


def test_the_threshold_follows_the_ranks_own_step_time(clock, proc):
    table = _table(clock, proc)
    for step in range(5):
        table.ingest(_step(step=step, seconds=4.0))
    assert _value(table, "laggard_rank_stall_threshold_seconds") == 12
    clock.now += 11
    assert _value(table, "laggard_rank_stalled_seconds") == 0  # a slow step, not a stall
    clock.now += 2
    assert _value(table, "laggard_rank_stalled_seconds") == 13
    # The sender's own median wins when its heartbeat gives one.
    table.ingest(_beat(step=4, step_seconds=10.0))
    assert _value(table, "laggard_rank_stall_threshold_seconds") == 30
    custom = _table(clock, proc, stall_seconds=1.0, stall_step_factor=10)
    custom.ingest(_step(step=0, seconds=0.5))
    assert _value(custom, "laggard_rank_stall_threshold_seconds") == 5


def test_a_live_silent_process_keeps_its_rank_until_it_exits(clock, proc):
    proc.start(4242, start_ticks=777)
    table = _table(clock, proc)
    table.ingest(_step(step=0))
    table.ingest(_beat(step=1, pid=4242))
    assert _process_state(table) == "alive"
    clock.now += 600  # ten minutes of silence: heartbeats stopped (the GIL held)
    assert _process_state(table) == "alive"
    assert _value(table, "laggard_rank_stalled_seconds") == 600
    assert _value(table, "laggard_rank_heartbeat_age_seconds") == 600
    proc.end(4242)
    clock.now += 1
    assert _value(table, "laggard_steps_total") is None  # gone, and silent for the TTL
    assert table.forgotten == {"exited": 1}


def test_an_exited_process_stays_for_the_ttl_then_goes(clock, proc):
    proc.start(4242, start_ticks=777)
    table = _table(clock, proc)
    table.ingest(_beat(step=1, pid=4242))
    proc.end(4242)
    clock.now += 3
    assert _process_state(table) == "exited"
    assert _value(table, "laggard_rank_stalled_seconds") == 0  # gone is not hung
    clock.now += 16
    assert _value(table, "laggard_rank_heartbeat_age_seconds") == 19
    clock.now += 2
    assert _process_state(table) is None
    assert table.forgotten == {"exited": 1}


def test_a_reused_pid_is_not_the_ranks_process(clock, proc):
    proc.start(4242, start_ticks=777)
    table = _table(clock, proc)
    table.ingest(_beat(step=1, pid=4242))
    proc.end(4242)
    proc.start(4242, start_ticks=9000)  # another process got the pid
    clock.now += 3
    assert _process_state(table) == "exited"
    clock.now += 30
    assert _process_state(table) is None


def test_a_zombie_has_exited(clock, proc):
    proc.start(4242, start_ticks=777)
    table = _table(clock, proc)
    table.ingest(_beat(step=1, pid=4242))
    proc.start(4242, start_ticks=777, state="Z")
    clock.now += 3
    assert _process_state(table) == "exited"


def test_no_procfs_or_no_pid_is_unknown_and_expires_as_before(clock, tmp_path):
    table = RankTable(rank_histograms=True, max_ranks=8, findings=FindingLog(), default_node="n0",
                      rank_ttl_seconds=20, clock=clock, proc_root=str(tmp_path / "none"))
    table.ingest(_beat(step=1, pid=4242))
    clock.now += 3
    assert _process_state(table) == "unknown"
    clock.now += 18
    assert _process_state(table) is None
    assert table.forgotten == {"stale": 1}


def test_a_pid_claimed_over_the_unix_socket_is_not_looked_up(clock, proc):
    """A sender whose pid namespace the agent cannot see (the kernel gives none) claims a pid
    of its own namespace: here it would name another process."""
    proc.start(57, start_ticks=1)
    table = _table(clock, proc)
    table.ingest(_beat(step=1, pid=57), SenderIdentity(pid=None, uid=1000, gid=1000))
    clock.now += 3
    assert _process_state(table) == "unknown"
    # The kernel's pid wins over a claimed one.
    proc.start(4242, start_ticks=5)
    table.ingest(_beat(rank=1, step=1, pid=57), SenderIdentity(pid=4242, uid=1000, gid=1000))
    clock.now += 30
    assert _process_state(table, rank=1) == "alive"
    assert _process_state(table, rank=0) is None


def test_pid_1_claimed_over_udp_is_never_looked_up(clock, proc):
    proc.start(1, start_ticks=1)  # the host's init, if a container's rank claimed its own pid 1
    table = _table(clock, proc)
    table.ingest(_beat(step=1, pid=1))
    clock.now += 3
    assert _process_state(table) == "unknown"


def test_a_goodbye_heartbeat_lets_a_live_process_expire(clock, proc):
    proc.start(4242, start_ticks=777)
    table = _table(clock, proc)
    table.ingest(_beat(step=9, pid=4242, phase="closed"))
    clock.now += 10
    assert _value(table, "laggard_rank_stalled_seconds") == 0
    clock.now += 11
    assert _process_state(table) is None
    assert table.forgotten == {"stale": 1}


def test_sequence_numbers_going_back_reset_the_group_and_are_counted(clock, proc):
    table = _table(clock, proc)
    table.ingest(_beat(groups=[GroupProgress("g0[0,1]", issued=500, completed=500)]))
    table.ingest(_beat(groups=[GroupProgress("g0[0,1]", issued=3, completed=2)]))
    assert table.group_resets["backwards"] == 1
    assert _value(table, "laggard_rank_collective_issued", group="g0[0,1]") == 3
    assert _value(table, "laggard_rank_collective_completed", group="g0[0,1]") == 2
    assert table.series == RANK_SAMPLES + GROUP_SAMPLES


def test_another_process_taking_the_rank_over_drops_the_old_groups(clock, proc):
    proc.start(100, start_ticks=1)
    proc.start(200, start_ticks=2)
    table = _table(clock, proc)
    table.ingest(_beat(groups=[GroupProgress("g0[0,1]", issued=500, completed=500)]),
                 SenderIdentity(pid=100))
    table.ingest(_beat(groups=[GroupProgress("g9[0,1]", issued=1, completed=1)]),
                 SenderIdentity(pid=200))
    assert table.group_resets["new_process"] == 1
    assert _value(table, "laggard_rank_collective_issued", group="g0[0,1]") is None
    assert _value(table, "laggard_rank_collective_issued", group="g9[0,1]") == 1
    assert table.series == RANK_SAMPLES + GROUP_SAMPLES


def test_groups_past_the_per_rank_cap_are_dropped_and_counted(clock, proc):
    table = _table(clock, proc)
    for batch in range(2):
        table.ingest(_beat(groups=[GroupProgress(f"g{batch * 20 + i}", issued=1, completed=1)
                                   for i in range(20)]))
    assert table.dropped["group"] == 40 - MAX_GROUPS_PER_RANK
    assert table.series == RANK_SAMPLES + MAX_GROUPS_PER_RANK * GROUP_SAMPLES
    assert _value(table, "laggard_rank_collective_issued", group="g31") == 1
    assert _value(table, "laggard_rank_collective_issued", group="g32") is None


def test_groups_past_the_series_budget_are_dropped(clock, proc):
    table = _table(clock, proc, max_series=RANK_SAMPLES + 2 * GROUP_SAMPLES)
    table.ingest(_beat(groups=[GroupProgress(f"g{i}", issued=1, completed=1) for i in range(5)]))
    assert table.dropped["group"] == 3
    assert table.series == table._max_series


def test_a_world_size_conflict_from_the_same_process_is_refused(clock, proc):
    proc.start(4242, start_ticks=777)
    table = _table(clock, proc)
    table.ingest(_beat(world_size=2, pid=4242))
    table.ingest(_beat(world_size=8, pid=4242))
    assert table.rejected == {"heartbeat_conflict": 1}
    assert _value(table, "laggard_rank_info", node="n0", local_rank="", gpu="", uuid="",
                  pci_bus_id="", world_size="2") == 1
    # Another process with another world size: the run restarted.
    proc.start(5000, start_ticks=800)
    table.ingest(_beat(world_size=8, pid=5000))
    assert table.forgotten == {"restart": 1}
    assert _value(table, "laggard_rank_info", node="n0", local_rank="", gpu="", uuid="",
                  pci_bus_id="", world_size="8") == 1


def test_a_rank_that_moves_to_another_run_leaves_no_stalled_rank_behind(clock, proc):
    """Heartbeats from a rank of another run: with the kernel's pid the old rank goes at once
    (its live process would otherwise keep it, stalled, for ever)."""
    proc.start(4242, start_ticks=777)
    table = _table(clock, proc)
    sender = SenderIdentity(pid=4242)
    table.ingest(_beat(run="a", step=1), sender)
    table.ingest(_beat(run="b", step=1), sender)
    clock.now += 600
    r = registry_of(RunMetrics(table))
    assert r.get_sample_value("laggard_rank_stalled_seconds", {"run": "a", "rank": "0"}) is None
    assert r.get_sample_value("laggard_rank_stalled_seconds", {"run": "b", "rank": "0"}) == 600
    assert table.forgotten == {"moved": 1}


def test_garbage_heartbeats_are_counted_and_change_nothing(clock, proc):
    table = _table(clock, proc)
    table.ingest(_beat(groups=[GroupProgress("g0", issued=5, completed=5)]))
    bad = [
        b'{"v":1,"type":"heartbeat","rank":0,"world_size":2,"step":1,'
        b'"groups":[{"group":"g0","issued":3,"completed":4}]}',  # completed > issued
        b'{"v":1,"type":"heartbeat","rank":0,"world_size":2,"step":1,'
        b'"groups":[{"group":"g0","issued":3,"completed":1,"peer":9}]}',  # peer out of range
        b'{"v":1,"type":"heartbeat","rank":0,"world_size":2,"step":1,"pid":-4}',
        b'{"v":1,"type":"heartbeat","rank":0,"world_size":2,"step":1,"groups":{}}',
        b'{"v":1,"type":"heartbeat","rank":0,"world_size":2,"step":1,"phase_seconds":-1}',
        b'{"v":1,"type":"heartbeat","rank":0,"world_size":2,"step":1,"groups":['
        + b",".join(b'{"group":"g","issued":1,"completed":1}' for _ in range(33)) + b"]}",
        b'{"v":1,"type":"heartbeat","rank":0,"world_size":2}',
        b'{"v":1,"type":"heartbeat","rank":0,"world_size":2,"step":1,"phase":""}',
    ]
    for payload in bad:
        table.ingest(payload)
    assert sum(table.rejected.values()) == len(bad)
    assert set(table.rejected) <= {"range", "schema"}
    assert table.group_resets == {}
    assert _value(table, "laggard_rank_collective_issued", group="g0") == 5


def test_older_senders_without_heartbeats_are_never_silent(clock, proc):
    table = _table(clock, proc)
    table.ingest(_step(step=0))
    clock.now += 10
    assert _value(table, "laggard_rank_heartbeat_age_seconds") is None
    assert _value(table, "laggard_rank_stalled_seconds") == 10
    clock.now += 11
    assert _value(table, "laggard_steps_total") is None
    assert table.forgotten == {"stale": 1}


def test_the_stall_flags_reach_the_config_and_are_checked():
    import argparse

    from laggard.agent.config import AgentConfig
    from laggard.agent.daemon import add_arguments, config_from_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    config = config_from_args(parser.parse_args(
        ["--intake.stall-seconds", "2.5", "--intake.stall-step-factor", "4"]))
    assert (config.stall_seconds, config.stall_step_factor) == (2.5, 4.0)
    defaults = config_from_args(parser.parse_args([]))
    assert (defaults.stall_seconds, defaults.stall_step_factor) == (5.0, 3.0)
    for bad in ({"stall_seconds": 0.1}, {"stall_seconds": 1e6}, {"stall_step_factor": 0.5}):
        with pytest.raises(ValueError, match="stall"):
            AgentConfig(**bad)
    with pytest.raises(ValueError, match="stall"):
        RankTable(rank_histograms=True,
                  max_ranks=1, findings=FindingLog(), default_node="n0", stall_seconds=0)


def test_by_default_the_hang_evidence_is_exported_while_the_rank_is_stalled(clock, proc):
    """Issue 34: group progress, process state and current phase cost series only while they
    are evidence: once the rank is stalled (the hang rules compare stalled ranks only)."""
    table = RankTable(max_ranks=64, findings=FindingLog(), default_node="n0",
                      rank_ttl_seconds=20, clock=clock, proc_root=str(proc.root))
    proc.start(4242, 100)
    group = GroupProgress("g0[0,1]", issued=20, completed=19, op="allreduce",
                          issued_age_seconds=0.5)
    table.ingest(_step())
    table.ingest(_beat(pid=4242, phase="backward", phase_seconds=0.1, groups=[group]))
    assert _value(table, "laggard_rank_stalled_seconds") == 0
    assert _value(table, "laggard_rank_heartbeat_age_seconds") == 0
    for name, labels in (("laggard_rank_collective_issued", {"group": "g0[0,1]"}),
                         ("laggard_rank_current_phase_seconds", {"phase": "backward"}),
                         ("laggard_rank_process_state", {"state": "alive"}),
                         ("laggard_rank_stall_threshold_seconds", {}),
                         ("laggard_steps_total", {})):
        assert _value(table, name, **labels) is None, name
    # The budget charges what a stalled rank shows: the default rank and its group.
    assert table.series == DEFAULT_RANK_SAMPLES + GROUP_SAMPLES
    clock.now += 6  # past the 5 s stall threshold; its process lives
    assert _value(table, "laggard_rank_stalled_seconds") == 6
    assert _value(table, "laggard_rank_collective_issued", group="g0[0,1]") == 20
    assert _value(table, "laggard_rank_collective_completed", group="g0[0,1]") == 19
    assert _value(table, "laggard_rank_collective_inflight_seconds", group="g0[0,1]",
                  op="allreduce") == 6.5
    assert _value(table, "laggard_rank_current_phase_seconds", phase="backward") == 6.1
    assert _process_state(table) == "alive"
    table.ingest(_step(step=6))  # progress again: the evidence goes
    assert _value(table, "laggard_rank_stalled_seconds") == 0
    assert _value(table, "laggard_rank_collective_issued", group="g0[0,1]") is None
