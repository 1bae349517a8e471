"""Rank 0's HangWatch (laggard.integrations.hang_watch) on plain store keys, with the hang rules
of laggard.detectors.hang: one report per episode, a level job is slow, silence, closed ranks,
restarted groups and bad keys counted, never a false hang."""

from __future__ import annotations

from heartbeat_data import hung_job, make_keys, make_snapshot

from laggard.integrations.hang_watch import HangWatch, HeartbeatStats
from laggard.integrations.heartbeat_key import RankSnapshot, encode_key
from laggard.wire import GroupProgress


def _watch(world=4, interval=2.0) -> HangWatch:
    return HangWatch(run="r1", world_size=world, interval=interval,
                     stats=HeartbeatStats())


def _observe(watch, now, payloads, quiet=30.0):
    return watch.observe(now, payloads, own_quiet=quiet, hang_after=10.0, own_step=7)


def test_one_rank_behind_is_reported_once_per_episode():
    watch = _watch()
    report = _observe(watch, 100.0, make_keys(hung_job(), beat=1))
    assert report is not None and report.ranks == (1,)
    assert report.message == ("hung since step 7 in allreduce #11 of group dp: rank 1 never "
                              "issued it (last in phase data for 95 s)")
    assert report.step == 7 and report.seconds_since_progress == 30.0
    assert _observe(watch, 102.0, make_keys(hung_job(), beat=2)) is None  # same episode
    watch.end_episode()
    assert _observe(watch, 300.0, make_keys(hung_job(), beat=3)) is not None


def test_a_skipped_collective_is_told_from_the_wait_it_caused_by_the_pending_ages():
    """Rank 2 skipped allreduce #5 of group a and waits in group b's #8, which the others never
    issue: a wait cycle, broken at the oldest wait (the others', in a)."""
    def snap(rank):
        if rank == 2:
            groups = (GroupProgress(group="a:1", issued=4, completed=4, op="allreduce"),
                      GroupProgress(group="b:2", issued=8, completed=7, op="allgather"))
            pending = (None, 29.0)
        else:
            groups = (GroupProgress(group="a:1", issued=5, completed=4, op="allreduce"),
                      GroupProgress(group="b:2", issued=7, completed=7, op="allgather"))
            pending = (30.0, None)
        return RankSnapshot(step=9, phase="backward" if rank == 2 else "metrics",
                            phase_seconds=29.0, step_seconds=0.1, quiet_seconds=29.0,
                            groups=groups, pending_seconds=pending, wall=1000.0)

    keys = {r: encode_key(snap(r), rank=r, run="r1", pid=100 + r, beat=1) for r in range(4)}
    report = _watch().observe(100.0, keys, own_quiet=29.0, hang_after=10.0, own_step=9,
                              wall=1001.0)
    assert report is not None and report.verdict.cycle
    assert [(c.rank, c.kind, c.group, c.seq) for c in report.verdict.culprits] == [
        (2, "missing", "a:1", 5)]
    assert report.states[0].groups[0].pending_seconds == 31.0  # aged by the 1 s since written


def test_a_level_job_is_slow_nothung_job():
    watch = _watch()
    level = {r: make_snapshot(phase="checkpoint", groups=(("dp:0", 11, 11, "allreduce"),))
             for r in range(4)}
    assert _observe(watch, 100.0, make_keys(level, beat=1)) is None
    assert watch.stats.classifications == 1 and watch.stats.hangs_reported == 0


def test_nothing_is_read_as_hung_while_a_rank_still_moves_or_rank_0_has_not_waited():
    watch = _watch()
    moving = hung_job()
    moving[2] = make_snapshot(phase="backward", quiet=0.5, groups=(("dp:0", 11, 10, "allreduce"),))
    assert _observe(watch, 100.0, make_keys(moving, beat=1)) is None
    assert watch.observe(100.0, make_keys(hung_job(), beat=1), own_quiet=5.0, hang_after=10.0,
                         own_step=7) is None
    assert watch.stats.classifications == 0


def test_a_rank_whose_key_stops_changing_is_silent_and_a_missing_key_too():
    watch = _watch()
    states = hung_job(missing=())
    first = make_keys(states, beat=1)
    assert _observe(watch, 100.0, first) is None  # level, everyone fresh
    later = make_keys(states, beat=2)
    later[3] = first[3]  # rank 3 stopped writing at beat 1
    del later[2]  # rank 2's key vanished (never readable)
    assert _observe(watch, 100.0 + watch.silent_after + 1, later) is not None
    report = watch.observe(200.0, later, own_quiet=30.0, hang_after=10.0, own_step=7)
    assert report is None  # reported already
    assert watch.stats.silent_ranks == 2


