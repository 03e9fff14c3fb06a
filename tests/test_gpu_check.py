"""scripts/gpu-check.sh and the device setting it relies on, checked where there is no GPU: the
script fails at once and says why; the test files it runs exist and import without Ray (a GPU
machine's Python has none, and Ray's wheel is too large to carry there); scripts/gpu-bundle.sh
makes the bundle the script takes there (the kernels' Python files, which import, and
causal-conv1d's source with what its build compiles); ``SESSION_ROUTER_TEST_DEVICE`` is what
every engine and pool fixture builds on, and a device that cannot be used stops pytest before
any test (a GPU run must never pass by running on the CPU)."""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile

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


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: run the script")
def test_a_part_runs_after_the_cuda_check_and_an_unknown_part_is_refused():
    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["bash", str(SCRIPT), *args],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
            env=user_env(PYTHON=sys.executable),
        )

    for part in ("kernels", "tests", "bench"):
        out = run("--part", part)
        assert out.returncode == 1, out.stdout + out.stderr
        assert "gpu-check: FAILED: no CUDA device here" in out.stderr
    out = run("--part", "everything")
    assert out.returncode == 2 and "--part all|kernels|tests|bench" in out.stderr


def test_every_test_file_the_script_runs_exists():
    paths = script_test_files()
    assert "tests/gpu" in paths and len(paths) > 10
    for path in paths:
        assert (REPO / path).exists(), path


def script_test_files() -> list[str]:
    return re.findall(r"\btests/[\w/]+(?:\.py)?", SCRIPT.read_text())


def test_the_scripts_tests_import_without_ray(tmp_path):
    """Collected with a ``ray`` that cannot be imported: a test module (or the suite's conftest)
    that imports Ray at its top fails the collection."""
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "__init__.py").write_text("raise ImportError('no Ray on this machine')\n")
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only"]
        + script_test_files(),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env=user_env(PYTHONPATH=str(tmp_path)),
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    assert re.search(r"\d{3,} tests? collected", out.stdout), out.stdout[-2000:]


def test_the_bundle_carries_kernels_that_import_and_causal_conv1ds_source():
    out = subprocess.run(
        ["bash", "scripts/gpu-bundle.sh"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env=user_env(),
    )
    assert out.returncode == 0, out.stdout + out.stderr
    bundle = REPO / "gpu-bundle"
    size = sum(f.stat().st_size for f in bundle.rglob("*") if f.is_file())
    assert size < 64 * 2**20, size  # what a device call carries, at most
    # the kernels import from the bundle alone (Triton, which a GPU machine has, from here)
    triton = REPO / ".venv" / "triton-kernels"
    imports = (
        "import mamba_ssm.ops.triton.ssd_combined, mamba_ssm.ops.triton.selective_state_update"
    )
    imports += (
        ", fla.ops.gated_delta_rule, fla.ops.kda.fused_recurrent; import mamba_ssm, fla; "
        "print(mamba_ssm.__file__, fla.__file__)"
    )
    out = subprocess.run(
        [sys.executable, "-c", imports],
        capture_output=True,
        text=True,
        timeout=300,
        env=user_env(PYTHONPATH=f"{bundle / 'python'}:{triton}", TRITON_INTERPRET="1"),
    )
    assert out.returncode == 0, out.stderr[-4000:]
    assert out.stdout.split() == [
        str(bundle / "python" / "mamba_ssm" / "__init__.py"),
        str(bundle / "python" / "fla" / "__init__.py"),
    ]
    [sdist] = bundle.glob("causal_conv1d-*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        from causal_conv1d_build import SOURCES
    finally:
        sys.path.remove(str(REPO / "scripts"))
    assert {f"csrc/{name}" for name in SOURCES} <= names
    assert "causal_conv1d/cpp_functions.py" in names  # what imports the built module


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
