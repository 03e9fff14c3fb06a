"""Fixtures of the family tests: each transformers peer saved once per test session."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.models.peers import save_peer


@pytest.fixture(scope="session")
def peer_checkpoint(tmp_path_factory) -> Callable[[str], str]:
    """``peer_checkpoint(name)``: the directory of the saved peer ``name`` (saved on first use)."""
    paths: dict[str, str] = {}

    def get(name: str) -> str:
        if name not in paths:
            paths[name] = save_peer(name, str(tmp_path_factory.mktemp(name)))
        return paths[name]

    return get
