"""A model family: how its HF ``config.json`` and tensor names map onto the hybrid decoder."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from replica.model.config import ModelConfig
from replica.model.families.common import WeightMap


def _same_name(name: str) -> str | None:
    return name


@dataclass(frozen=True)
class Family:
    """``config_from_hf`` maps ``config.json`` (raising ``ValueError`` on what is unsupported),
    ``weight_map`` names every checkpoint tensor the config implies, ``canonical`` rewrites a
    checkpoint tensor name to the map's spelling (None: a tensor to skip, e.g. Qwen3-Next's
    multi-token-prediction head), and ``tiny`` is the ``config.json`` of the ``tiny-<family>``
    built-in."""

    model_type: str
    config_from_hf: Callable[[dict[str, Any]], ModelConfig]
    weight_map: Callable[[ModelConfig], WeightMap]
    tiny: dict[str, Any]
    canonical: Callable[[str], str | None] = _same_name
