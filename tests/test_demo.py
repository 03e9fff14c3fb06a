"""The demo as the README's first command runs it (``scripts/demo.sh`` runs ``session-router
demo``), smaller: the console script in a fresh shell's environment from the repository, on
its own local Ray. It exits 0 only when every session ended as its client meant, every pool is
back at capacity (free, or holding cached states) and nothing leaked; a demo that cannot say
so is a broken first impression, so it runs in the suite."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.serve_process import REPO, user_env

BIN = Path(sys.executable).parent


def test_the_demo_ends_with_every_pool_back_and_nothing_leaked(tmp_path):
    result = subprocess.run(
        [str(BIN / "session-router"), "demo", "--sessions", "40", "--parked-sessions", "16"],
        cwd=REPO, env=user_env(HOME=str(tmp_path)), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-4000:]
    assert "result: OK - every pool is back at capacity" in out, out[-4000:]
    assert "sessions: 40 in" in out and "2 replicas, 0 dead, no leaked slots" in out
