"""No host-device synchronisation on the hot path (issue 27, item 8), checked on CPU.

1. The host-read list: every hook's step (and the integrity hooks and window read) runs with its
   device branches forced on CPU tensors under a ``TorchFunctionMode`` that records each
   ``bool()``/``item()``/``tolist()``/``numpy()``/... made from laggard's code
   (:class:`laggard.compression.sync_check.HostReadRecorder`); a read not in :data:`ALLOWED`
   fails the test, and so does an allowed one that is no longer made (the list stays true).
2. The device branches compute what the CPU branches compute: the same hooks, with and without
   the branch forced, on the same buckets (finite, NaN, Inf), give the same results, residuals,
   Q matrices and counts, bit for bit where the arithmetic is the same.
3. The integrity recorder's device records: read one window late, pending ones counted.
4. The GPU check's CPU-skip path.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from laggard.compression import make_hook
from laggard.compression.bucket import FlatBucket
from laggard.compression.residuals import BucketLayout
from laggard.compression.sync_check import (
    HostRead,
    HostReadRecorder,
    run_sync_check,
    scenarios,
)
from laggard.detectors.integrity import IntegrityDetector, decode_window
from laggard.integrations import device_reads
from laggard.integrations.device_reads import DeviceCount, device_path
from laggard.integrations.integrity import GradientIntegrity
from laggard.integrations.integrity_hooks import (
    IntegrityHookState,
    integrity_allreduce_hook,
    with_integrity,
)

#: The host reads left on the hot path with the device branches on, each with its reason. A new
#: read fails the test: make the decision on the device, or add it here with its reason.
ALLOWED: dict[HostRead, str] = {
    HostRead("integrations/integrity.py:window_vector", "tolist"):
        "the pinned host copy of a device record, read after its event's query() said the copy "
        "has run: a CPU tensor (on CPU the forced branch clones instead)",
    HostRead("compression/onebit_adam.py:steps", "__int__"):
        "AdamW's per-parameter step counter: a CPU tensor (foreach=False, not capturable), "
        "so reading it is free on a GPU too",
    HostRead("compression/onebit_adam.py:step", "__bool__"):
        "OneBitAdam.step reads the step's shared NaN verdict once per step, after backward(), "
        "to leave the parameters alone (as torch's GradScaler reads found_inf); not in a hook",
}

#: Scenario -> the allowed reads it is expected to make (the rest make none but the window read).
EXPECTED = {
    "onebit_adam": {HostRead("compression/onebit_adam.py:steps", "__int__")},
    "topk_momentum": {HostRead("compression/onebit_adam.py:steps", "__int__")},
    "onebit_adam.optimizer_step": {HostRead("compression/onebit_adam.py:step", "__bool__")},
    "topk_momentum.optimizer_step": {HostRead("compression/onebit_adam.py:step", "__bool__")},
}
WINDOW_READ = HostRead("integrations/integrity.py:window_vector", "tolist")


def run_recorded(name: str, forced: bool) -> dict[HostRead, int]:
    prepare = scenarios(torch.device("cpu"))[name]
    recorder = HostReadRecorder()
    if forced:
        with device_path():
            step, close = prepare()
            with recorder.patch_workers(), recorder:
                step()
    else:
        step, close = prepare()
        with recorder.patch_workers(), recorder:
            step()
    close()
    return recorder.reads


@pytest.mark.parametrize("name", list(scenarios(torch.device("cpu"))))
def test_host_reads_on_the_hot_path_are_the_allowed_ones(one_rank_group: None,
                                                         name: str) -> None:
    reads = run_recorded(name, forced=True)
    new = {read: count for read, count in reads.items() if read not in ALLOWED}
    assert not new, f"{name}: host reads not on the allow-list (each is a GPU sync): {new}"
    expected = EXPECTED.get(name, {WINDOW_READ})
    assert set(reads) == expected, f"{name}: allow-list out of date, reads {set(reads)}"


def test_the_recorder_sees_reads_on_every_thread_of_a_hook(one_rank_group: None) -> None:
    """Control: on the CPU path the same steps read (numpy views, bools); the recorder sees
    them in the hook, in a collective's callback and on the second-stage worker thread."""
    reads = {read.where for read in run_recorded("topk_scatter", forced=False)}
    assert "compression/base.py:all_finite" in reads  # the hook (autograd thread)
    assert "compression/topk.py:scatter_rows" in reads  # the worker thread's decode
    reads = {read.where for read in run_recorded("topk", forced=False)}
    assert "compression/topk.py:flagged" in reads  # the all-gather's then() callback


