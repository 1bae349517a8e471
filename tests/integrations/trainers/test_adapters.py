"""The trainer adapters in real 2-rank gloo jobs of each trainer (Lightning, Hugging Face
Trainer): same loss bit for bit with and without the adapter, every step recorded with its
phases, the DDP buckets traced. Skipped when the ``trainers`` extra is not installed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).parent


def run_job(worker: Path, out_dir: Path, ranks: int = 2,
            timeout: int = 240) -> list[dict[str, Any]]:
    """Launch ``worker`` on ``ranks`` gloo ranks; return each rank's result."""
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
         str(ranks), str(worker), str(out_dir)],
        capture_output=True, text=True, timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(ranks)]


def _check(ranks: list[dict], phases: list[str]) -> None:
    for rank in ranks:
        assert rank["monitored"] == rank["baseline"]  # bitwise: same floats
        assert len(rank["baseline"]) == 12
        assert rank["steps"] == list(range(12))
        assert rank["phases"] == phases
        assert rank["ops"] == ["allreduce"]
        assert rank["tracer"]["recorded"] >= 12 and rank["tracer"]["errors"] == 0
        assert rank["internal_errors"] == 0
        assert rank["windows"] == 3  # 12 steps, K = 4: the gather ran, nothing failed


def test_lightning_callback_in_a_two_rank_ddp_job(tmp_path):
    pytest.importorskip("pytorch_lightning", reason="pip install 'laggard[trainers]'")
    _check(run_job(HERE / "lightning_worker.py", tmp_path),
           ["backward", "data", "forward", "optimizer"])


def test_hf_trainer_callback_in_a_two_rank_ddp_job(tmp_path):
    pytest.importorskip("transformers", reason="pip install 'laggard[trainers]'")
    pytest.importorskip("accelerate", reason="pip install 'laggard[trainers]'")
    _check(run_job(HERE / "hf_worker.py", tmp_path),
           ["data", "forward_backward", "optimizer"])
