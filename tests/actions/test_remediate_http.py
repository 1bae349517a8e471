"""The receiver's HTTP side on a real ``laggard remediate`` process: the bearer token, the
paths, a bad flag (the decisions themselves: test_remediator.py, test_remediate_slurm.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from support import budget
from support_remediate import alert, payload, start_remediate

pytestmark = pytest.mark.slow


def test_only_a_webhook_with_the_bearer_token_is_heard(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("right-token\n")
    process = start_remediate(tmp_path, "--action", "exclude-file", "--exclude-file",
                              str(tmp_path / "exclude"), "--max-job-percent", "100",
                              "--web.bearer-token-file", str(token))
    body = payload(alert("LaggardGpuLost", node="n1", gpu="0"))
    try:
        assert process.post(body)[0] == 401
        assert process.post(body, token="wrong-token")[0] == 401
        status, answer = process.post(body, token="right-token")
        assert status == 200 and answer["decisions"][0]["outcome"] == "would_act"
        url = f"http://127.0.0.1:{process.port}"
        with urllib.request.urlopen(f"{url}/held", timeout=budget(10)) as response:
            assert json.load(response) == {"n1": "laggard:gpu_lost:gpu0"}
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(f"{url}/nope", timeout=budget(10))
        assert missing.value.code == 404
    finally:
        out = process.stop()
    assert out.count("no valid bearer token") == 2
    assert not (tmp_path / "exclude").exists()  # a dry run


@pytest.mark.parametrize(("flags", "message"), [
    (["--web.bearer-token-file", "/nonexistent/token"], "--web.bearer-token-file: "),
    (["--web.listen-address", "nowhere"], "not HOST:PORT"),
    (["--action", "exclude-file"], "needs --exclude-file"),
])
def test_a_bad_flag_exits_with_its_reason(flags: list[str], message: str) -> None:
    done = subprocess.run([sys.executable, "-m", "laggard.cli", "remediate", *flags],
                          capture_output=True, text=True, timeout=budget(60), check=False)
    assert done.returncode != 0 and message in done.stderr, done.stderr