# --------------------------------------------------------- the device branches, on CPU
def params() -> list[torch.nn.Parameter]:
    return [torch.nn.Parameter(torch.zeros(300, 400)), torch.nn.Parameter(torch.zeros(7))]


def buckets() -> list[torch.Tensor]:
    g = [torch.randn(120_007, generator=torch.Generator().manual_seed(s)) for s in (0, 1, 2)]
    nan, inf = g[1].clone(), g[1].clone()
    nan[17], inf[99_000] = float("nan"), float("-inf")
    return [g[0], nan, g[1], inf, g[2]]


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit for bit, NaNs included (``torch.equal`` says NaN != NaN)."""
    return a.shape == b.shape and torch.equal(a.view(torch.int32), b.view(torch.int32)) \
        if a.dtype == torch.float32 else torch.equal(a, b)


@pytest.mark.parametrize("name, options", [
    ("topk", {"algorithm": "allgather"}), ("topk", {"algorithm": "scatter"}),
    ("sign", {}), ("powersgd", {}),
])
def test_device_branches_compute_what_the_cpu_branches_do(one_rank_group: None, name: str,
                                                          options: dict) -> None:
    ps = params()
    module = torch.nn.ParameterList(ps)
    host_state, hook = make_hook(name, model=module, **options)
    device_state, _ = make_hook(name, model=module, **options)
    layout = BucketLayout.of(FlatBucket(0, ps))
    for g in buckets():
        expected = hook(host_state, FlatBucket(0, ps, g.clone())).wait()
        with device_path():
            got = hook(device_state, FlatBucket(0, ps, g.clone())).wait()
        if torch.isfinite(g).all():
            assert same(got, expected)
        else:
            assert torch.isnan(got).all() and torch.isnan(expected).all()
        assert same(device_state.residuals.flat(0, layout), host_state.residuals.flat(0, layout))
    if name == "powersgd":
        assert all(same(device_state._q[k], q) for k, q in host_state._q.items())
    assert device_state.nonfinite_buckets == host_state.nonfinite_buckets == 2
    host_state.close()
    device_state.close()


@pytest.mark.parametrize("name", ["onebit_adam", "topk_momentum"])
def test_device_branches_skip_the_same_steps_in_the_optimizers(one_rank_group: None,
                                                               name: str) -> None:
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    def run(forced: bool) -> tuple[list[torch.Tensor], int]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                    torch.nn.Linear(64, 4))
        ddp = DistributedDataParallel(model, bucket_cap_mb=0.001)
        if name == "onebit_adam":
            state, hook = make_hook("onebit_adam", model=model, warmup_steps=2, lr=3e-3)
        else:
            state, hook = make_hook("topk", model=model, momentum=True, warmup_steps=2,
                                    lr=3e-3)
        ddp.register_comm_hook(state, hook)
        with device_path() if forced else contextlib.nullcontext():
            for step in range(6):
                x = torch.randn(16, 32, generator=torch.Generator().manual_seed(step))
                if step in (1, 4):  # one NaN in the warm-up, one after the freeze
                    x[0, 0] = float("nan")
                F.mse_loss(ddp(x), torch.tanh(x[:, :4])).backward()
                state.optimizer.step()
                state.optimizer.zero_grad(set_to_none=True)
        state.close()
        return [p.detach().clone() for p in model.parameters()], state.optimizer.nonfinite_steps

    (host, host_skipped), (device, device_skipped) = run(False), run(True)
    assert host_skipped == device_skipped == 2
    for a, b in zip(host, device, strict=True):
        # the same steps were taken; 1-bit Adam's torch encoder rounds its scale differently
        # from the CPU kernel's reassociated float32 sum (~1e-6 relative)
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def test_device_count_adds_on_the_device_and_reads_when_asked() -> None:
    count = DeviceCount()
    count.add(2)
    assert count.value() == 2 and count.lagged() == 2
    count.add(torch.tensor(True))
    count.add(torch.tensor(False))
    assert count.lagged() == 2  # the first lagged read starts the copy, returns what it had
    assert count.lagged() == 3 == count.value()


# ------------------------------------------------------- the integrity recorder on a device
def test_integrity_device_records_equal_the_host_records_one_window_late(
        one_rank_group: None) -> None:
    ps = params()
    g = buckets()

    def record(forced: bool) -> tuple[GradientIntegrity, list[list[int]]]:
        integrity = GradientIntegrity(GradientIntegrity.Config(replica_every=1))
        # sign: its payload bytes are the same on both branches (top-k's device selection
        # orders its k entries differently, so its hashes differ)
        state, hook = make_hook("sign", model=torch.nn.ParameterList(ps), integrity=integrity)
        wrapped, hook_state = with_integrity(hook), IntegrityHookState(integrity, state)
        plain = IntegrityHookState(integrity)
        windows = []
        with device_path() if forced else contextlib.nullcontext():
            for _ in range(2):
                for b in g[:2]:
                    wrapped(hook_state, FlatBucket(0, ps, b.clone())).wait()
                    integrity_allreduce_hook(plain, FlatBucket(1, ps, b.clone())).wait()
                integrity.end_step(torch.nn.ParameterList(ps))
                windows.append(integrity.window_vector().tolist())
            windows.append(integrity.window_vector().tolist())
        state.close()
        return integrity, windows

    _, host = record(False)
    integrity, device = record(True)
    assert decode_window(device[0]).records == ()  # window 0's records are held ...
    for late, on_time in ((device[1], host[0]), (device[2], host[1])):  # ... and come next
        assert sorted(decode_window(late).records, key=lambda r: r.key) == \
            sorted(decode_window(on_time).records, key=lambda r: r.key)
    ops = {record.key[3] for record in decode_window(device[2]).records}
    assert ops == {1, 2, 3, 4, 5}  # allreduce, allgather, alltoall, result, replica
    assert integrity.pending_records == 0 and integrity.errors == 0


def test_pending_device_records_are_left_out_counted_and_explained(
        one_rank_group: None, monkeypatch: pytest.MonkeyPatch) -> None:
    class NeverDone:
        def query(self) -> bool:
            return False

        def synchronize(self) -> None:
            raise AssertionError("the window read must never wait")

    monkeypatch.setattr(device_reads, "make_cpu_event", NeverDone)
    integrity = GradientIntegrity(GradientIntegrity.Config(replica_every=0))
    state = IntegrityHookState(integrity)
    with device_path():
        integrity_allreduce_hook(state, FlatBucket(0, params(), buckets()[0])).wait()
        integrity.end_step()
        integrity.window_vector()
        late = integrity.window_vector()  # the held record is still "on the device"
    message = decode_window(late.tolist())
    assert message.records == () and message.pending == 1 == integrity.pending_records
    findings = IntegrityDetector().update([late.tolist()])
    assert [f.evidence.get("pending") for f in findings] == [1]
    assert findings[0].severity.value == "info"


# --------------------------------------------------------------------- the GPU check
def test_sync_check_skips_without_a_gpu_and_says_nothing_was_checked() -> None:
    report = run_sync_check("cpu")
    assert "not CUDA" in report["skipped"] and report["synced"][0].startswith("not checked")
    if not torch.cuda.is_available():
        assert "no GPU" in run_sync_check("cuda")["skipped"]
    with pytest.raises(ValueError, match="mode must be"):
        run_sync_check("cuda", mode="loud")


def test_sync_check_reports_every_synchronising_call_it_sees(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU path's bookkeeping, on fakes: a scenario whose step warns as torch's sync debug
    mode does, one that raises, one clean, one optimizer step (expected)."""
    import warnings

    from laggard.compression import sync_check

    modes: list[str] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", modes.append)
    monkeypatch.setattr(sync_check, "ensure_group", lambda device: None)

    def syncing() -> None:
        warnings.warn("called a synchronizing CUDA operation", UserWarning, stacklevel=1)

    def failing() -> None:
        raise RuntimeError("called a synchronizing CUDA operation")

    def scenario(step):  # type: ignore[no-untyped-def]
        return lambda: (step, lambda: None)

    monkeypatch.setattr(sync_check, "scenarios", lambda device: {
        "clean": scenario(lambda: None), "syncing": scenario(syncing),
        "failing": scenario(failing), "x.optimizer_step": scenario(syncing)})
    report = sync_check.run_sync_check("cuda", mode="warn")
    assert [s.split(":")[0] for s in report["synced"]] == ["syncing", "failing"]
    assert len(report["expected"]) == 1 and report["results"]["clean"]["syncs"] == []
    assert modes.count("warn") == 4 and modes[-1] == "default"
