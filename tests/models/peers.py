"""Tiny random transformers models of each family: the peers our model and engine are checked
against, and the checkpoints they are loaded from.

Weights are drawn with ``initializer_range`` 0.1 (so the next token depends on the context), and
the 1-d parameters and buffers (norms, A_log, dt_bias, D, biases, routing biases) are moved off
their constant inits so that a wrong name mapping shows up in the logits. Each family's main peer
exercises its distinctive features (MoE, muP multipliers, grouped heads, several SSD chunks with
chunk size 16); the variants cover the other layouts its adapter accepts.
"""

from __future__ import annotations

from functools import cache

import torch
import transformers

from tests.support.engine import token_ids
from tests.support.hf_peer import hf_greedy

VOCAB = 256
_COMMON = dict(vocab_size=VOCAB, initializer_range=0.1, bos_token_id=None, eos_token_id=None,
               pad_token_id=None)  # fmt: skip

CONFIGS = {
    "granitemoehybrid": lambda: transformers.GraniteMoeHybridConfig(
        hidden_size=64, intermediate_size=32, shared_intermediate_size=48, num_hidden_layers=4,
        layer_types=["mamba", "attention", "mamba", "mamba"], num_attention_heads=4,
        num_key_value_heads=2, mamba_n_heads=8, mamba_n_groups=2, mamba_d_state=16,
        mamba_chunk_size=16, num_local_experts=4, num_experts_per_tok=2,
        position_embedding_type="rope", embedding_multiplier=3.0, residual_multiplier=0.6,
        attention_multiplier=0.2, logits_scaling=1.5, **_COMMON,
    ),
    "granitemoehybrid-dense": lambda: transformers.GraniteMoeHybridConfig(
        hidden_size=48, shared_intermediate_size=64, num_hidden_layers=3,
        layer_types=["mamba", "mamba", "attention"], num_attention_heads=4, num_key_value_heads=4,
        mamba_n_heads=4, mamba_d_state=8, mamba_chunk_size=16, num_local_experts=0,
        embedding_multiplier=2.0, residual_multiplier=0.7, attention_multiplier=0.25,
        logits_scaling=2.0, tie_word_embeddings=True, **_COMMON,
    ),
    "nemotron_h": lambda: transformers.NemotronHConfig(
        hidden_size=64, intermediate_size=96, layers_block_type=["linear_attention",
        "full_attention", "mlp", "linear_attention", "moe"], num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, mamba_num_heads=8, mamba_head_dim=8, n_groups=2,
        ssm_state_size=16, chunk_size=16, n_routed_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=32, moe_shared_expert_intermediate_size=48, n_group=2,
        topk_group=1, routed_scaling_factor=1.5, **_COMMON,
    ),
    "falcon_h1": lambda: transformers.FalconH1Config(
        hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, mamba_d_ssm=64, mamba_n_heads=4, mamba_n_groups=2,
        mamba_d_state=16, mamba_chunk_size=16, mamba_rms_norm=True, embedding_multiplier=2.0,
        lm_head_multiplier=0.5, attention_in_multiplier=0.8, attention_out_multiplier=0.6,
        key_multiplier=0.7, ssm_in_multiplier=1.2, ssm_out_multiplier=0.9,
        ssm_multipliers=[1.0, 0.8, 1.1, 0.9, 1.2], mlp_multipliers=[1.1, 0.9], **_COMMON,
    ),
    "falcon_h1-no-norm": lambda: transformers.FalconH1Config(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, mamba_d_ssm=32, mamba_n_heads=4, mamba_d_state=8,
        mamba_chunk_size=16, mamba_rms_norm=False, key_multiplier=0.5, **_COMMON,
    ),
    "qwen3_next": lambda: transformers.Qwen3NextConfig(
        hidden_size=64, intermediate_size=96, num_hidden_layers=4, layer_types=[
        "linear_attention", "linear_attention", "full_attention", "linear_attention"],
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=8,
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
        shared_expert_intermediate_size=32, mlp_only_layers=[1], **_COMMON,
    ),
}  # fmt: skip

FAMILIES = ("granitemoehybrid", "nemotron_h", "falcon_h1", "qwen3_next")


@cache
def hf_model(name: str, seed: int = 0):
    """The transformers peer ``name`` (a key of ``CONFIGS``), float32, in eval mode."""
    torch.manual_seed(seed)
    cfg = CONFIGS[name]()
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        for t in model.state_dict(keep_vars=True).values():  # parameters, persistent buffers
            if t.dim() == 1 and t.is_floating_point():
                t.add_(0.1 * torch.randn_like(t))
    return model


def save_peer(name: str, path: str, seed: int = 0) -> str:
    """Save the peer as an HF checkpoint directory (what ``--model-path`` loads); returns path."""
    hf_model(name, seed).save_pretrained(path)
    return path


@cache
def conversation(name: str) -> tuple[list[int], list[int], list[int], list[int]]:
    """Two turns of a session, ``(prompt 1, reply 1, prompt 2, reply 2)``, the replies as
    transformers' greedy ``generate`` gives them over the whole conversation so far."""
    a, b = token_ids(40, 1, vocab=VOCAB), token_ids(9, 2, vocab=VOCAB)
    o1 = hf_greedy(hf_model(name), a, 10)
    return a, o1, b, hf_greedy(hf_model(name), a + o1 + b, 8)
