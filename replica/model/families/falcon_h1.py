"""Falcon-H1 (``model_type: falcon_h1``): in every layer attention and Mamba2 run side by side on
the same normed input and their outputs are summed, then a gated MLP; muP multipliers scale the
embeddings, both mixers' inputs and outputs, the keys, the Mamba2 projections, the MLP and the
logits."""

from __future__ import annotations

from typing import Any

from replica.model.config import ModelConfig
from replica.model.config_parts import Multipliers
from replica.model.families import common
from replica.model.families.family import Family


def config_from_hf(hf: dict[str, Any]) -> ModelConfig:
    common.check_supported(hf)
    hidden, heads = hf.get("hidden_size", 4096), hf.get("num_attention_heads", 32)
    layers = hf.get("num_hidden_layers", 32)
    n_heads = hf.get("mamba_n_heads", 128)
    d_ssm = hf.get("mamba_d_ssm") or hf.get("mamba_expand", 2) * hidden
    d_head = hf.get("mamba_d_head", "auto")
    if d_head == "auto":
        d_head = d_ssm // n_heads
    if d_head * n_heads != d_ssm:
        raise ValueError(f"mamba_n_heads * mamba_d_head ({n_heads * d_head}) != mamba_d_ssm")
    norm = "gate"
    if hf.get("mamba_rms_norm", False):
        norm = "norm_then_gate" if hf.get("mamba_norm_before_gate", True) else "gate_then_norm"
    theta, _ = common.rope(hf)
    mlp_gate, mlp_down = hf.get("mlp_multipliers") or (1.0, 1.0)
    return ModelConfig(
        model_type="falcon_h1",
        vocab_size=hf.get("vocab_size", 128000),
        hidden_size=hidden,
        intermediate_size=hf.get("intermediate_size", 14336),
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=hf.get("num_key_value_heads") or heads,
        head_dim=hf.get("head_dim"),
        layer_mixers=("mamba2+attention",) * layers,
        mamba_n_heads=n_heads,
        mamba_d_head=d_head,
        mamba_n_groups=hf.get("mamba_n_groups", 1),
        mamba_d_state=hf.get("mamba_d_state", 256),
        mamba_d_conv=hf.get("mamba_d_conv", 4),
        mamba_expand=hf.get("mamba_expand", 2),
        mamba_chunk_size=hf.get("mamba_chunk_size", 256),
        mamba_conv_bias=hf.get("mamba_conv_bias", True),
        mamba_proj_bias=hf.get("mamba_proj_bias", False),
        mamba_out_proj_bias=hf.get("projectors_bias", False),
        mamba_norm=norm,
        time_step_limit=common.time_step_limit(hf.get("time_step_limit")),
        rms_norm_eps=hf.get("rms_norm_eps", 1e-5),
        rope_theta=theta,
        partial_rotary_factor=1.0,
        max_position_embeddings=hf.get("max_position_embeddings", 8192),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        attention_bias=hf.get("attention_bias", False),
        mlp_bias=hf.get("mlp_bias", False),
        multipliers=Multipliers(
            embedding=float(hf.get("embedding_multiplier", 1.0)),
            logits=float(hf.get("lm_head_multiplier", 1.0)),
            attention_in=float(hf.get("attention_in_multiplier", 1.0)),
            attention_out=float(hf.get("attention_out_multiplier", 1.0)),
            key=float(hf.get("key_multiplier", 1.0)),
            ssm_in=float(hf.get("ssm_in_multiplier", 1.0)),
            ssm_out=float(hf.get("ssm_out_multiplier", 1.0)),
            ssm_projection=tuple(hf.get("ssm_multipliers") or (1.0,) * 5),
            mlp_gate=float(mlp_gate),
            mlp_down=float(mlp_down),
        ),
        **common.special_ids(hf),
    )


def weight_map(cfg: ModelConfig) -> common.WeightMap:
    wm: common.WeightMap = {}
    common.embeddings(wm, "model.embed_tokens.weight", "model.final_layernorm.weight", cfg)
    for i in range(cfg.num_hidden_layers):
        hf, local = f"model.layers.{i}", f"layers.{i}"
        wm[f"{hf}.input_layernorm.weight"] = common.Target(f"{local}.input_norm.weight")
        wm[f"{hf}.pre_ff_layernorm.weight"] = common.Target(f"{local}.ffn_norm.weight")
        common.mamba2(wm, f"{hf}.mamba", f"{local}.mamba", cfg)
        common.attention(wm, f"{hf}.self_attn", f"{local}.attn", cfg)
        common.mlp(
            wm, f"{hf}.feed_forward", f"{local}.mlp", cfg.intermediate_size, True, cfg.mlp_bias
        )
    return wm


TINY = {
    "model_type": "falcon_h1",
    "vocab_size": 384,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "mamba_d_ssm": 64,
    "mamba_n_heads": 4,
    "mamba_d_state": 16,
    "mamba_chunk_size": 64,
    "mamba_rms_norm": True,
    "embedding_multiplier": 2.0,
    "lm_head_multiplier": 0.5,
    "attention_in_multiplier": 0.8,
    "attention_out_multiplier": 0.6,
    "key_multiplier": 0.7,
    "ssm_in_multiplier": 1.2,
    "ssm_out_multiplier": 0.9,
    "ssm_multipliers": [1.0, 0.8, 1.1, 0.9, 1.2],
    "mlp_multipliers": [1.1, 0.9],
}

FAMILY = Family("falcon_h1", config_from_hf, weight_map, TINY)
