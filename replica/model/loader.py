"""Loading an HF-format Bamba checkpoint: ``config.json``, ``*.safetensors``, ``tokenizer.json``.

HF tensor names are ``model.<name>`` for every module of :class:`BambaModel` except
``lm_head.weight`` (e.g. ``model.layers.0.mamba.in_proj.weight``,
``model.layers.1.self_attn.q_proj.weight``). A checkpoint that does not match the config fails with
a ``ValueError`` naming the missing, unexpected and mis-shaped tensors.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch

from replica.model.bamba import BambaModel
from replica.model.config import ModelConfig
from replica.model.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer

_LIST_LIMIT = 20


def _first_id(value: Any) -> int | None:
    if isinstance(value, list):
        return int(value[0]) if value else None
    return None if value is None else int(value)


def _float(value: Any) -> float:
    """A float from JSON, including transformers' ``{"__float__": "Infinity"}`` encoding."""
    if isinstance(value, dict) and "__float__" in value:
        value = value["__float__"]
    return float(value)


def config_from_hf(hf: dict[str, Any]) -> ModelConfig:
    """Map an HF ``config.json`` dict onto :class:`ModelConfig`; unsupported features raise.

    ``partial_rotary_factor`` is 0.5 whatever the file says, as transformers hard-codes it for
    Bamba. A list ``eos_token_id`` keeps its first id.
    """
    if hf.get("model_type") != "bamba":
        raise ValueError(f"unsupported model_type {hf.get('model_type')!r}; only 'bamba' is")
    if hf.get("hidden_act", "silu") != "silu":
        raise ValueError(f"unsupported hidden_act {hf['hidden_act']!r}; only 'silu' is")
    if hf.get("quantization_config"):
        raise ValueError("quantized checkpoints are not supported")
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise ValueError(f"unsupported rope_type {rope_type!r}; only 'default' is")
    theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
    hidden, heads = hf.get("hidden_size", 4096), hf.get("num_attention_heads", 32)
    if hf.get("head_dim") not in (None, hidden // heads):
        raise ValueError(f"unsupported head_dim {hf['head_dim']} != hidden_size/num_heads")
    n_heads, expand = hf.get("mamba_n_heads", 128), hf.get("mamba_expand", 2)
    d_head = hf.get("mamba_d_head", "auto")
    if d_head == "auto":
        d_head = expand * hidden // n_heads
    if d_head * n_heads != expand * hidden:
        raise ValueError(
            f"mamba_n_heads * mamba_d_head ({n_heads * d_head}) != mamba_expand * hidden_size "
            f"({expand * hidden})"
        )
    limit = hf.get("time_step_limit") or (0.0, float("inf"))
    return ModelConfig(
        vocab_size=hf.get("vocab_size", 128000),
        hidden_size=hidden,
        intermediate_size=hf.get("intermediate_size", 14336),
        num_hidden_layers=hf.get("num_hidden_layers", 32),
        num_attention_heads=heads,
        num_key_value_heads=hf.get("num_key_value_heads") or heads,
        attn_layer_indices=tuple(hf.get("attn_layer_indices") or ()),
        mamba_n_heads=n_heads,
        mamba_d_head=d_head,
        mamba_n_groups=hf.get("mamba_n_groups", 1),
        mamba_d_state=hf.get("mamba_d_state", 256),
        mamba_d_conv=hf.get("mamba_d_conv", 4),
        mamba_expand=expand,
        mamba_chunk_size=hf.get("mamba_chunk_size", 256),
        mamba_conv_bias=hf.get("mamba_conv_bias", True),
        mamba_proj_bias=hf.get("mamba_proj_bias", False),
        rms_norm_eps=hf.get("rms_norm_eps", 1e-5),
        rope_theta=float(theta),
        partial_rotary_factor=0.5,
        max_position_embeddings=hf.get("max_position_embeddings", 262144),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        attention_bias=hf.get("attention_bias", False),
        mlp_bias=hf.get("mlp_bias", False),
        time_step_limit=(_float(limit[0]), _float(limit[1])),
        bos_token_id=_first_id(hf.get("bos_token_id")),
        eos_token_id=_first_id(hf.get("eos_token_id")),
        pad_token_id=_first_id(hf.get("pad_token_id")),
    )


def hf_config(cfg: ModelConfig) -> dict[str, Any]:
    """The HF ``config.json`` dict of ``cfg`` (inverse of :func:`config_from_hf`)."""
    if cfg.partial_rotary_factor != 0.5:
        raise ValueError("HF Bamba checkpoints always use partial_rotary_factor 0.5")
    out: dict[str, Any] = {"model_type": "bamba", "architectures": ["BambaForCausalLM"]}
    for name in ModelConfig.__dataclass_fields__:
        if name not in ("rope_theta", "partial_rotary_factor", "time_step_limit"):
            value = getattr(cfg, name)
            out[name] = list(value) if isinstance(value, tuple) else value
    lo, hi = cfg.time_step_limit
    out["time_step_limit"] = [lo, hi if hi != float("inf") else {"__float__": "Infinity"}]
    out["rope_parameters"] = {
        "rope_type": "default",
        "rope_theta": cfg.rope_theta,
        "partial_rotary_factor": 0.5,
    }
    out["hidden_act"] = "silu"
    return out


def save_checkpoint(cfg: ModelConfig, model: BambaModel, path: str) -> None:
    """Write ``config.json`` and ``model.safetensors`` in HF format (readable by transformers)."""
    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(hf_config(cfg), f, indent=2)
    tensors = {hf_name(n): p.detach().cpu().contiguous() for n, p in model.named_parameters()}
    save_file(tensors, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})


def hf_name(local_name: str) -> str:
    """HF checkpoint name of a :class:`BambaModel` parameter name."""
    return local_name if local_name.startswith("lm_head.") else f"model.{local_name}"


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


def load_weights(model: BambaModel, tensors: dict[str, torch.Tensor]) -> None:
    """Copy HF-named ``tensors`` into ``model`` (casting to its dtype), all or nothing.

    With tied embeddings ``lm_head.weight`` may be absent (and is ignored when present).
    """
    params = {hf_name(n): p for n, p in model.named_parameters(remove_duplicate=False)}
    optional = {"lm_head.weight"} if model.cfg.tie_word_embeddings else set()
    missing = sorted(set(params) - set(tensors) - optional)
    unexpected = sorted(set(tensors) - set(params))
    misshaped = sorted(
        f"{n} {tuple(tensors[n].shape)} (expected {tuple(params[n].shape)})"
        for n in set(params) & set(tensors)
        if tuple(tensors[n].shape) != tuple(params[n].shape)
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
    with torch.no_grad():
        for name, param in params.items():
            if name in optional:
                continue
            param.copy_(tensors[name].to(dtype=param.dtype, device=param.device))


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
) -> tuple[ModelConfig, BambaModel, Tokenizer]:
    """Build a :class:`BambaModel` from an HF checkpoint directory, in eval mode on ``device``."""
    cfg_path = os.path.join(model_path, "config.json")
    if not os.path.exists(cfg_path):
        raise ValueError(f"no config.json in {model_path}")
    with open(cfg_path) as f:
        cfg = config_from_hf(json.load(f))
    with torch.device("meta"):
        model = BambaModel(cfg)
    model = model.to_empty(device=device).to(dtype)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    load_weights(model, read_safetensors(model_path))
    model.eval()
    return cfg, model, load_tokenizer(model_path, cfg)
