"""A tiny random transformers ``BambaForCausalLM``: the peer our model and engine are checked
against. transformers is a test dependency (the dev extra), so it is imported, never skipped."""

from __future__ import annotations

import torch
import transformers

VOCAB = 384


def tiny_hf_bamba(n_groups: int = 1, tied: bool = False, seed: int = 0):
    """Small enough for 2 CPU cores; chunk size 16 so prefills span several SSD chunks. The 1-d
    parameters (norms, D, dt_bias, A_log, biases) are moved off their constant inits so a wrong
    name mapping shows up in the logits."""
    torch.manual_seed(seed)
    hf_cfg = transformers.BambaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        attn_layer_indices=[1, 3],
        mamba_n_heads=8,
        mamba_d_head=16,
        mamba_n_groups=n_groups,
        mamba_d_state=16,
        mamba_chunk_size=16,
        initializer_range=0.05,
        tie_word_embeddings=tied,
        eos_token_id=None,
        pad_token_id=None,
        bos_token_id=None,
    )
    model = transformers.BambaForCausalLM(hf_cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    return model


def saved_peer(tmp_path_factory, seed: int):
    """``tiny_hf_bamba(seed=seed)`` and the checkpoint it saved (``save_pretrained``) in a
    fresh temporary directory: (hf model, path)."""
    hf = tiny_hf_bamba(seed=seed)
    path = tmp_path_factory.mktemp(f"bamba-peer-{seed}")
    hf.save_pretrained(str(path))
    return hf, str(path)


def hf_greedy(model, prompt: list[int], new: int, until_eos: bool = False) -> list[int]:
    """transformers' greedy ``generate`` (with its cache): the ``new`` tokens after ``prompt``;
    with ``until_eos``, fewer when the model's EOS (if it has one) comes first."""
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new,
            min_new_tokens=None if until_eos else new,
            do_sample=False,
        )
    return out[0, len(prompt) :].tolist()
