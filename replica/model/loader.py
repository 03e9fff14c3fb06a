"""Loading an HF-format checkpoint: ``config.json``, ``*.safetensors``, ``tokenizer.json``.

The family is chosen from ``config.json``'s ``model_type`` (see :mod:`replica.model.families`);
its weight map says where each checkpoint tensor goes in :class:`HybridModel`. A checkpoint that
does not match its config fails with a ``ValueError`` naming the missing, unexpected and
mis-shaped tensors.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch

from replica.model.config import ModelConfig
from replica.model.families import FAMILIES, family_of
from replica.model.families.bamba import hf_config
from replica.model.hybrid import HybridModel
from replica.model.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer

_LIST_LIMIT = 20

__all__ = ["config_from_hf", "hf_config", "load_model", "load_weights", "save_checkpoint"]


def config_from_hf(hf: dict[str, Any]) -> ModelConfig:
    """Map an HF ``config.json`` dict onto :class:`ModelConfig`; unsupported features raise."""
    return family_of(hf).config_from_hf(hf)


def save_checkpoint(cfg: ModelConfig, model: HybridModel, path: str) -> None:
    """Write a Bamba model's ``config.json`` and ``model.safetensors`` in HF format (readable by
    transformers)."""
    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(hf_config(cfg), f, indent=2)
    params = dict(model.named_parameters())
    tensors = {
        name: params[t.param][t.index].detach().cpu().contiguous()
        for name, t in FAMILIES[cfg.model_type].weight_map(cfg).items()
    }
    save_file(tensors, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})


def read_safetensors(model_path: str) -> dict[str, torch.Tensor]:
    """All tensors of ``model.safetensors`` or of the shards listed in an ``*.index.json``."""
    from safetensors.torch import load_file

    index = os.path.join(model_path, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
    else:
        shards = sorted(n for n in os.listdir(model_path) if n.endswith(".safetensors"))
    if not shards:
        raise ValueError(f"no *.safetensors files in {model_path}")
    tensors: dict[str, torch.Tensor] = {}
    for shard in shards:
        tensors.update(load_file(os.path.join(model_path, shard), device="cpu"))
    return tensors


def _names(names: list[str]) -> str:
    more = f" ... and {len(names) - _LIST_LIMIT} more" if len(names) > _LIST_LIMIT else ""
    return ", ".join(names[:_LIST_LIMIT]) + more


def load_weights(model: HybridModel, tensors: dict[str, torch.Tensor]) -> None:
    """Copy HF-named ``tensors`` into ``model`` (casting to its dtype), all or nothing.

    With tied embeddings ``lm_head.weight`` may be absent (and is ignored when present).
    """
    cfg = model.cfg
    family = FAMILIES[cfg.model_type]
    wmap = family.weight_map(cfg)
    named = {}
    for name, tensor in tensors.items():
        canonical = family.canonical(name)
        if canonical is not None:
            named[canonical] = tensor
    if cfg.tie_word_embeddings:
        named.pop("lm_head.weight", None)
    params = dict(model.named_parameters())
    missing = sorted(set(wmap) - set(named))
    unexpected = sorted(set(named) - set(wmap))
    misshaped = sorted(
        f"{n} {tuple(named[n].shape)} (expected {tuple(params[t.param][t.index].shape)})"
        for n, t in wmap.items()
        if n in named and tuple(named[n].shape) != tuple(params[t.param][t.index].shape)
    )
    if missing or unexpected or misshaped:
        parts = []
        if missing:
            parts.append(f"missing tensors: {_names(missing)}")
        if unexpected:
            parts.append(f"unexpected tensors: {_names(unexpected)}")
        if misshaped:
            parts.append(f"mis-shaped tensors: {_names(misshaped)}")
        raise ValueError("checkpoint does not match the model config; " + "; ".join(parts))
    filled = dict.fromkeys(params, 0)
    with torch.no_grad():
        for name, t in wmap.items():
            part = params[t.param][t.index]
            part.copy_(named[name].to(dtype=part.dtype, device=part.device))
            filled[t.param] += part.numel()
    unfilled = [n for n, p in params.items() if filled[n] != p.numel()]
    if unfilled:  # a gap in the family's weight map, not in the checkpoint
        raise RuntimeError(f"{cfg.model_type} weight map leaves {unfilled} unfilled")


def load_tokenizer(model_path: str, cfg: ModelConfig) -> Tokenizer:
    """``tokenizer.json`` when present (ids of BOS/EOS from the config, else from
    ``tokenizer_config.json``), else the byte tokenizer sized to the model's vocabulary."""
    path = os.path.join(model_path, "tokenizer.json")
    if not os.path.exists(path):
        return ByteTokenizer(max(cfg.vocab_size, 258))
    tok = HFTokenizer(path, cfg.bos_token_id, cfg.eos_token_id)
    tc_path = os.path.join(model_path, "tokenizer_config.json")
    if os.path.exists(tc_path):
        with open(tc_path) as f:
            tc = json.load(f)
        for attr, key in (("bos_token_id", "bos_token"), ("eos_token_id", "eos_token")):
            token = tc.get(key)
            if isinstance(token, dict):
                token = token.get("content")
            if getattr(tok, attr) is None and isinstance(token, str):
                setattr(tok, attr, tok.token_to_id(token))
    return tok


def load_model(
    model_path: str, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
) -> tuple[ModelConfig, HybridModel, Tokenizer]:
    """Build the model of an HF checkpoint directory, in eval mode on ``device``."""
    cfg_path = os.path.join(model_path, "config.json")
    if not os.path.exists(cfg_path):
        raise ValueError(f"no config.json in {model_path}")
    with open(cfg_path) as f:
        cfg = config_from_hf(json.load(f))
    with torch.device("meta"):
        model = HybridModel(cfg)
    model = model.to_empty(device=device).to(dtype)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    load_weights(model, read_safetensors(model_path))
    model.eval()
    return cfg, model, load_tokenizer(model_path, cfg)
