"""A real one-node Slurm cluster for tests: munged, slurmctld and slurmd from Debian's slurm-wlm.

:func:`start_slurm` generates a munge key and a ``slurm.conf`` in a temporary directory (its own
munge socket, its own ports, state and spool directories) naming this machine as the one node,
starts ``munged``, ``slurmctld`` and ``slurmd`` in the foreground, and waits until the controller
answers and the node registered. A part that cannot start is a ``pytest.skip`` carrying its exact
error (a missing binary, the daemon's last log lines), never a silent pass; slurmd is optional
(``SlurmCluster.slurmd_error`` says why it is not running; scontrol drains a node either way).

Use the ``slurm_cluster`` fixture (``from support_slurm import slurm_cluster  # noqa: F401``).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from support import budget, wait_for

from laggard.actions.slurm import NodeState, parse_show_node
from laggard.demo.harness import free_port

_BINARIES = ("munged", "mungekey", "slurmctld", "slurmd", "scontrol", "sinfo")

_CONF = """\
ClusterName=laggardtest
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
AuthInfo=socket={dir}/munge.sock
CryptoType=crypto/munge
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmUser=root
SlurmdUser=root
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/builtin
SelectType=select/linear
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=laggard Nodes={node} Default=YES MaxTime=INFINITE State=UP
"""


@dataclass
class SlurmCluster:
    """A running one-node cluster.

    Attributes:
        node: the node's name (this machine's short host name).
        dir: the directory holding the key, the conf, the state and the logs.
        env: ``SLURM_CONF`` for scontrol and sinfo (pass it to the process under test).
        slurmd_error: why slurmd is not running ("" when it is).
    """

    node: str
    dir: Path
    env: dict[str, str]
    procs: list[subprocess.Popen] = field(default_factory=list)
    slurmd_error: str = ""

    def run(self, *cmd: str) -> subprocess.CompletedProcess:
        """Run a Slurm client command against this cluster (fails the test on a non-zero exit)."""
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=budget(20),
                              env={**os.environ, **self.env}, check=False)
        assert done.returncode == 0, f"{' '.join(cmd)}: {done.stderr or done.stdout}"
        return done

    def sinfo_reasons(self) -> str:
        """``sinfo -R`` as ``node|reason`` lines (empty when no node is drained or down)."""
        return self.run("sinfo", "-R", "-h", "-o", "%n|%E").stdout

    def state(self) -> NodeState:
        """The node's state and reason from ``scontrol -o show node``."""
        return parse_show_node(self.run("scontrol", "-o", "show", "node", self.node).stdout)

    def drain_as_someone_else(self, reason: str) -> None:
        """Drain the node as an operator would, by hand."""
        self.run("scontrol", "update", f"nodename={self.node}", "state=drain",
                 f"reason={reason}")

    def stop(self) -> None:
        """Stop the daemons (SIGTERM, then SIGKILL after ``budget(10)`` s), newest first."""
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=budget(10))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _log_tail(path: Path, lines: int = 8) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return str(exc)


def _start(cluster: SlurmCluster, name: str, cmd: list[str]) -> subprocess.Popen:
    log = open(cluster.dir / f"{name}.log", "wb")  # noqa: SIM115 - the daemon owns it
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, **cluster.env})
    log.close()
    cluster.procs.append(proc)
    return proc


def start_slurm() -> SlurmCluster:
    """Start munged, slurmctld and (where it runs) slurmd; see the module's docstring.

    Raises:
        pytest.skip.Exception: a binary is missing, or munged or slurmctld did not start (the
            message holds the command and the last lines of its log).
    """
    missing = [b for b in _BINARIES if shutil.which(b) is None]
    if missing:
        pytest.skip(f"slurm-wlm/munge not installed: {', '.join(missing)} not on PATH "
                    "(apt-get install slurm-wlm munge)")
    # A short path: the munge socket's path must fit a sockaddr_un (108 bytes).
    root = Path(tempfile.mkdtemp(prefix="laggard-slurm-"))
    (root / "state").mkdir()
    (root / "spool").mkdir()
    node = socket.gethostname().split(".")[0]
    conf = root / "slurm.conf"
    conf.write_text(_CONF.format(node=node, dir=root, ctld_port=free_port(),
                                 slurmd_port=free_port(), cpus=os.cpu_count() or 1))
    cluster = SlurmCluster(node=node, dir=root, env={"SLURM_CONF": str(conf)})
    try:
        _start_daemons(cluster, conf)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _start_daemons(cluster: SlurmCluster, conf: Path) -> None:
    root = cluster.dir
    key = subprocess.run(["mungekey", "--create", f"--keyfile={root}/munge.key"],
                         capture_output=True, text=True, check=False)
    if key.returncode != 0:
        pytest.skip(f"mungekey --create: {key.stderr.strip()}")
    munged = _start(cluster, "munged", [
        "munged", "--foreground", "--force", f"--socket={root}/munge.sock",
        f"--key-file={root}/munge.key", f"--pid-file={root}/munged.pid",
        f"--seed-file={root}/munged.seed"])
    if not wait_for(lambda: (root / "munge.sock").exists() or munged.poll() is not None, 10) \
            or munged.poll() is not None:
        pytest.skip(f"munged did not start: {_log_tail(root / 'munged.log')}")
    ctld = _start(cluster, "slurmctld", ["slurmctld", "-D", "-i", "-f", str(conf)])

    def controller_up() -> bool:
        if ctld.poll() is not None:
            return True
        ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True,
                              env={**os.environ, **cluster.env}, check=False)
        time.sleep(0.2)
        return "is UP" in ping.stdout

    if not wait_for(controller_up, 20) or ctld.poll() is not None:
        pytest.skip(f"slurmctld did not start: {_log_tail(root / 'slurmctld.log')}")
    slurmd = _start(cluster, "slurmd", ["slurmd", "-D", "-f", str(conf), "-N", cluster.node])

    def registered() -> bool:
        if slurmd.poll() is not None:
            return True
        state = cluster.state().state.upper()
        return state.startswith("IDLE") and "NOT_RESPONDING" not in state

    if not wait_for(registered, 20) or slurmd.poll() is not None:
        cluster.slurmd_error = f"slurmd did not register: {_log_tail(root / 'slurmd.log')}"


@pytest.fixture
def slurm_cluster() -> Iterator[SlurmCluster]:
    """A running one-node Slurm cluster (:func:`start_slurm`), stopped and removed after."""
    cluster = start_slurm()
    yield cluster
    cluster.stop()
    shutil.rmtree(cluster.dir, ignore_errors=True)
