"""The supported model families, by the ``model_type`` of their HF ``config.json``."""

from __future__ import annotations

from typing import Any

from replica.model.families import bamba, falcon_h1, granitemoehybrid, nemotron_h, qwen3_next
from replica.model.families.family import Family

FAMILIES: dict[str, Family] = {
    f.model_type: f
    for f in (
        bamba.FAMILY,
        granitemoehybrid.FAMILY,
        nemotron_h.FAMILY,
        falcon_h1.FAMILY,
        qwen3_next.FAMILY,
    )
}


def family_of(hf: dict[str, Any]) -> Family:
    """The family of an HF ``config.json``; an unsupported ``model_type`` lists the supported."""
    model_type = hf.get("model_type")
    if model_type not in FAMILIES:
        raise ValueError(f"unsupported model_type {model_type!r}; supported: {', '.join(FAMILIES)}")
    return FAMILIES[model_type]
