"""Bamba (``model_type: bamba``): Mamba2 layers with attention at ``attn_layer_indices``."""

from __future__ import annotations

from typing import Any

from replica.model.config import ModelConfig
from replica.model.families import common
from replica.model.families.family import Family

# The ModelConfig fields an HF BambaConfig has under the same name.
_HF_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "attn_layer_indices",
    "mamba_n_heads",
    "mamba_d_head",
    "mamba_n_groups",
    "mamba_d_state",
    "mamba_d_conv",
    "mamba_expand",
    "mamba_chunk_size",
    "mamba_conv_bias",
    "mamba_proj_bias",
    "rms_norm_eps",
    "max_position_embeddings",
    "tie_word_embeddings",
    "attention_bias",
    "mlp_bias",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
)


def config_from_hf(hf: dict[str, Any]) -> ModelConfig:
    """``partial_rotary_factor`` is 0.5 whatever the file says, as transformers hard-codes it for
    Bamba."""
    common.check_supported(hf)
    theta, _ = common.rope(hf)
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
        rope_theta=theta,
        partial_rotary_factor=0.5,
        max_position_embeddings=hf.get("max_position_embeddings", 262144),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        attention_bias=hf.get("attention_bias", False),
        mlp_bias=hf.get("mlp_bias", False),
        time_step_limit=common.time_step_limit(hf.get("time_step_limit")),
        **common.special_ids(hf),
    )


def hf_config(cfg: ModelConfig) -> dict[str, Any]:
    """The HF ``config.json`` dict of a Bamba ``cfg`` (inverse of :func:`config_from_hf`)."""
    if cfg.model_type != "bamba" or cfg.partial_rotary_factor != 0.5:
        raise ValueError("only Bamba configs (partial_rotary_factor 0.5) can be written as Bamba")
    out: dict[str, Any] = {"model_type": "bamba", "architectures": ["BambaForCausalLM"]}
    for name in _HF_FIELDS:
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


def weight_map(cfg: ModelConfig) -> common.WeightMap:
    wm: common.WeightMap = {}
    common.embeddings(wm, "model.embed_tokens.weight", "model.final_layernorm.weight", cfg)
    for i, mixer in enumerate(cfg.layer_mixers):
        hf, local = f"model.layers.{i}", f"layers.{i}"
        wm[f"{hf}.input_layernorm.weight"] = common.Target(f"{local}.input_norm.weight")
        wm[f"{hf}.pre_ff_layernorm.weight"] = common.Target(f"{local}.ffn_norm.weight")
        if mixer == "attention":
            common.attention(wm, f"{hf}.self_attn", f"{local}.attn", cfg)
        else:
            common.mamba2(wm, f"{hf}.mamba", f"{local}.mamba", cfg)
        common.mlp(
            wm, f"{hf}.feed_forward", f"{local}.mlp", cfg.intermediate_size, True, cfg.mlp_bias
        )
    return wm


FAMILY = Family("bamba", config_from_hf, weight_map, hf_config(ModelConfig()))