def test_silence_is_only_judged_after_watching_long_enough():
    watch = _watch()
    keys = make_keys(hung_job(missing=()), beat=1)
    del keys[3]  # never wrote; rank 0 has just started watching
    assert _observe(watch, 100.0, keys) is None
    assert watch.stats.classifications == 0


def test_a_closed_rank_means_the_job_is_ending_nothung_job():
    watch = _watch()
    assert _observe(watch, 100.0, make_keys(hung_job(), beat=1, closed=frozenset({3}))) is None


def test_sequence_numbers_going_back_are_counted_and_never_a_false_hang():
    watch = _watch()
    level = {r: make_snapshot(groups=(("dp:0", 50, 50, "allreduce"),)) for r in range(4)}
    assert _observe(watch, 100.0, make_keys(level, beat=1)) is None
    restarted = dict(level)
    restarted[1] = make_snapshot(groups=(("dp:0", 3, 3, "allreduce"),))  # same pid, group re-made
    assert _observe(watch, 102.0, make_keys(restarted, beat=2)) is None
    assert watch.stats.seq_backwards == 1


def test_keys_of_another_run_are_counted_and_read_as_absent():
    watch = _watch()
    keys = make_keys(hung_job(), beat=1)
    keys[2] = encode_key(hung_job()[2], rank=2, run="other-run", pid=1, beat=1)
    assert _observe(watch, 100.0, keys) is None  # rank 2 has no usable key, not yet silent
    assert watch.stats.bad_keys == 1


def test_rules_that_raise_are_counted_and_report_nothing():
    def broken(ranks, **options):
        raise NotImplementedError("rules to come")

    watch = HangWatch(run="r1", world_size=4, interval=2.0, classify=broken)
    assert _observe(watch, 100.0, make_keys(hung_job(), beat=1)) is None
    assert watch.stats.classify_errors == 1


def test_bad_keys_are_logged_once_on_the_heartbeats_logger(caplog):
    watch = _watch()
    keys = make_keys(hung_job(), beat=1)
    keys[2] = b"{not json"
    with caplog.at_level("WARNING", logger="laggard.integrations.heartbeat"):
        for now in (100.0, 102.0):
            _observe(watch, now, keys)
    lines = [r.getMessage() for r in caplog.records if r.name == "laggard.integrations.heartbeat"]
    assert watch.stats.bad_keys == 2 and len(lines) == 1
    assert lines[0].startswith("laggard: a hang-store key for rank 2 is not usable (not JSON")


def test_the_job_moving_again_after_a_report_logs_hang_cleared_once(caplog):
    watch = _watch()
    assert _observe(watch, 100.0, make_keys(hung_job(), beat=1)) is not None
    with caplog.at_level("WARNING", logger="laggard.hang"):
        watch.end_episode(now=112.0)  # reported 30 s into the stop, moved 12 s later
        watch.end_episode(now=113.0)  # progress again: nothing more to say
    lines = [r.getMessage() for r in caplog.records if r.name == "laggard.hang"]
    assert lines == ["laggard: hang cleared after 42 s: the job moves again"]


def test_a_gloo_job_gets_no_device_verdict():
    """Rank 3 issued dp:0's #11, which ranks 0 and 1 completed (a gloo ring completes at some
    members first) and rank 2 did not: on a device that is rank 3 stuck on it; on the host it
    is a collective in progress, and the silent rank 2 is the one it waits on."""
    snaps = {r: make_snapshot(phase="backward", groups=(("dp:0", 11, 11, "allreduce"),))
             for r in (0, 1)}
    snaps[3] = make_snapshot(phase="backward", groups=(("dp:0", 11, 10, "allreduce"),))
    keys = [make_keys(snaps, beat=beat) for beat in (1, 2)]  # ranks 0, 1, 3 still write
    for k in keys:
        k[2] = None  # rank 2 stopped (SIGSTOP) before it ever wrote a key
    nccl = HangWatch(run="r1", world_size=4, interval=2.0, device=True)
    nccl.observe(100.0, keys[0], own_quiet=30.0, hang_after=10.0, own_step=7)
    report = nccl.observe(110.0, keys[1], own_quiet=40.0, hang_after=10.0, own_step=7)
    assert report is not None and report.verdict.kind_of(3) == "device"
    gloo = HangWatch(run="r1", world_size=4, interval=2.0, device=False)
    gloo.observe(100.0, keys[0], own_quiet=30.0, hang_after=10.0, own_step=7)
    report = gloo.observe(110.0, keys[1], own_quiet=40.0, hang_after=10.0, own_step=7)
    assert report is not None and report.ranks == (2,)
    assert report.verdict.kind_of(2) == "silent" and "device" not in report.message
