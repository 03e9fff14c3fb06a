"""deploy/prometheus passes promtool: config and rules are valid and the rule unit tests pass."""

import shutil
import subprocess
from pathlib import Path

import pytest

PROMETHEUS_DIR = Path(__file__).resolve().parent.parent / "deploy" / "prometheus"


@pytest.fixture(scope="module")
def promtool():
    path = shutil.which("promtool")
    if path is None:
        pytest.fail(
            "promtool not found on PATH; install Debian's prometheus package "
            "(sudo .ci/install-system.sh, or apt-get install -y prometheus)"
        )
    return path


@pytest.mark.parametrize(
    "args",
    [
        ["check", "config", "prometheus.yml"],
        ["check", "rules", "alerts.yml"],
        ["test", "rules", "alerts_test.yml"],
    ],
    ids=["check-config", "check-rules", "test-rules"],
)
def test_promtool(promtool, args):
    result = subprocess.run(
        [promtool, *args], cwd=PROMETHEUS_DIR, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, (
        f"promtool {' '.join(args)} failed in deploy/prometheus:\n{result.stdout}\n{result.stderr}"
    )
