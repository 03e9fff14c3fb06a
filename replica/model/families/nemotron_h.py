"""Nemotron-H (``model_type: nemotron_h``): a pattern of single-purpose blocks, each a norm and one
of Mamba2 (``M``), attention without positional embedding (``*``), a squared-ReLU MLP (``-``) or a
MoE with sigmoid routing and a shared expert (``E``), given as ``hybrid_override_pattern`` or as
``layers_block_type``."""

from __future__ import annotations

from typing import Any

from replica.model.config import ModelConfig
from replica.model.config_parts import MoEConfig
from replica.model.families import common
from replica.model.families.family import Family

# block kind -> (mixer, ffn) of the hybrid decoder layer
_BLOCKS = {
    "linear_attention": ("mamba2", "none"),
    "full_attention": ("attention", "none"),
    "mlp": ("none", "mlp"),
    "moe": ("none", "moe"),
}
_PATTERN = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}


def _get(hf: dict[str, Any], name: str, legacy: str, default: Any) -> Any:
    return hf.get(name, hf.get(legacy, default))


def block_types(hf: dict[str, Any]) -> list[str]:
    types = hf.get("layers_block_type")
    if types is None:
        pattern = hf.get("hybrid_override_pattern", "M*-E")
        unknown = sorted(set(pattern) - set(_PATTERN))
        if unknown:
            raise ValueError(f"unsupported hybrid_override_pattern symbols {unknown}; use M * - E")
        types = [_PATTERN[c] for c in pattern]
    types = [{"mamba": "linear_attention", "attention": "full_attention"}.get(t, t) for t in types]
    unknown = sorted(set(types) - set(_BLOCKS))
    if unknown:
        raise ValueError(f"unsupported layers_block_type {unknown}; use {sorted(_BLOCKS)}")
    return types


def config_from_hf(hf: dict[str, Any]) -> ModelConfig:
    common.check_supported(hf, "mamba_hidden_act")
    act = hf.get("mlp_hidden_act", "relu2")
    if act not in ("relu2", "silu"):
        raise ValueError(f"unsupported mlp_hidden_act {act!r}; use relu2 or silu")
    if hf.get("moe_latent_size") is not None:
        raise ValueError("Nemotron-H MoE with moe_latent_size is not supported")
    types = block_types(hf)
    hidden, heads = hf.get("hidden_size", 4096), hf.get("num_attention_heads", 32)
    moe = None
    if "moe" in types:
        moe = MoEConfig(
            num_experts=hf.get("n_routed_experts", 8),
            top_k=hf.get("num_experts_per_tok", 2),
            intermediate_size=hf.get("moe_intermediate_size", 7688),
            shared_intermediate_size=hf.get("moe_shared_expert_intermediate_size", 7688),
            router="sigmoid",
            norm_topk_prob=hf.get("norm_topk_prob", True),
            routed_scaling_factor=float(hf.get("routed_scaling_factor", 1.0)),
            n_group=hf.get("n_group", 1),
            topk_group=hf.get("topk_group", 1),
        )
    use_bias = hf.get("use_bias", False)
    return ModelConfig(
        model_type="nemotron_h",
        vocab_size=hf.get("vocab_size", 131072),
        hidden_size=hidden,
        intermediate_size=hf.get("intermediate_size", 21504),
        num_hidden_layers=len(types),
        num_attention_heads=heads,
        num_key_value_heads=hf.get("num_key_value_heads") or heads,
        head_dim=hf.get("head_dim", hf.get("attention_head_dim", 128)),
        layer_mixers=tuple(_BLOCKS[t][0] for t in types),
        layer_ffns=tuple(_BLOCKS[t][1] for t in types),
        mamba_n_heads=hf.get("mamba_num_heads", 128),
        mamba_d_head=hf.get("mamba_head_dim", 64),
        mamba_n_groups=_get(hf, "n_groups", "mamba_n_groups", 8),
        mamba_d_state=hf.get("ssm_state_size", 128),
        mamba_d_conv=_get(hf, "conv_kernel", "mamba_d_conv", 4),
        mamba_expand=_get(hf, "expand", "mamba_expand", 2),
        mamba_chunk_size=_get(hf, "chunk_size", "mamba_chunk_size", 128),
        mamba_conv_bias=_get(hf, "use_conv_bias", "mamba_conv_bias", True),
        mamba_proj_bias=use_bias,
        mamba_out_proj_bias=use_bias,
        # transformers clamps Nemotron-H's time steps below at time_step_min, never above
        time_step_limit=(float(_get(hf, "time_step_min", "mamba_dt_min", 0.001)), float("inf")),
        rms_norm_eps=hf.get("layer_norm_epsilon", 1e-5),
        partial_rotary_factor=0.0,
        max_position_embeddings=hf.get("max_position_embeddings", 4096),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        hidden_act=act,
        mlp_gated=False,
        mlp_bias=hf.get("mlp_bias", False),
        moe=moe,
        **common.special_ids(hf),
    )


def weight_map(cfg: ModelConfig) -> common.WeightMap:
    wm: common.WeightMap = {}
    common.embeddings(wm, "backbone.embeddings.weight", "backbone.norm_f.weight", cfg)
    for i, (mixer, ffn) in enumerate(zip(cfg.layer_mixers, cfg.layer_ffns)):
        hf, local = f"backbone.layers.{i}", f"layers.{i}"
        norm = "input_norm" if mixer != "none" else "ffn_norm"
        wm[f"{hf}.norm.weight"] = common.Target(f"{local}.{norm}.weight")
        if mixer == "mamba2":
            common.mamba2(wm, f"{hf}.mixer", f"{local}.mamba", cfg)
        elif mixer == "attention":
            common.attention(wm, f"{hf}.mixer", f"{local}.attn", cfg)
        elif ffn == "mlp":
            common.mlp(
                wm, f"{hf}.mixer", f"{local}.mlp", cfg.intermediate_size, False, cfg.mlp_bias
            )
        else:
            moe, size = cfg.moe, cfg.moe.shared_intermediate_size
            wm[f"{hf}.mixer.gate.weight"] = common.Target(f"{local}.moe.router.weight")
            wm[f"{hf}.mixer.gate.e_score_correction_bias"] = common.Target(
                f"{local}.moe.score_bias"
            )
            common.experts(
                wm,
                f"{hf}.mixer.experts",
                f"{local}.moe",
                moe.num_experts,
                moe.intermediate_size,
                False,
            )
            common.mlp(
                wm, f"{hf}.mixer.shared_experts", f"{local}.moe.shared", size, False, cfg.mlp_bias
            )
    return wm


def canonical(name: str) -> str | None:
    """transformers' in-memory ``model.`` prefix is the checkpoints' ``backbone.``; the
    multi-token-prediction layers (``mtp.``) are not used for decoding."""
    if name.startswith("mtp."):
        return None
    return "backbone." + name[len("model.") :] if name.startswith("model.") else name


TINY = {
    "model_type": "nemotron_h",
    "vocab_size": 384,
    "hidden_size": 64,
    "intermediate_size": 128,
    "hybrid_override_pattern": "M-M*-E",
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "mamba_num_heads": 8,
    "mamba_head_dim": 16,
    "ssm_state_size": 16,
    "n_groups": 2,
    "chunk_size": 64,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "moe_shared_expert_intermediate_size": 64,
}

FAMILY = Family("nemotron_h", config_from_hf, weight_map, TINY, canonical)
