"""scripts/gpu-check.sh and the device setting it relies on, checked where there is no GPU: the
script fails at once and says why; the test files it runs exist; ``SESSION_ROUTER_TEST_DEVICE``
is what every engine and pool fixture builds on, and a device that cannot be used stops pytest
before any test (a GPU run must never pass by running on the CPU)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import torch

from tests.support.device import ENV, device_under_test
from tests.support.engine import make_engine
from tests.support.pools import make_pools
from tests.support.serve_process import REPO, user_env

SCRIPT = REPO / "scripts" / "gpu-check.sh"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: run the script")
def test_the_script_fails_clearly_without_cuda():
    out = subprocess.run(
        ["bash", str(SCRIPT)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env=user_env(PYTHON=sys.executable),
    )
    assert out.returncode == 1, out.stdout + out.stderr
    assert "gpu-check: FAILED: no CUDA device here" in out.stderr
    assert "sees no CUDA device" in out.stderr


def test_every_test_file_the_script_runs_exists():
    paths = re.findall(r"\btests/[\w/]+(?:\.py)?", SCRIPT.read_text())
    assert "tests/gpu" in paths and len(paths) > 10
    for path in paths:
        assert (REPO / path).exists(), path


def test_fixtures_build_on_the_device_under_test():
    device = device_under_test()
    engine = make_engine()
    assert engine.config.pools.device == device
    assert engine.pool.mamba_pool.ssm_all.device.type == device
    assert engine.runner.model.embed_tokens.weight.device.type == device
    pool, _, _ = make_pools(max_parked=2)
    assert pool.kv_pool.k_all.device.type == device


def test_an_unusable_device_stops_the_run_before_any_test():
    wanted = "tpu" if torch.cuda.is_available() else "cuda"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/test_slot_allocator.py",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env=user_env(**{ENV: wanted}),
    )
    assert out.returncode == 4, out.stdout + out.stderr
    assert "cannot run on the test device" in out.stdout + out.stderr
    assert " passed" not in out.stdout
