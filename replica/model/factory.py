"""Choosing a model: a built-in ``tiny-<family>``, an HF checkpoint directory or a hub id."""

from __future__ import annotations

import torch
from torch import nn

from replica.model.config import ModelConfig
from replica.model.deltanet import GatedDeltaNet
from replica.model.families import FAMILIES
from replica.model.hybrid import HybridModel
from replica.model.layers import GatedRMSNorm, RMSNorm
from replica.model.loader import load_model
from replica.model.mamba2 import Mamba2Mixer
from replica.model.moe import MoE
from replica.model.source import resolve
from replica.model.tokenizer import ByteTokenizer, Tokenizer

TINY_BAMBA = "tiny-bamba"
# "tiny-bamba", "tiny-granitemoehybrid", "tiny-nemotron-h", "tiny-falcon-h1", "tiny-qwen3-next"
BUILTINS = {"tiny-" + name.replace("_", "-"): name for name in FAMILIES}


def init_weights(model: HybridModel, seed: int = 0, linear_std: float = 0.1) -> None:
    """Deterministic random init from ``seed`` (independent of the global RNG).

    Embedding weights ~ N(0, 0.02), linear and expert weights ~ N(0, ``linear_std``) — large
    enough that a tiny random model's next token depends on its context (with 0.02 it barely
    does, and tests of state reuse would pass even with the state lost); norms the identity;
    biases zero; conv1d weights ~ N(0, 1/d_conv); the recurrent mixers' decay and time-step
    parameters as their ``init_dynamics`` says.
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
            elif isinstance(module, RMSNorm):
                module.weight.fill_(0.0 if module.unit_offset else 1.0)
            elif isinstance(module, GatedRMSNorm):
                module.weight.fill_(1.0)
            elif isinstance(module, (Mamba2Mixer, GatedDeltaNet)):
                module.init_dynamics()
            elif isinstance(module, MoE):
                normal(module.gate_up, linear_std)
                normal(module.down, linear_std)
                if module.cfg.router == "sigmoid":
                    module.score_bias.zero_()
        if model.cfg.tie_word_embeddings:
            model.lm_head.weight = model.embed_tokens.weight


def tiny_config(name: str) -> ModelConfig:
    """The :class:`ModelConfig` of the built-in ``name`` (see ``BUILTINS``)."""
    if name not in BUILTINS:
        raise ValueError(
            f"unknown model {name!r}; built-ins: {', '.join(BUILTINS)} (or give a model path)"
        )
    family = FAMILIES[BUILTINS[name]]
    return family.config_from_hf(family.tiny)


def build_tiny(name: str, seed: int = 0) -> tuple[ModelConfig, HybridModel, ByteTokenizer]:
    """The built-in ``name``: its family's tiny config, fixed-seed random weights and a byte
    tokenizer. Float32 on the CPU, in eval mode; move it with ``.to()``."""
    cfg = tiny_config(name)
    model = HybridModel(cfg)
    init_weights(model, seed)
    model.eval()
    return cfg, model, ByteTokenizer(cfg.vocab_size)


def build_tiny_bamba(seed: int = 0) -> tuple[ModelConfig, HybridModel, ByteTokenizer]:
    """``tiny-bamba``: the default :class:`ModelConfig` (see :func:`build_tiny`)."""
    return build_tiny(TINY_BAMBA, seed)


def load(
    model: str = TINY_BAMBA,
    model_path: str | None = None,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
    revision: str | None = None,
) -> tuple[ModelConfig, HybridModel, Tokenizer]:
    """The model ``model_path or model`` names (a built-in, a checkpoint directory or a hub id
    at ``revision``, see ``replica.model.source``), on ``device`` with its weights in ``dtype``
    (None: the checkpoint's own dtype on CUDA, float32 elsewhere and for built-ins)."""
    source = resolve(model_path or model, frozenset(BUILTINS), revision)
    if source.path is not None:
        return load_model(source.path, device=device, dtype=dtype)
    cfg, net, tok = build_tiny(source.builtin)
    return cfg, net.to(device=device, dtype=dtype or torch.float32), tok
