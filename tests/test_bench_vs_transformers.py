"""``python -m bench.vs_transformers`` runs as a user runs it (a subprocess, clean environment) on
a small size: every family's row comes out with its ratios, the single session's greedy
tokens agree with transformers' (the bench asserts it), and the decode step's floor: its
products alone take part of the step, not more than all of it."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.support.serve_process import REPO, user_env


def test_the_bench_prints_its_families_against_transformers(tmp_path):
    families = ["bamba", "qwen3_next"]
    args = ["--families", *families, "--hidden", "64", "--new", "4", "--rounds", "1"]
    run = subprocess.run(
        [sys.executable, "-m", "bench.vs_transformers", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env=user_env(HOME=str(tmp_path)),
    )
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.splitlines()
    for family in families:
        row = next(line for line in lines if line.startswith(family))
        assert len(re.findall(r"\(\d+\.\d\dx\)", row)) == 3, row
        floor = [line.split() for line in lines if line.startswith(f"  {family} ")]
        assert len(floor) == 1, run.stdout
        ours_ms, products_ms, share, other_ops = floor[0][1:5]
        assert 0 < float(products_ms) < float(ours_ms), floor
        assert int(other_ops) > 0, floor
