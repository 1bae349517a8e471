"""SenderIdentity: who sent a datagram, as the operating system (not the datagram) says.

The agent's socket (a Unix datagram socket) learns the sender's pid, uid and gid from the kernel
(``SCM_CREDENTIALS``) and its workload labels from the sender's cgroup (``laggard.parsers.cgroup``:
Kubernetes pod UID and container id, Slurm job id). The optional UDP intake knows none of that
and passes ``None``.

The labels become labels of ``laggard_rank_info`` only, so that no other series multiplies.
The uid (and the Slurm job of the cgroup) also own a run label on the agent: see
:meth:`SenderIdentity.owner_cgroup` and docs/agent.md, "Threat model".
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

#: Most workload labels one sender carries onto ``laggard_rank_info``; further ones are left out.
MAX_SENDER_LABELS = 8
#: Longest workload label value kept; a longer one is cut to this length.
MAX_SENDER_LABEL_VALUE_LEN = 128
#: A workload label name: Prometheus' label-name grammar, lower case, without the reserved
#: ``__`` prefix, and never one of the series' own labels.
_LABEL_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")
#: Names the rank info series already has (or Prometheus owns): a sender label cannot take them.
RESERVED_LABELS = frozenset({"run", "rank", "local_rank", "node", "gpu", "uuid", "pci_bus_id",
                             "world_size", "job", "instance"})


@dataclass(frozen=True, slots=True)
class SenderIdentity:
    """What the kernel says about the process that sent a datagram.

    Attributes:
        pid: sender's process id (``SCM_CREDENTIALS``), None where unknown.
        uid: sender's user id, None where unknown.
        gid: sender's group id, None where unknown.
        labels: workload label name -> value from the sender's cgroup (``pod_uid``,
            ``container_id``, ``slurm_job_id``...); exported on ``laggard_rank_info`` only.
            Empty when the cgroup says nothing (a bare-metal process, a process that exited).
    """

    pid: int | None = None
    uid: int | None = None
    gid: int | None = None
    labels: dict[str, str] = field(default_factory=dict)

    def __hash__(self) -> int:
        return hash((self.pid, self.uid, self.gid, tuple(sorted(self.labels.items()))))

    def owner_cgroup(self) -> str | None:
        """The part of the sender's cgroup that owns a run with its uid: ``slurm_job_id=<J>``
        where the cgroup names a Slurm job, else None.

        Only the job, not the whole cgroup path: under Slurm's ``task/cgroup`` each rank has a
        cgroup of its own (``job_J/step_S/task_T``), and a Kubernetes job runs one pod (one
        cgroup) per rank or per group of ranks; the ranks of one run must all own it. Two Slurm
        jobs of one user on a node are told apart; Kubernetes pods only by their uid.
        """
        job = self.labels.get("slurm_job_id")
        return f"slurm_job_id={job}" if isinstance(job, str) and job else None

    def workload_labels(self) -> dict[str, str]:
        """The labels safe to export: valid names not reserved, at most
        :data:`MAX_SENDER_LABELS` (first by name), values cut to
        :data:`MAX_SENDER_LABEL_VALUE_LEN` characters and stripped of control characters.
        """
        safe: dict[str, str] = {}
        for name in sorted(self.labels):
            value = self.labels[name]
            if (not isinstance(name, str) or not isinstance(value, str)
                    or not _LABEL_NAME.fullmatch(name) or name in RESERVED_LABELS):
                continue
            safe[name] = "".join(c for c in value if c.isprintable())[:MAX_SENDER_LABEL_VALUE_LEN]
            if len(safe) >= MAX_SENDER_LABELS:
                break
        return safe
