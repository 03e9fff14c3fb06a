"""The device the engine, pool, parking and migration tests run on: ``SESSION_ROUTER_TEST_DEVICE``
(``cpu``, the default, or ``cuda``; scripts/gpu-check.sh sets ``cuda``). Every engine and pool
fixture (``make_engine``, ``make_pools``) builds on it, so one setting moves those tests to the
GPU. Asking for ``cuda`` where there is none is an error at collection (conftest), not a skip.
"""

from __future__ import annotations

import copy
import os

import torch
from torch import nn

ENV = "SESSION_ROUTER_TEST_DEVICE"
DEVICES = ("cpu", "cuda")


def device_under_test() -> str:
    """The device the setting names (validated)."""
    device = os.environ.get(ENV, "cpu") or "cpu"
    if device not in DEVICES:
        raise ValueError(f"{ENV}={device!r}: use one of {', '.join(DEVICES)}")
    return device


def check_test_device() -> str | None:
    """Why the tests cannot run on the configured device (None: they can)."""
    try:
        device = device_under_test()
    except ValueError as exc:
        return str(exc)
    if device == "cuda" and not torch.cuda.is_available():
        return f"{ENV}=cuda, but torch {torch.__version__} sees no CUDA device"
    return None


def on_test_device(model: nn.Module) -> nn.Module:
    """``model`` on the test device: itself when it is there already, else a copy (callers keep
    their own on the CPU, e.g. to compare against)."""
    device = device_under_test()
    if next(model.parameters()).device.type == device:
        return model
    return copy.deepcopy(model).to(device)  # a deep copy keeps tied weights tied
