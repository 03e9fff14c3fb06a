"""Choosing and loading a family: built-ins, unsupported model types, and checkpoints whose
tensors do not match their config (named in the error)."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from replica.model import BUILTINS, LayerBuffers, load, load_model
from replica.model.config import ModelConfig


@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_builtins_run_and_depend_on_context(name):
    cfg, model, tok = load(name)
    assert tok.vocab_size == cfg.vocab_size and cfg.model_type == BUILTINS[name]
    buffers = LayerBuffers.allocate(cfg, mamba_slots=2, kv_token_slots=64)
    nexts = set()
    for text in ("the cat sat on", "a dog ran to", "one two three"):
        ids = torch.tensor(tok.encode(text))
        logits = model.forward_extend(ids, 0, 1, torch.arange(len(ids)), buffers)
        nexts.add(int(logits.argmax()))
    assert len(nexts) > 1
    if name == "tiny-bamba":
        assert cfg == ModelConfig()


def test_unknown_names_list_what_is_supported(tmp_path):
    with pytest.raises(ValueError, match="tiny-qwen3-next") as err:
        load("tiny-llama")
    assert "tiny-nemotron-h" in str(err.value) and "tiny-falcon-h1" in str(err.value)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ValueError) as err:
        load_model(str(tmp_path))
    for family in ("bamba", "granitemoehybrid", "nemotron_h", "falcon_h1", "qwen3_next"):
        assert family in str(err.value)


def _copy(src: str, dst) -> tuple[str, dict[str, torch.Tensor]]:
    shutil.copytree(src, dst)
    path = os.path.join(dst, "model.safetensors")
    return path, load_file(path)


def test_mismatched_checkpoint_names_tensors(peer_checkpoint, tmp_path):
    path, tensors = _copy(peer_checkpoint("qwen3_next"), tmp_path / "ckpt")
    del tensors["model.layers.0.mlp.experts.3.up_proj.weight"]
    tensors["model.layers.0.mlp.experts.4.up_proj.weight"] = torch.zeros(16, 64)
    tensors["model.layers.1.linear_attn.A_log"] = torch.zeros(3)
    tensors["mtp.fc.weight"] = torch.zeros(2, 2)  # the multi-token-prediction head is skipped
    save_file(tensors, path)
    with pytest.raises(ValueError) as err:
        load_model(str(tmp_path / "ckpt"))
    msg = str(err.value)
    assert "missing tensors: model.layers.0.mlp.experts.3.up_proj.weight" in msg
    assert "unexpected tensors: model.layers.0.mlp.experts.4.up_proj.weight" in msg
    assert "model.layers.1.linear_attn.A_log (3,) (expected (4,))" in msg
    assert "mtp" not in msg


def test_nemotron_loads_with_either_prefix(peer_checkpoint, tmp_path):
    """Hub checkpoints name Nemotron-H tensors ``backbone.*``, transformers' modules ``model.*``."""
    _, ours, _ = load_model(peer_checkpoint("nemotron_h"))
    path, tensors = _copy(peer_checkpoint("nemotron_h"), tmp_path / "ckpt")
    assert any(n.startswith("backbone.") for n in tensors)
    save_file({n.replace("backbone.", "model.", 1): t for n, t in tensors.items()}, path)
    _, renamed, _ = load_model(str(tmp_path / "ckpt"))
    for a, b in zip(ours.parameters(), renamed.parameters(), strict=True):
        assert torch.equal(a, b)
