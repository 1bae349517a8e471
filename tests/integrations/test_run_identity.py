"""Run identity on the training side: the resolver, rank 0's broadcast, the device identity."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from support import budget, torchrun

from laggard.integrations import run_identity
from laggard.integrations.run_identity import (
    DeviceIdentity,
    agree_run,
    device_identity,
    job_run,
    new_run_id,
    resolve_run,
)
from laggard.wire import MAX_RUN_LEN, check_run

HERE = Path(__file__).resolve().parent


@pytest.mark.parametrize(("config_run", "env", "expected"), [
    ("exp-7", {"TORCHELASTIC_RUN_ID": "abc", "SLURM_JOB_ID": "12"}, "exp-7"),
    (None, {"TORCHELASTIC_RUN_ID": "abc", "SLURM_JOB_ID": "12"}, "abc"),
    ("", {"TORCHELASTIC_RUN_ID": "none", "SLURM_JOB_ID": "12", "SLURM_STEP_ID": "3"}, "12.3"),
    (None, {"SLURM_JOB_ID": "12"}, "12"),
    (None, {"SLURM_JOB_ID": " ", "TORCHELASTIC_RUN_ID": ""}, None),
    (None, {}, None),
    ("my run\n", {}, "my_run_"),
])
def test_resolve_run_takes_config_then_torchelastic_then_slurm(config_run, env, expected):
    assert resolve_run(config_run, env) == expected


def test_a_long_or_odd_run_id_is_made_wire_safe_and_stays_distinct():
    a = resolve_run("x" * 10_000 + "a", {})
    b = resolve_run("x" * 10_000 + "b", {})
    assert a != b
    assert len(a) == MAX_RUN_LEN and check_run(a) == a
    odd = resolve_run("\x1b[31mred\x00", {})
    assert check_run(odd) == odd


def test_a_fresh_run_id_is_valid():
    run = new_run_id()
    assert check_run(run) == run
    assert new_run_id() != new_run_id()


def test_agree_run_without_a_process_group_keeps_or_makes_one():
    dist = SimpleNamespace(is_available=lambda: True, is_initialized=lambda: False)
    assert agree_run("abc", dist) == "abc"
    assert check_run(agree_run(None, dist))


def test_job_run_agrees_only_when_asked_and_a_failed_broadcast_keeps_the_ranks_own():
    errors: list[str] = []
    env = {"TORCHELASTIC_RUN_ID": "elastic-1"}

    def count(where: str, exc: BaseException) -> None:
        errors.append(where)

    def broken(*args, **kwargs):
        raise RuntimeError("connection reset")

    dist = SimpleNamespace(is_available=lambda: True, is_initialized=lambda: True,
                           get_world_size=lambda group=None: 2, get_rank=lambda group=None: 1,
                           broadcast_object_list=broken)
    assert job_run("", env, None, None, agree=True, count_error=count) == "elastic-1"
    assert job_run("mine", env, dist, None, agree=False, count_error=count) == "mine"
    assert job_run("", {}, dist, None, agree=False, count_error=count) == ""
    assert job_run("", env, dist, None, agree=True, count_error=count) == "elastic-1"
    assert errors == ["run"]


@pytest.mark.slow
def test_agree_run_on_a_real_three_rank_gloo_job(tmp_path):
    proc = torchrun(HERE / "run_identity_worker.py", 3, str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(3)]
    assert len({r["made"] for r in ranks}) == 1 and check_run(ranks[0]["made"])
    assert [r["differing"] for r in ranks] == ["rank0-env"] * 3
    # torchrun --standalone names a rendezvous id: every rank resolves (and agrees on) it.
    assert {r["from_env"] for r in ranks} == {ranks[0]["elastic"]}
    assert ranks[0]["elastic"] not in (None, "", "none")
    # Over a subgroup, the group's rank 0 (global rank 1) decides.
    assert [r["sub"] for r in ranks] == [None, "sub1", "sub1"]


def test_device_identity_is_none_on_cpu():
    assert device_identity("cpu") is None


def test_device_identity_from_cuda_properties(monkeypatch):
    import torch

    props = SimpleNamespace(uuid="5d1c0000-1111-2222-3333-444455556666", pci_domain_id=0,
                            pci_bus_id=0x9B, pci_device_id=0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    assert device_identity(torch.device("cuda", 3)) == DeviceIdentity(
        uuid="GPU-5d1c0000-1111-2222-3333-444455556666", pci_bus_id="00000000:9B:00.0")
    bare = SimpleNamespace(uuid="MIG-abc")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: bare)
    assert device_identity("cuda:0") == DeviceIdentity(uuid="MIG-abc", pci_bus_id=None)


def test_device_identity_never_raises(monkeypatch):
    import torch

    def broken(index):
        raise RuntimeError("CUDA error: no device")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", broken)
    assert device_identity(0) is None


def test_the_module_imports_no_torch():
    proc = subprocess.run(
        [sys.executable, "-c", "import sys, laggard.integrations.run_identity as m; "
         "print('torch' in sys.modules)"], capture_output=True, text=True, timeout=budget(60))
    assert proc.stdout.strip() == "False", proc.stderr
    assert run_identity.__doc__
