"""Qwen3-Next (``model_type: qwen3_next``): gated DeltaNet layers (``linear_attention``) and gated
attention with q/k norms and partial RoPE (``full_attention``), each followed by a MoE with a
gated shared expert (or a dense MLP in ``mlp_only_layers``); its RMSNorms scale by ``1 + w``."""

from __future__ import annotations

from typing import Any

from replica.model.config import ModelConfig
from replica.model.config_parts import DeltaNetConfig, MoEConfig
from replica.model.families import common
from replica.model.families.family import Family

_MIXERS = {"linear_attention": "deltanet", "full_attention": "attention"}


def config_from_hf(hf: dict[str, Any]) -> ModelConfig:
    common.check_supported(hf)
    layers = hf.get("num_hidden_layers", 48)
    interval = hf.get("full_attention_interval", 4)
    types = hf.get("layer_types") or [
        "full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)
    ]
    unknown = sorted(set(types) - set(_MIXERS))
    if unknown:
        raise ValueError(f"unsupported layer_types {unknown}; use {sorted(_MIXERS)}")
    experts, step = hf.get("num_experts", 512), hf.get("decoder_sparse_step", 1)
    dense = set(hf.get("mlp_only_layers") or ())
    ffns = tuple(
        "moe" if experts > 0 and i not in dense and (i + 1) % step == 0 else "mlp"
        for i in range(len(types))
    )
    moe = None
    if "moe" in ffns:
        moe = MoEConfig(
            num_experts=experts,
            top_k=hf.get("num_experts_per_tok", 10),
            intermediate_size=hf.get("moe_intermediate_size", 512),
            shared_intermediate_size=hf.get("shared_expert_intermediate_size", 512),
            shared_expert_gate=True,
            norm_topk_prob=hf.get("norm_topk_prob", True),
        )
    theta, partial = common.rope(hf, default_partial=0.25)
    heads = hf.get("num_attention_heads", 16)
    return ModelConfig(
        model_type="qwen3_next",
        vocab_size=hf.get("vocab_size", 151936),
        hidden_size=hf.get("hidden_size", 2048),
        intermediate_size=hf.get("intermediate_size", 5632),
        num_hidden_layers=len(types),
        num_attention_heads=heads,
        num_key_value_heads=hf.get("num_key_value_heads") or heads,
        head_dim=hf.get("head_dim", 256),
        layer_mixers=tuple(_MIXERS[t] for t in types),
        layer_ffns=ffns,
        attention_output_gate=True,
        attention_qk_norm=True,
        attention_bias=hf.get("attention_bias", False),
        norm_unit_offset=True,
        rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
        rope_theta=theta,
        partial_rotary_factor=partial,
        max_position_embeddings=hf.get("max_position_embeddings", 32768),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        deltanet=DeltaNetConfig(
            num_key_heads=hf.get("linear_num_key_heads", 16),
            num_value_heads=hf.get("linear_num_value_heads", 32),
            key_head_dim=hf.get("linear_key_head_dim", 128),
            value_head_dim=hf.get("linear_value_head_dim", 128),
            conv_kernel=hf.get("linear_conv_kernel_dim", 4),
        ),
        moe=moe,
        **common.special_ids(hf),
    )


def weight_map(cfg: ModelConfig) -> common.WeightMap:
    wm: common.WeightMap = {}
    common.embeddings(wm, "model.embed_tokens.weight", "model.norm.weight", cfg)
    for i, (mixer, ffn) in enumerate(zip(cfg.layer_mixers, cfg.layer_ffns)):
        hf, local = f"model.layers.{i}", f"layers.{i}"
        wm[f"{hf}.input_layernorm.weight"] = common.Target(f"{local}.input_norm.weight")
        wm[f"{hf}.post_attention_layernorm.weight"] = common.Target(f"{local}.ffn_norm.weight")
        if mixer == "attention":
            common.attention(wm, f"{hf}.self_attn", f"{local}.attn", cfg)
        else:
            names = (
                "in_proj_qkvz.weight",
                "in_proj_ba.weight",
                "conv1d.weight",
                "dt_bias",
                "A_log",
                "norm.weight",
                "out_proj.weight",
            )
            for name in names:
                wm[f"{hf}.linear_attn.{name}"] = common.Target(f"{local}.deltanet.{name}")
        if ffn == "mlp":
            common.mlp(wm, f"{hf}.mlp", f"{local}.mlp", cfg.intermediate_size, True, False)
            continue
        moe = cfg.moe
        wm[f"{hf}.mlp.gate.weight"] = common.Target(f"{local}.moe.router.weight")
        common.experts(
            wm, f"{hf}.mlp.experts", f"{local}.moe", moe.num_experts, moe.intermediate_size, True
        )
        common.mlp(
            wm,
            f"{hf}.mlp.shared_expert",
            f"{local}.moe.shared",
            moe.shared_intermediate_size,
            True,
            False,
        )
        wm[f"{hf}.mlp.shared_expert_gate.weight"] = common.Target(f"{local}.moe.shared_gate.weight")
    return wm


def canonical(name: str) -> str | None:
    """The multi-token-prediction head (``mtp.``) is not used for decoding."""
    return None if name.startswith("mtp.") else name


TINY = {
    "model_type": "qwen3_next",
    "vocab_size": 384,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "layer_types": ["linear_attention", "linear_attention", "full_attention", "linear_attention"],
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 64,
    "mlp_only_layers": [3],
}

FAMILY = Family("qwen3_next", config_from_hf, weight_map, TINY, canonical)
