"""``/proc/PID/cgroup``: the workload a process is in (Kubernetes pod and container, Slurm job).

The file has one line per cgroup hierarchy, ``hierarchy-ID:controller-list:cgroup-path``
(``man 7 cgroups``): cgroup v1 lists one line per mounted hierarchy (``4:memory:/kubepods/...``,
``1:name=systemd:/...``), cgroup v2 a single ``0::/path`` line, and hybrid hosts both. The path
is relative to the *reader's* cgroup namespace, so an agent in a container of its own sees other
pods' paths as ``/../../kubepods-...`` (leading ``..`` components).

Layouts recognised (any prefix before them, e.g. kind's ``/kubelet.slice/kubelet-kubepods...``):

- kubelet, systemd cgroup driver: ``kubepods.slice/kubepods-burstable.slice/
  kubepods-burstable-pod<uid with _ for ->.slice/cri-containerd-<64 hex>.scope`` (guaranteed pods
  have no QoS slice: ``kubepods-pod<uid>.slice``); runtimes ``cri-containerd-``, ``crio-``,
  ``docker-`` (``crio-conmon-`` is CRI-O's monitor process, not the container: no container id);
- kubelet, cgroupfs driver: ``/kubepods/burstable/pod<uid>/<64 hex>`` (guaranteed:
  ``/kubepods/pod<uid>/<id>``);
- plain Docker: ``/docker/<64 hex>`` or ``/system.slice/docker-<64 hex>.scope``;
- Slurm (``proctrack/cgroup``, ``task/cgroup``): v1 ``/slurm/uid_<U>/job_<J>/step_<S>/task_<T>``
  (also ``/slurm_<node>/...`` for several slurmd per host), v2
  ``/system.slice/slurmstepd.scope/job_<J>/step_<S>/user/task_<T>``; steps ``batch``,
  ``extern``, ``interactive`` or a number.

Pure: text in, labels out (the agent reads the file, bounded, in ``agent/unix_intake.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields

#: Longest file text parsed (characters); a real file is a few hundred bytes.
MAX_CGROUP_TEXT = 64 * 1024
#: A pod UID in a cgroup name: 8-4-4-4-12 hex with ``-`` (cgroupfs) or ``_`` (systemd slices,
#: where ``-`` is the hierarchy separator), or 32 bare hex digits (a static pod's config hash).
_POD_UID = (r"(?P<uid>[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
            r"|[0-9a-f]{32})")
#: The pod component: ``kubepods[-qos]-pod<uid>.slice`` (systemd; kind prefixes ``kubelet-``) or
#: ``pod<uid>`` (cgroupfs).
_POD = re.compile(rf"(?:[a-z0-9-]*kubepods(?:-besteffort|-burstable)?-)?pod{_POD_UID}"
                  r"(?:\.slice)?")
#: A container component: ``<runtime>-<id>.scope`` (systemd) or the bare id (cgroupfs).
_CONTAINER = re.compile(r"(?:(?P<runtime>cri-containerd|crio|docker)-)?(?P<id>[0-9a-f]{64})"
                        r"(?:\.scope)?")
_RUNTIMES = {"cri-containerd": "containerd", "crio": "cri-o", "docker": "docker"}
_SLURM_JOB = re.compile(r"job_(?P<job>[0-9]{1,12})")
_SLURM_STEP = re.compile(r"step_(?P<step>[0-9]{1,12}|batch|extern|interactive)")


@dataclass(frozen=True, slots=True)
class CgroupEntry:
    """One line of ``/proc/PID/cgroup``.

    Attributes:
        hierarchy_id: 0 for the cgroup v2 unified hierarchy, >= 1 for a v1 hierarchy.
        controllers: v1 controllers bound to it (``("cpu", "cpuacct")``, ``("name=systemd",)``);
            empty for v2.
        path: the cgroup's path, relative to the reader's cgroup namespace root.
    """

    hierarchy_id: int
    controllers: tuple[str, ...]
    path: str


@dataclass(frozen=True, slots=True)
class WorkloadIdentity:
    """What a process's cgroup says about the workload it runs in; None where it says nothing.

    Attributes:
        pod_uid: Kubernetes pod UID, dashed (``metadata.uid``), or a static pod's 32-hex hash.
        container_id: 64-hex container id, as in the pod status' ``containerID`` after the
            ``containerd://`` (or ``cri-o://``, ``docker://``) prefix.
        container_runtime: ``containerd``, ``cri-o`` or ``docker`` where the cgroup name says.
        slurm_job_id: the Slurm job id (``SLURM_JOB_ID``), decimal.
        slurm_step_id: the job step: a number, ``batch``, ``extern`` or ``interactive``.
    """

    pod_uid: str | None = None
    container_id: str | None = None
    container_runtime: str | None = None
    slurm_job_id: str | None = None
    slurm_step_id: str | None = None

    def labels(self) -> dict[str, str]:
        """The fields that are set, as ``laggard_rank_info`` labels (name -> value)."""
        return {f.name: value for f in fields(self)
                if (value := getattr(self, f.name)) is not None}


def parse_cgroup_entries(text: str) -> list[CgroupEntry]:
    """The lines of a ``/proc/PID/cgroup`` file, in file order.

    Lines that are not ``ID:controllers:/path`` with a numeric ID and an absolute path are
    skipped (a truncated last line, garbage); only the first :data:`MAX_CGROUP_TEXT`
    characters are read.

    Args:
        text: the file's contents.

    Returns:
        One entry per well-formed line.
    """
    entries = []
    for line in text[:MAX_CGROUP_TEXT].splitlines():
        # The path may itself hold ':' (cgroup names are free text): split twice only.
        fields = line.split(":", 2)
        if len(fields) != 3 or not fields[0].isdigit() or not fields[2].startswith("/"):
            continue
        controllers = tuple(c for c in fields[1].split(",") if c)
        entries.append(CgroupEntry(int(fields[0]), controllers, fields[2]))
    return entries


def parse_cgroup(text: str) -> WorkloadIdentity:
    """The workload identity in a ``/proc/PID/cgroup`` file.

    The v2 line is read first, then the v1 lines (``name=systemd`` first, then in file order);
    each field comes from the first line that has it, so a hybrid host whose v1 ``memory`` line
    names the pod and whose v2 line is ``0::/`` still gives the pod.

    Args:
        text: the file's contents (v1, v2 or hybrid).

    Returns:
        The identity; all None for a process outside any pod or job (a bare-metal daemon, a
        file of garbage).
    """
    entries = parse_cgroup_entries(text)
    ordered = sorted(entries, key=lambda e: (e.hierarchy_id != 0,
                                             "name=systemd" not in e.controllers))
    found: dict[str, str] = {}
    for entry in ordered:
        for name, value in _path_identity(entry.path).items():
            found.setdefault(name, value)
    return WorkloadIdentity(**found)


def _path_identity(path: str) -> dict[str, str]:
    """The identity fields one cgroup path gives (WorkloadIdentity field -> value)."""
    components = [c for c in path.split("/") if c and c != ".."]
    found: dict[str, str] = {}
    pod_index = None
    for i, component in enumerate(components):
        pod = _POD.fullmatch(component)
        if pod is not None and _under_kubepods(components[:i], component):
            found["pod_uid"] = pod["uid"].replace("_", "-")
            pod_index = i
    if pod_index is not None:
        for component in components[pod_index + 1:]:
            container = _CONTAINER.fullmatch(component)
            if container is not None:
                found["container_id"] = container["id"]
                if container["runtime"]:
                    found["container_runtime"] = _RUNTIMES[container["runtime"]]
                break
    elif components and components[0] == "docker" or any(
            c.startswith("docker-") for c in components):
        for component in components:
            container = _CONTAINER.fullmatch(component)
            if container is not None:
                found["container_id"] = container["id"]
                found["container_runtime"] = "docker"
                break
    if _is_slurm(components):
        for component in components:
            job = _SLURM_JOB.fullmatch(component)
            step = _SLURM_STEP.fullmatch(component)
            if job is not None:
                found.setdefault("slurm_job_id", job["job"])
            elif step is not None and "slurm_job_id" in found:
                found.setdefault("slurm_step_id", step["step"])
    return found


def _under_kubepods(parents: list[str], component: str) -> bool:
    """Whether a ``pod<uid>`` component sits in the kubelet's tree (not any dir named pod...)."""
    if "kubepods" in component:
        return True
    # cgroupfs driver: /kubepods/pod<uid> or /kubepods/<qos>/pod<uid>; a cgroup namespace may
    # have cut the kubepods component off, leaving only the QoS class above the pod.
    return bool(parents) and (parents[-1] in ("kubepods", "besteffort", "burstable")
                              or "kubepods" in parents)


def _is_slurm(components: list[str]) -> bool:
    """Whether a path is in slurmd's tree: ``slurm``/``slurm_<node>`` (v1) or slurmstepd's scope
    (v2), or (cut by a cgroup namespace) starts at the job's own cgroup."""
    return any(c == "slurm" or c.startswith("slurm_") or c == "slurmstepd.scope"
               for c in components) or bool(components and _SLURM_JOB.fullmatch(components[0]))
