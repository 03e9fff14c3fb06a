"""What the family adapters share: reading HF ``config.json`` values, and the weight-map entries
of the modules every family has (attention, Mamba2, MLPs, experts).

A weight map says, for each tensor name of an HF checkpoint, which parameter of
:class:`~replica.model.hybrid.HybridModel` it fills and where: ``Target(param, index)`` with
``index`` a tuple of ints and slices into the parameter (``()``: all of it). Several checkpoint
tensors may fill parts of one parameter (q/k/v into ``qkv_proj``, experts into a stacked tensor).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from replica.model.config import ModelConfig


class Target(NamedTuple):
    param: str
    index: tuple = ()


WeightMap = dict[str, Target]


def first_id(value: Any) -> int | None:
    """A token id from JSON; a list keeps its first id."""
    if isinstance(value, list):
        return int(value[0]) if value else None
    return None if value is None else int(value)


def as_float(value: Any) -> float:
    """A float from JSON, including transformers' ``{"__float__": "Infinity"}`` encoding."""
    if isinstance(value, dict) and "__float__" in value:
        value = value["__float__"]
    return float(value)


def time_step_limit(value: Any) -> tuple[float, float]:
    lo, hi = value or (0.0, float("inf"))
    return (as_float(lo), as_float(hi))


def check_supported(hf: dict[str, Any], act_key: str = "hidden_act", act: str = "silu") -> None:
    """Refuse what no family here runs: quantized weights, another activation."""
    if hf.get("quantization_config"):
        raise ValueError("quantized checkpoints are not supported; use a bf16/fp16/fp32 one")
    if hf.get(act_key, act) != act:
        raise ValueError(f"unsupported {act_key} {hf[act_key]!r}; only {act!r} is")


def rope(hf: dict[str, Any], default_partial: float = 1.0) -> tuple[float, float]:
    """``(rope_theta, partial_rotary_factor)``; only the default (unscaled) RoPE is supported."""
    params = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default":
        raise ValueError(f"unsupported rope_type {rope_type!r}; only 'default' is")
    theta = params.get("rope_theta", hf.get("rope_theta", 10000.0))
    partial = params.get("partial_rotary_factor", hf.get("partial_rotary_factor", default_partial))
    return float(theta), float(partial)


def special_ids(hf: dict[str, Any]) -> dict[str, int | None]:
    return {k: first_id(hf.get(k)) for k in ("bos_token_id", "eos_token_id", "pad_token_id")}


def linear(wm: WeightMap, hf: str, local: str, bias: bool) -> None:
    wm[f"{hf}.weight"] = Target(f"{local}.weight")
    if bias:
        wm[f"{hf}.bias"] = Target(f"{local}.bias")


def attention(wm: WeightMap, hf: str, local: str, cfg: ModelConfig) -> None:
    """``q_proj``/``k_proj``/``v_proj`` into ``qkv_proj``, ``o_proj``, and the q/k norms."""
    q = cfg.num_attention_heads * cfg.head_dim * (2 if cfg.attention_output_gate else 1)
    kv = cfg.num_key_value_heads * cfg.head_dim
    rows = {"q_proj": slice(0, q), "k_proj": slice(q, q + kv), "v_proj": slice(q + kv, q + 2 * kv)}
    for name, part in rows.items():
        wm[f"{hf}.{name}.weight"] = Target(f"{local}.qkv_proj.weight", (part,))
        if cfg.attention_bias:
            wm[f"{hf}.{name}.bias"] = Target(f"{local}.qkv_proj.bias", (part,))
    linear(wm, f"{hf}.o_proj", f"{local}.o_proj", cfg.attention_bias)
    if cfg.attention_qk_norm:
        wm[f"{hf}.q_norm.weight"] = Target(f"{local}.q_norm.weight")
        wm[f"{hf}.k_norm.weight"] = Target(f"{local}.k_norm.weight")


def mamba2(wm: WeightMap, hf: str, local: str, cfg: ModelConfig) -> None:
    linear(wm, f"{hf}.in_proj", f"{local}.in_proj", cfg.mamba_proj_bias)
    linear(wm, f"{hf}.conv1d", f"{local}.conv1d", cfg.mamba_conv_bias)
    for name in ("dt_bias", "A_log", "D"):
        wm[f"{hf}.{name}"] = Target(f"{local}.{name}")
    if cfg.mamba_norm != "gate":
        wm[f"{hf}.norm.weight"] = Target(f"{local}.norm.weight")
    linear(wm, f"{hf}.out_proj", f"{local}.out_proj", cfg.mamba_out_proj_bias)


def mlp(wm: WeightMap, hf: str, local: str, size: int, gated: bool, bias: bool) -> None:
    """``gate_proj`` and ``up_proj`` into ``gate_up_proj`` (``up_proj`` alone when not gated)."""
    if gated:
        for name, part in (("gate_proj", slice(0, size)), ("up_proj", slice(size, 2 * size))):
            wm[f"{hf}.{name}.weight"] = Target(f"{local}.gate_up_proj.weight", (part,))
            if bias:
                wm[f"{hf}.{name}.bias"] = Target(f"{local}.gate_up_proj.bias", (part,))
    else:
        linear(wm, f"{hf}.up_proj", f"{local}.gate_up_proj", bias)
    linear(wm, f"{hf}.down_proj", f"{local}.down_proj", bias)


def experts(wm: WeightMap, hf: str, local: str, count: int, size: int, gated: bool) -> None:
    """One tensor per expert (``{hf}.{e}.gate_proj.weight`` ...) into the stacked parameters."""
    for e in range(count):
        if gated:
            wm[f"{hf}.{e}.gate_proj.weight"] = Target(f"{local}.gate_up", (e, slice(0, size)))
            wm[f"{hf}.{e}.up_proj.weight"] = Target(f"{local}.gate_up", (e, slice(size, None)))
        else:
            wm[f"{hf}.{e}.up_proj.weight"] = Target(f"{local}.gate_up", (e,))
        wm[f"{hf}.{e}.down_proj.weight"] = Target(f"{local}.down", (e,))


def embeddings(wm: WeightMap, embed: str, final_norm: str, cfg: ModelConfig) -> None:
    """Embedding, final norm and LM head (absent from tied checkpoints)."""
    wm[embed] = Target("embed_tokens.weight")
    wm[final_norm] = Target("final_norm.weight")
    if not cfg.tie_word_embeddings:
        wm["lm_head.weight"] = Target("lm_head.weight")
