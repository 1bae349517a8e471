"""The Unix datagram intake on real sockets in temporary directories: the kernel's credentials
arrive with each datagram, the allow-list refuses and counts (a sender forked and setuid to
nobody), the file has the mode asked for, a stale socket is replaced but a live one or a
non-socket file never is, garbage is counted and skipped; the cgroup reader's cache and a
process that exited."""

from __future__ import annotations

import os
import socket
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from support import registry_of, wait_for

from laggard.agent.context import FindingLog
from laggard.agent.run_metrics import RunMetrics
from laggard.agent.run_table import RankTable
from laggard.agent.sender import SenderIdentity
from laggard.agent.unix_intake import UnixIntake, bind_unix_datagram_socket, parse_id_list
from laggard.agent.workload import WorkloadLabels
from laggard.wire import MAX_DATAGRAM_BYTES, StepRecord, encode_batch

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="setuid to nobody needs root")
CGROUP = ("0::/kubepods.slice/kubepods-burstable.slice/"
          "kubepods-burstable-pod3b1e2c4d_5f6a_4b8c_9d0e_1f2a3b4c5d6e.slice/"
          "cri-containerd-" + "ab" * 32 + ".scope\n")


class _Recorder(RankTable):
    """A RankTable that also keeps who sent each datagram."""

    def __init__(self) -> None:
        super().__init__(max_ranks=64, findings=FindingLog(), default_node="n0")
        self.senders: list[SenderIdentity | None] = []

    def ingest(self, payload: bytes, sender: SenderIdentity | None = None) -> None:
        self.senders.append(sender)
        super().ingest(payload, sender)


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    # Searchable by everyone (pytest's tmp_path sits under a 0700 directory): a sender that
    # dropped to nobody must be able to reach the socket for the mode to be what decides.
    directory = Path(tempfile.mkdtemp(prefix="laggard-sock-", dir="/tmp"))
    directory.chmod(0o755)
    yield directory
    for child in directory.iterdir():
        child.unlink()
    directory.rmdir()


def _intake(path: Path, table: RankTable | None = None, **kwargs: object
            ) -> tuple[UnixIntake, RankTable]:
    table = table if table is not None else _Recorder()
    intake = UnixIntake(str(path), table, **kwargs)  # type: ignore[arg-type]
    intake.start()
    return intake, table


def _send(path: Path, payload: bytes) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.connect(str(path))
        s.send(payload)


def _send_as(uid: int, path: Path, payload: bytes) -> int:
    """Send ``payload`` from a forked child running as ``uid``; its exit status (0: sent,
    13: EACCES connecting, 1: anything else)."""
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        status = 1
        try:
            os.setgid(uid)
            os.setuid(uid)
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
                s.connect(str(path))
                s.send(payload)
            status = 0
        except PermissionError:
            status = 13
        finally:
            os._exit(status)
    return os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])


RECORD = StepRecord(rank=0, world_size=2, step=1).encode()


def test_credentials_arrive_with_each_datagram(socket_dir: Path) -> None:
    path = socket_dir / "intake.sock"
    intake, table = _intake(path)
    try:
        _send(path, RECORD)
        assert wait_for(lambda: table.accepted == 1)
        (sender,) = table.senders  # type: ignore[attr-defined]
        assert sender == SenderIdentity(pid=os.getpid(), uid=os.getuid(), gid=os.getgid(),
                                        labels={})
    finally:
        intake.stop()
    assert not path.exists()  # our own file is removed at stop


@needs_root
def test_a_sender_not_on_the_allow_list_is_refused_and_counted(socket_dir: Path) -> None:
    path = socket_dir / "intake.sock"
    intake, table = _intake(path, allow_uids={0})
    try:
        assert _send_as(NOBODY, path, RECORD) == 0
        assert wait_for(lambda: table.rejected["sender_not_allowed"] == 1)
        _send(path, RECORD)  # root is on the list
        assert wait_for(lambda: table.accepted == 1)
        assert table.senders == [SenderIdentity(pid=os.getpid(), uid=0, gid=os.getgid())]  # type: ignore[attr-defined]
        assert registry_of(RunMetrics(table)).get_sample_value("laggard_intake_rejected_total",
                                         {"reason": "sender_not_allowed"}) == 1
    finally:
        intake.stop()


