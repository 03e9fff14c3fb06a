"""The actors that hold no model import no torch: the router, a replica's checkpoint store and
the response store each start as a process of their own (several per ``serve``, again for every
replacement), and importing torch costs seconds of CPU there. So does the CLI before it starts
Ray, ``replica.api``, the one module of types every process shares, and the replica's typed
client (``replica.actor.client``), which gateways and stores import from the actor's package."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.serve_process import REPO

TORCH_FREE = [
    "replica.api",
    "router.control.router",
    "replica.checkpoints.store",
    "replica.actor.client",
    "router.control.response_store",
    "router.ops.cli",
]


@pytest.mark.parametrize("module", TORCH_FREE)
def test_module_imports_no_torch(module):
    check = (
        f"import sys, {module}; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch')[:3])"
    )
    result = subprocess.run(
        [sys.executable, "-c", check], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]", f"{module} imports torch: {result.stdout.strip()}"
