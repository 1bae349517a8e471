"""``/proc/PID/cgroup`` (``man 7 cgroups``): workload identity from fixture files in the
kubelet's layouts (systemd and cgroupfs drivers; containerd, CRI-O, Docker; a cgroup namespace's
relative view; kind's nesting), Slurm's (v1 ``/slurm/uid_N/job_M``, v2 ``slurmstepd.scope``),
plain Docker and bare metal, cgroup v1, v2 and hybrid; garbage and cut files skipped."""

from __future__ import annotations

import pytest
from support import FIXTURES

from laggard.parsers.cgroup import (
    MAX_CGROUP_TEXT,
    CgroupEntry,
    WorkloadIdentity,
    parse_cgroup,
    parse_cgroup_entries,
)

DIR = FIXTURES / "cgroup"
POD = "3b1e2c4d-5f6a-4b8c-9d0e-1f2a3b4c5d6e"
CONTAINER = "8f9c2d1e4b7a6c5d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d"
CRIO_POD = "7c0a9e11-2b3d-4e5f-8a9b-0c1d2e3f4a5b"
CRIO_CONTAINER = "4e6f8a0b2c4d6e8f0a1b3c5d7e9f1a2b4c6d8e0f2a4b6c8d0e1f3a5b7c9d1e2f"


def _parse(name: str) -> WorkloadIdentity:
    return parse_cgroup((DIR / name).read_text())


@pytest.mark.parametrize(("name", "expected"), [
    ("k8s_v2_systemd_burstable_containerd",
     WorkloadIdentity(pod_uid=POD, container_id=CONTAINER, container_runtime="containerd")),
    ("k8s_v2_systemd_guaranteed_crio",
     WorkloadIdentity(pod_uid=CRIO_POD, container_id=CRIO_CONTAINER, container_runtime="cri-o")),
    # CRI-O's monitor process is in the pod but is not the container
    ("k8s_v2_systemd_crio_conmon", WorkloadIdentity(pod_uid=CRIO_POD)),
    ("k8s_v2_seen_from_a_cgroup_namespace",
     WorkloadIdentity(pod_uid="0d4c5b6a-7e8f-4a1b-9c2d-3e4f5a6b7c8d", container_id=CONTAINER,
                      container_runtime="containerd")),
    ("k8s_v2_kind_nested",
     WorkloadIdentity(pod_uid=POD, container_id=CONTAINER, container_runtime="containerd")),
    # cgroupfs names the container by its bare id: the runtime is not said
    ("k8s_v1_cgroupfs_burstable_docker", WorkloadIdentity(pod_uid=POD, container_id=CONTAINER)),
    ("k8s_v1_systemd_besteffort_docker",
     WorkloadIdentity(pod_uid=POD, container_id=CONTAINER, container_runtime="docker")),
    ("docker_v1_cgroupfs", WorkloadIdentity(container_id=CONTAINER, container_runtime="docker")),
    ("slurm_v1_step", WorkloadIdentity(slurm_job_id="4242", slurm_step_id="0")),
    ("slurm_v1_multiple_slurmd_batch", WorkloadIdentity(slurm_job_id="917",
                                                        slurm_step_id="batch")),
    ("slurm_v2_step", WorkloadIdentity(slurm_job_id="123456", slurm_step_id="7")),
    ("slurm_v2_extern", WorkloadIdentity(slurm_job_id="123456", slurm_step_id="extern")),
    ("bare_metal_v1", WorkloadIdentity()),
    ("bare_metal_v2", WorkloadIdentity()),
])
def test_layouts(name: str, expected: WorkloadIdentity) -> None:
    assert _parse(name) == expected


def test_labels_hold_only_what_the_cgroup_says() -> None:
    assert _parse("slurm_v2_step").labels() == {"slurm_job_id": "123456", "slurm_step_id": "7"}
    assert _parse("k8s_v2_systemd_burstable_containerd").labels() == {
        "pod_uid": POD, "container_id": CONTAINER, "container_runtime": "containerd"}
    assert _parse("bare_metal_v2").labels() == {}


def test_entries_of_a_v1_file_keep_controllers_and_order() -> None:
    entries = parse_cgroup_entries((DIR / "k8s_v1_cgroupfs_burstable_docker").read_text())
    assert len(entries) == 13
    assert entries[2] == CgroupEntry(10, ("net_cls", "net_prio"),
                                     f"/kubepods/burstable/pod{POD}/{CONTAINER}")
    assert entries[10] == CgroupEntry(2, ("rdma",), "/")
    assert entries[-1] == CgroupEntry(0, (), "/")


def test_hybrid_host_takes_the_pod_from_v1_when_v2_says_root() -> None:
    # hybrid: the v2 line is 0::/ (nothing), the v1 lines name the pod
    text = (DIR / "k8s_v1_cgroupfs_burstable_docker").read_text()
    assert text.splitlines()[-1] == "0::/"
    assert parse_cgroup(text).pod_uid == POD


def test_the_v2_line_wins_over_v1_lines() -> None:
    text = ("4:memory:/kubepods/burstable/pod11111111-2222-3333-4444-555555555555/"
            f"{CONTAINER}\n"
            f"0::/kubepods.slice/kubepods-pod{POD.replace('-', '_')}.slice/"
            f"cri-containerd-{CONTAINER}.scope\n")
    assert parse_cgroup(text).pod_uid == POD


def test_a_pod_like_name_outside_the_kubelets_tree_is_not_a_pod() -> None:
    text = f"0::/user.slice/pod{POD}/{CONTAINER}\n"
    assert parse_cgroup(text) == WorkloadIdentity()
    # a job_N directory outside slurmd's tree is not a Slurm job
    assert parse_cgroup("0::/user.slice/backup/job_12/step_1\n") == WorkloadIdentity()


def test_static_pod_uid_is_a_config_hash() -> None:
    text = ("0::/kubepods.slice/kubepods-burstable.slice/"
            "kubepods-burstable-pod6f8c1b2a3d4e5f60718293a4b5c6d7e8.slice/"
            f"cri-containerd-{CONTAINER}.scope\n")
    assert parse_cgroup(text).pod_uid == "6f8c1b2a3d4e5f60718293a4b5c6d7e8"


@pytest.mark.parametrize("text", [
    "", "\n\n", "garbage", "x:y:z", "0::relative/path", ":::", "\x00\xff" * 100,
    "4:memory", "0::/kubepods.slice/kubepods-pod12", "0::/kubepods/pod" + "f" * 31,
])
def test_garbage_and_cut_files_give_no_identity(text: str) -> None:
    assert parse_cgroup(text) == WorkloadIdentity()


def test_a_cut_last_line_leaves_the_whole_lines() -> None:
    text = (DIR / "slurm_v1_step").read_text()
    cut = text[: text.index("job_4242/step_0/task_3") + 3]  # "11:freezer:/slurm/uid_1000/job"
    assert parse_cgroup(cut) == WorkloadIdentity()
    assert parse_cgroup(text[:-20]).slurm_job_id == "4242"


def test_huge_input_is_read_only_up_to_the_cap() -> None:
    text = "0::/user.slice\n" * (MAX_CGROUP_TEXT // 10) + \
        f"0::/kubepods/pod{POD}/{CONTAINER}\n"
    assert parse_cgroup(text) == WorkloadIdentity()


def test_this_machines_own_file_parses() -> None:
    try:
        with open("/proc/self/cgroup") as f:
            text = f.read()
    except OSError:
        pytest.skip("no /proc/self/cgroup")
    assert parse_cgroup_entries(text)
    parse_cgroup(text)