@needs_root
def test_the_gid_allow_list_admits_a_group(socket_dir: Path) -> None:
    path = socket_dir / "intake.sock"
    intake, table = _intake(path, allow_uids={12345}, allow_gids={NOBODY})
    try:
        assert _send_as(NOBODY, path, RECORD) == 0
        assert wait_for(lambda: table.accepted == 1)
        (sender,) = table.senders  # type: ignore[attr-defined]
        assert sender is not None and (sender.uid, sender.gid) == (NOBODY, NOBODY)
        assert sender.pid not in (None, os.getpid())  # the child's pid, not ours
    finally:
        intake.stop()


@pytest.mark.parametrize("mode", [0o666, 0o660, 0o600])
def test_the_socket_file_has_the_mode_asked_for(socket_dir: Path, mode: int) -> None:
    path = socket_dir / "intake.sock"
    intake, _ = _intake(path, mode=mode)
    try:
        st = os.lstat(path)
        assert stat.S_ISSOCK(st.st_mode)
        assert stat.S_IMODE(st.st_mode) == mode
        if os.geteuid() == 0:
            # the mode is what decides: nobody can send through 0666, not through 0660
            assert _send_as(NOBODY, path, RECORD) == (0 if mode == 0o666 else 13)
    finally:
        intake.stop()


def test_the_directory_is_made_if_missing(socket_dir: Path) -> None:
    path = socket_dir / "run" / "laggard" / "intake.sock"
    umask = os.umask(0o077)  # a service's tight umask: the directory is 0755 all the same
    try:
        intake, table = _intake(path)
    finally:
        os.umask(umask)
    try:
        assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o755
        _send(path, RECORD)
        assert wait_for(lambda: table.accepted == 1)
    finally:
        intake.stop()
        path.parent.rmdir()
        path.parent.parent.rmdir()


@needs_root
def test_the_socket_file_gets_the_group_asked_for(socket_dir: Path) -> None:
    path = socket_dir / "intake.sock"
    intake, _ = _intake(path, mode=0o660, group=NOBODY)
    try:
        st = os.lstat(path)
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, NOBODY, 0o660)
    finally:
        intake.stop()


def test_a_stale_socket_is_replaced(socket_dir: Path) -> None:
    path = socket_dir / "intake.sock"
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    dead.bind(str(path))
    dead.close()  # the file stays, nobody receives: what an agent killed with -9 leaves
    intake, table = _intake(path)
    try:
        _send(path, RECORD)
        assert wait_for(lambda: table.accepted == 1)
    finally:
        intake.stop()


def test_a_live_socket_is_not_taken_over(socket_dir: Path) -> None:
    path = socket_dir / "intake.sock"
    first, table = _intake(path)
    try:
        with pytest.raises(OSError, match="another process receives"):
            UnixIntake(str(path), _Recorder())
        _send(path, RECORD)  # still the first agent's
        assert wait_for(lambda: table.accepted == 1)
        assert [p.name for p in socket_dir.iterdir()] == ["intake.sock"]  # no temporary left
    finally:
        first.stop()


@pytest.mark.parametrize("kind", ["file", "symlink", "directory"])
def test_a_non_socket_at_the_path_is_never_replaced(socket_dir: Path, kind: str) -> None:
    path = socket_dir / "intake.sock"
    target = socket_dir / "precious"
    target.write_text("keep me")
    if kind == "file":
        path.write_text("keep me")
    elif kind == "symlink":
        path.symlink_to(target)
    else:
        path.mkdir()
    with pytest.raises(OSError, match="not a socket"):
        bind_unix_datagram_socket(str(path))
    assert target.read_text() == "keep me"
    if kind == "directory":
        path.rmdir()
    else:
        assert path.is_symlink() == (kind == "symlink")
        path.unlink()


def test_garbage_and_oversized_datagrams_are_counted_and_skipped(socket_dir: Path) -> None:
    path = socket_dir / "intake.sock"
    intake, table = _intake(path)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
            s.connect(str(path))
            s.send(b"\x00garbage{")
            s.send(b"{" * (MAX_DATAGRAM_BYTES + 100))
            s.send(RECORD)
        assert wait_for(lambda: table.accepted == 1)
        assert table.rejected["not_json"] == 1
        assert table.rejected["oversized"] == 1
        assert intake.thread.is_alive()
    finally:
        intake.stop()


def test_descriptors_passed_along_are_closed(socket_dir: Path) -> None:
    path = socket_dir / "intake.sock"
    intake, table = _intake(path)
    before = len(os.listdir("/proc/self/fd"))
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s, open(os.devnull) as f:
            s.connect(str(path))
            for _ in range(5):
                socket.send_fds(s, [RECORD], [f.fileno()])
        assert wait_for(lambda: table.accepted == 5)
        assert len(os.listdir("/proc/self/fd")) <= before
    finally:
        intake.stop()


