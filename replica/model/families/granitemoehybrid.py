"""Granite-4.0-H (``model_type: granitemoehybrid``): Mamba2 and attention layers (``layer_types``),
each followed by a MoE with a shared MLP (or, in dense variants, the shared MLP alone), with muP
multipliers on the embeddings, residual branches, attention scores and logits."""

from __future__ import annotations

from typing import Any

from replica.model.config import ModelConfig
from replica.model.config_parts import MoEConfig, Multipliers
from replica.model.families import common
from replica.model.families.family import Family

_MIXERS = {
    "mamba": "mamba2",
    "linear_attention": "mamba2",
    "attention": "attention",
    "full_attention": "attention",
}
# transformers' in-memory names of the MoE tensors -> the checkpoint names the map uses
_RENAMES = {
    "block_sparse_moe.experts.gate_up_proj": "block_sparse_moe.input_linear.weight",
    "block_sparse_moe.experts.down_proj": "block_sparse_moe.output_linear.weight",
    "block_sparse_moe.router.weight": "block_sparse_moe.router.layer.weight",
}


def config_from_hf(hf: dict[str, Any]) -> ModelConfig:
    common.check_supported(hf)
    hidden, heads = hf.get("hidden_size", 4096), hf.get("num_attention_heads", 32)
    layers = hf.get("num_hidden_layers", 32)
    types = hf.get("layer_types") or hf.get("layers_block_type") or ["mamba"] * layers
    unknown = sorted(set(types) - set(_MIXERS))
    if unknown:
        raise ValueError(f"unsupported layer_types {unknown}; use {sorted(_MIXERS)}")
    n_heads, expand = hf.get("mamba_n_heads", 128), hf.get("mamba_expand", 2)
    d_head = hf.get("mamba_d_head", "auto")
    if d_head == "auto":
        d_head = expand * hidden // n_heads
    position = hf.get("position_embedding_type")
    if position not in (None, "nope", "rope"):
        raise ValueError(f"unsupported position_embedding_type {position!r}; use rope or nope")
    theta, _ = common.rope(hf)
    experts = hf.get("num_local_experts", 8) or 0
    shared = hf.get("shared_intermediate_size", 1024)
    moe = None
    if experts:
        moe = MoEConfig(
            num_experts=experts,
            top_k=hf.get("num_experts_per_tok", 2),
            intermediate_size=hf.get("intermediate_size", 11008),
            shared_intermediate_size=shared,
        )
    return ModelConfig(
        model_type="granitemoehybrid",
        vocab_size=hf.get("vocab_size", 32000),
        hidden_size=hidden,
        intermediate_size=shared,  # a dense layer is the shared MLP alone
        num_hidden_layers=len(types),
        num_attention_heads=heads,
        num_key_value_heads=hf.get("num_key_value_heads") or heads,
        head_dim=hf.get("head_dim"),
        layer_mixers=tuple(_MIXERS[t] for t in types),
        layer_ffns=("moe" if experts else "mlp",) * len(types),
        mamba_n_heads=n_heads,
        mamba_d_head=d_head,
        mamba_n_groups=hf.get("mamba_n_groups", 1),
        mamba_d_state=hf.get("mamba_d_state", 256),
        mamba_d_conv=hf.get("mamba_d_conv", 4),
        mamba_expand=expand,
        mamba_chunk_size=hf.get("mamba_chunk_size", 256),
        mamba_conv_bias=hf.get("mamba_conv_bias", True),
        mamba_proj_bias=hf.get("mamba_proj_bias", False),
        time_step_limit=common.time_step_limit(hf.get("time_step_limit")),
        rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
        rope_theta=theta,
        partial_rotary_factor=1.0 if position == "rope" else 0.0,
        max_position_embeddings=hf.get("max_position_embeddings", 2048),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        attention_bias=hf.get("attention_bias", False),
        attention_scale=float(hf.get("attention_multiplier", 1.0)),
        moe=moe,
        multipliers=Multipliers(
            embedding=float(hf.get("embedding_multiplier", 1.0)),
            residual=float(hf.get("residual_multiplier", 1.0)),
            logits=1.0 / float(hf.get("logits_scaling", 1.0)),
        ),
        **common.special_ids(hf),
    )


def weight_map(cfg: ModelConfig) -> common.WeightMap:
    wm: common.WeightMap = {}
    common.embeddings(wm, "model.embed_tokens.weight", "model.norm.weight", cfg)
    for i, mixer in enumerate(cfg.layer_mixers):
        hf, local = f"model.layers.{i}", f"layers.{i}"
        wm[f"{hf}.input_layernorm.weight"] = common.Target(f"{local}.input_norm.weight")
        wm[f"{hf}.post_attention_layernorm.weight"] = common.Target(f"{local}.ffn_norm.weight")
        if mixer == "attention":
            common.attention(wm, f"{hf}.self_attn", f"{local}.attn", cfg)
        else:
            common.mamba2(wm, f"{hf}.mamba", f"{local}.mamba", cfg)
        shared = f"{local}.moe.shared" if cfg.moe else f"{local}.mlp"
        common.linear(wm, f"{hf}.shared_mlp.input_linear", f"{shared}.gate_up_proj", False)
        common.linear(wm, f"{hf}.shared_mlp.output_linear", f"{shared}.down_proj", False)
        if cfg.moe:
            moe = f"{hf}.block_sparse_moe"
            wm[f"{moe}.router.layer.weight"] = common.Target(f"{local}.moe.router.weight")
            wm[f"{moe}.input_linear.weight"] = common.Target(f"{local}.moe.gate_up")
            wm[f"{moe}.output_linear.weight"] = common.Target(f"{local}.moe.down")
    return wm


def canonical(name: str) -> str:
    for new, old in _RENAMES.items():
        if name.endswith(new):
            return name[: -len(new)] + old
    return name


TINY = {
    "model_type": "granitemoehybrid",
    "vocab_size": 384,
    "hidden_size": 64,
    "intermediate_size": 32,
    "shared_intermediate_size": 64,
    "num_hidden_layers": 4,
    "layer_types": ["mamba", "attention", "mamba", "mamba"],
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "mamba_n_heads": 8,
    "mamba_d_state": 16,
    "mamba_chunk_size": 64,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "position_embedding_type": "nope",
    "embedding_multiplier": 4.0,
    "residual_multiplier": 0.5,
    "attention_multiplier": 0.125,
    "logits_scaling": 2.0,
    "tie_word_embeddings": True,
}

FAMILY = Family("granitemoehybrid", config_from_hf, weight_map, TINY, canonical)
