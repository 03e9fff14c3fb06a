"""Choosing a model: the built-in ``tiny-bamba`` or an HF checkpoint directory."""

from __future__ import annotations

import math

import torch
from torch import nn

from replica.model.bamba import BambaModel
from replica.model.config import ModelConfig
from replica.model.loader import load_model
from replica.model.tokenizer import ByteTokenizer, Tokenizer

TINY_BAMBA = "tiny-bamba"


def init_weights(model: BambaModel, seed: int = 0, linear_std: float = 0.1) -> None:
    """Deterministic random init from ``seed`` (independent of the global RNG).

    Embedding weights ~ N(0, 0.02), linear weights ~ N(0, ``linear_std``) — large enough that a
    tiny random model's next token depends on its context (with 0.02 it barely does, and tests of
    state reuse would pass even with the state lost); norms one; biases zero; conv1d weights
    ~ N(0, 1/d_conv); Mamba ``A_log = log(1..n_heads)``, ``D = 1`` and ``dt_bias`` the inverse
    softplus of time steps log-spaced in [0.001, 0.1] (the usual Mamba2 init).
    """
    gen = torch.Generator().manual_seed(seed)

    def normal(p: torch.Tensor, std: float) -> None:
        p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32) * std)

    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                normal(module.weight, 0.02 if isinstance(module, nn.Embedding) else linear_std)
                if getattr(module, "bias", None) is not None:
                    module.bias.zero_()
            elif isinstance(module, nn.Conv1d):
                normal(module.weight, 1.0 / module.kernel_size[0])
                if module.bias is not None:
                    module.bias.zero_()
        if model.cfg.tie_word_embeddings:
            model.lm_head.weight = model.embed_tokens.weight
        for layer in model.layers:
            layer.input_layernorm.weight.fill_(1.0)
            layer.pre_ff_layernorm.weight.fill_(1.0)
            if layer.is_attention:
                continue
            mixer = layer.mamba
            n = mixer.n_heads
            mixer.A_log.copy_(torch.log(torch.arange(1, n + 1, dtype=torch.float32)))
            mixer.D.fill_(1.0)
            mixer.norm.weight.fill_(1.0)
            dt = torch.exp(torch.linspace(math.log(1e-3), math.log(1e-1), n))
            mixer.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus^-1(dt)
        model.final_layernorm.weight.fill_(1.0)


def build_tiny_bamba(seed: int = 0) -> tuple[ModelConfig, BambaModel, ByteTokenizer]:
    """The default :class:`ModelConfig` with fixed-seed random weights and a byte tokenizer.

    Float32 on the CPU, in eval mode; move it with ``model.to(device)``.
    """
    cfg = ModelConfig()
    model = BambaModel(cfg)
    init_weights(model, seed)
    model.eval()
    return cfg, model, ByteTokenizer(cfg.vocab_size)


def load(
    model: str = TINY_BAMBA,
    model_path: str | None = None,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> tuple[ModelConfig, BambaModel, Tokenizer]:
    """``model_path`` (an HF checkpoint directory) when given, else the named built-in model."""
    if model_path:
        return load_model(model_path, device=device, dtype=dtype)
    if model != TINY_BAMBA:
        raise ValueError(f"unknown model {model!r}; use {TINY_BAMBA!r} or give a model path")
    cfg, net, tok = build_tiny_bamba()
    return cfg, net.to(device=device, dtype=dtype), tok