def test_workload_labels_come_from_the_senders_cgroup(socket_dir: Path, tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / str(os.getpid())).mkdir(parents=True)
    (proc / str(os.getpid()) / "cgroup").write_text(CGROUP)
    workload = WorkloadLabels(str(proc))
    path = socket_dir / "intake.sock"
    intake, table = _intake(path, workload=workload)
    try:
        _send(path, RECORD)
        _send(path, RECORD)
        assert wait_for(lambda: table.accepted == 2)
        assert {s.labels["pod_uid"] for s in table.senders} == {  # type: ignore[attr-defined]
            "3b1e2c4d-5f6a-4b8c-9d0e-1f2a3b4c5d6e"}
        registry = registry_of(intake)
        for result, count in (("read", 1), ("cached", 1), ("exited", 0)):
            assert registry.get_sample_value("laggard_intake_sender_lookups_total",
                                             {"result": result}) == count
    finally:
        intake.stop()


def test_the_reader_counts_an_exited_process_and_bounds_its_cache(tmp_path: Path) -> None:
    now = [0.0]
    workload = WorkloadLabels(str(tmp_path), max_pids=2, ttl_seconds=10, clock=lambda: now[0])
    for pid in (1, 2, 3):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(
            f"0::/system.slice/slurmstepd.scope/job_{pid}/step_0/user/task_0\n")
    assert workload.labels_for(1) == {"slurm_job_id": "1", "slurm_step_id": "0"}
    assert workload.labels_for(999) == {}  # exited: no file
    assert workload.labels_for(0) == {} and workload.labels_for(None) == {}
    workload.labels_for(2)
    workload.labels_for(3)  # pid 1 falls out of the cache (max 2)
    workload.labels_for(1)
    assert workload.lookups == {"read": 4, "exited": 1, "no_pid": 2}
    workload.labels_for(1)
    assert workload.lookups["cached"] == 1
    now[0] = 11.0  # past the TTL: read again (a reused pid gets its new cgroup)
    (tmp_path / "1" / "cgroup").write_text("0::/user.slice\n")
    assert workload.labels_for(1) == {}
    # a real process that exited: its /proc entry is gone
    real = WorkloadLabels("/proc")
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        os._exit(0)
    os.waitpid(child, 0)
    assert real.labels_for(child) == {}
    assert real.lookups["exited"] == 1


@pytest.mark.parametrize(("text", "expected"), [
    ("", frozenset()), ("0", {0}), ("0, 1000,1001,", {0, 1000, 1001})])
def test_id_lists(text: str, expected: set[int]) -> None:
    assert parse_id_list(text) == expected


@pytest.mark.parametrize("text", ["root", "-1", "1.5", str(1 << 32)])
def test_bad_id_lists_raise(text: str) -> None:
    with pytest.raises(ValueError):
        parse_id_list(text)


def test_a_batch_is_split_each_record_with_its_sender(socket_dir: Path, caplog) -> None:
    path = socket_dir / "intake.sock"
    intake, table = _intake(path)
    steps = [StepRecord(rank=1, world_size=2, step=i, run="rb").encode() for i in range(6)]
    try:
        _send(path, encode_batch(steps[:3], run="rb", rank=1, dropped=0))
        _send(path, encode_batch(steps[3:], run="rb", rank=1, dropped=4))  # 4 lost meanwhile
        # a lying count refuses the whole batch, a bad record only itself
        _send(path, b"\n".join([b'{"v":1,"type":"batch","run":"rb","rank":1,"count":5,'
                                b'"dropped":4}', steps[0]]))
        _send(path, encode_batch([steps[0], b'{"v":1,"rank":9,"world_size":2,"step":1}'],
                                 run="rb", rank=1, dropped=4))
        assert wait_for(lambda: table.accepted == 7 and table.rejected["range"] == 1)
        assert table.rejected["schema"] == 1
        assert intake.batches == 3
        assert {s.pid for s in table.senders} == {os.getpid()}
        assert intake.sender_dropped == 4
        text = generate_latest(registry_of(intake)).decode()
        assert "laggard_intake_sender_dropped_total 4.0" in text
        warned = [r for r in caplog.records if "max_dgram_qlen" in r.getMessage()]
        assert len(warned) == 1 and warned[0].levelname == "WARNING"
        assert "sysctl -w net.unix.max_dgram_qlen=" in warned[0].getMessage()
    finally:
        intake.stop()
