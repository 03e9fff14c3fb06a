"""Loading an HF-format checkpoint: ``config.json``, ``*.safetensors``, ``tokenizer.json``.

The family is chosen from ``config.json``'s ``model_type`` (see :mod:`replica.model.families`);
its weight map says where each checkpoint tensor goes in :class:`HybridModel`. A checkpoint that
does not match its config fails with a ``ValueError`` naming the missing, unexpected and
mis-shaped tensors; a missing or unreadable file with a ``CheckpointError`` naming the file.
Tensors are read lazily, one at a time (``CheckpointFiles``), into weights already allocated on
the replica's device in the target dtype.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch

from replica.config import torch_dtype
from replica.model.checkpoint_files import CheckpointError, CheckpointFiles
from replica.model.config import ModelConfig
from replica.model.families import FAMILIES, family_of
from replica.model.families.bamba import hf_config
from replica.model.hybrid import HybridModel
from replica.model.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer

_LIST_LIMIT = 20

__all__ = [
    "CheckpointError",
    "config_from_hf",
    "hf_config",
    "load_model",
    "load_weights",
    "save_checkpoint",
]


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


def _names(names: list[str]) -> str:
    more = f" ... and {len(names) - _LIST_LIMIT} more" if len(names) > _LIST_LIMIT else ""
    return ", ".join(names[:_LIST_LIMIT]) + more


def load_weights(model: HybridModel, files: CheckpointFiles) -> None:
    """Copy the HF-named tensors of ``files`` into ``model`` (cast to its dtype, on its device),
    one tensor at a time. Names and shapes are checked against the model before any is read.

    With tied embeddings ``lm_head.weight`` may be absent (and is ignored when present).
    """
    cfg = model.cfg
    family = FAMILIES[cfg.model_type]
    wmap = family.weight_map(cfg)
    stored = {}  # canonical name -> the checkpoint's name
    for name in files.shapes:
        canonical = family.canonical(name)
        if canonical is not None:
            stored[canonical] = name
    if cfg.tie_word_embeddings:
        stored.pop("lm_head.weight", None)
    params = dict(model.named_parameters())
    shape_of = {n: files.shapes[stored[n]] for n in stored}
    missing = sorted(set(wmap) - set(stored))
    unexpected = sorted(set(stored) - set(wmap))
    misshaped = sorted(
        f"{n} {shape_of[n]} (expected {tuple(params[t.param][t.index].shape)})"
        for n, t in wmap.items()
        if n in stored and shape_of[n] != tuple(params[t.param][t.index].shape)
    )
    if missing or unexpected or misshaped:
        parts = []
        if missing:
            parts.append(f"missing tensors: {_names(missing)}")
        if unexpected:
            parts.append(f"unexpected tensors: {_names(unexpected)}")
        if misshaped:
            parts.append(f"mis-shaped tensors: {_names(misshaped)}")
        raise ValueError(
            f"checkpoint {files.path} does not match its model config; " + "; ".join(parts)
        )
    filled = dict.fromkeys(params, 0)
    with torch.no_grad():
        for name, t in wmap.items():
            part = params[t.param][t.index]
            part.copy_(files.read(stored[name], part.device))
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


def checkpoint_dtype(hf: dict[str, Any]) -> torch.dtype | None:
    """The dtype ``config.json`` says the weights were saved in (``dtype``, older
    ``torch_dtype``), when it names one we keep."""
    name = hf.get("dtype") or hf.get("torch_dtype")
    return torch_dtype(name) if isinstance(name, str) else None


def read_config(model_path: str) -> dict[str, Any]:
    """``config.json`` of a checkpoint directory; a missing or unreadable one raises naming it."""
    cfg_path = os.path.join(model_path, "config.json")
    if not os.path.exists(cfg_path):
        raise CheckpointError(f"no config.json in {model_path}")
    try:
        with open(cfg_path) as f:
            return json.load(f)
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read {cfg_path}: {exc}") from exc


def load_model(
    model_path: str, device: torch.device | str = "cpu", dtype: torch.dtype | None = None
) -> tuple[ModelConfig, HybridModel, Tokenizer]:
    """Build the model of an HF checkpoint directory, in eval mode on ``device``, its weights
    in ``dtype`` (None: the checkpoint's own dtype on CUDA, float32 elsewhere). The weights are
    allocated once, on the device, in ``dtype``, and filled tensor by tensor."""
    hf = read_config(model_path)
    try:
        cfg = config_from_hf(hf)
    except ValueError as exc:
        raise ValueError(f"{os.path.join(model_path, 'config.json')}: {exc}") from exc
    if dtype is None:
        cuda = torch.device(device).type == "cuda"
        dtype = (checkpoint_dtype(hf) if cuda else None) or torch.float32
    files = CheckpointFiles(model_path)
    with torch.device("meta"):
        model = HybridModel(cfg)
    model = model.to(dtype).to_empty(device=device)  # on meta the cast allocates nothing
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    load_weights(model, files)
    model.eval()
    return cfg, model, load_tokenizer(model_path, cfg)
