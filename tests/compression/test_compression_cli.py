"""``laggard demo --compression``: the flag offers exactly the compressors make_hook knows, and a
wrong name is refused before anything starts."""

from __future__ import annotations

import subprocess
import sys

import pytest
from support import budget

from laggard.compression import COMPRESSORS, make_hook
from laggard.demo import flags as demo_flags


def test_demo_offers_every_compressor() -> None:
    assert tuple(COMPRESSORS) == demo_flags.COMPRESSION_CHOICES


def test_unknown_compressor_is_refused_with_the_choices() -> None:
    proc = subprocess.run([sys.executable, "-m", "laggard.cli", "demo",
                           "--compression", "zip"], capture_output=True, text=True,
                          timeout=budget(60))
    assert proc.returncode == 2
    assert "invalid choice: 'zip'" in proc.stderr and "powersgd" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_make_hook_refuses_bad_requests_before_touching_the_process_group() -> None:
    # the name and options are checked first, so these fail the same with or without a group
    with pytest.raises(ValueError, match="unknown compressor 'zip'"):
        make_hook("zip")
    with pytest.raises(ValueError, match="takes no option ratio"):
        make_hook("sign", ratio=0.1)
