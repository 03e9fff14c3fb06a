"""The bench-size models ``bench.vs_transformers`` and ``bench.state_update`` build: a
transformers config per family, small enough for a 2-core CPU, shaped like the real ones."""

from __future__ import annotations

import transformers

VOCAB = 2048


def configs(h: int) -> dict:
    """Bench-size configs of hidden size ``h``: 6 layers, 8 query / 2 KV heads, Mamba2 heads of
    32 channels and 64 states, DeltaNet heads of 64, 8 experts (top-2) where a family has MoE."""
    common = dict(
        vocab_size=VOCAB,
        hidden_size=h,
        initializer_range=0.02,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=0,
        num_attention_heads=8,
        num_key_value_heads=2,
    )
    return {
        "bamba": lambda: transformers.BambaConfig(
            intermediate_size=3 * h, num_hidden_layers=6, attn_layer_indices=[2, 5],
            mamba_n_heads=h // 16, mamba_d_state=64, mamba_chunk_size=128, **common),
        "granitemoehybrid": lambda: transformers.GraniteMoeHybridConfig(
            intermediate_size=h, shared_intermediate_size=2 * h, num_hidden_layers=6,
            layer_types=["mamba"] * 2 + ["attention"] + ["mamba"] * 2 + ["attention"],
            mamba_n_heads=h // 16, mamba_d_state=64, mamba_chunk_size=128, num_local_experts=8,
            num_experts_per_tok=2, embedding_multiplier=12.0, residual_multiplier=0.22,
            attention_multiplier=8 / h, logits_scaling=4.0, **common),
        "nemotron_h": lambda: transformers.NemotronHConfig(
            intermediate_size=3 * h, hybrid_override_pattern="M-M*-M-M*-", head_dim=h // 8,
            mamba_num_heads=h // 16, mamba_head_dim=32, n_groups=2, ssm_state_size=64,
            chunk_size=128, **common),
        "falcon_h1": lambda: transformers.FalconH1Config(
            intermediate_size=3 * h, num_hidden_layers=6, mamba_d_ssm=2 * h,
            mamba_n_heads=h // 16, mamba_d_state=64, mamba_chunk_size=128, **common),
        "qwen3_next": lambda: transformers.Qwen3NextConfig(
            intermediate_size=3 * h, num_hidden_layers=6, head_dim=h // 4,
            linear_num_key_heads=h // 64, linear_num_value_heads=h // 32, linear_key_head_dim=64,
            linear_value_head_dim=64, num_experts=8, num_experts_per_tok=2,
            moe_intermediate_size=h, shared_expert_intermediate_size=h, **common),
    }  # fmt: skip
