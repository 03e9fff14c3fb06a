"""A chat checkpoint as real ones are laid out: ``bpe_peer``'s tiny random transformers Bamba and
BPE tokenizer, plus a chat template (messages framed by ``<s>`` and ``</s>``), ``</s>`` as the
EOS in ``generation_config.json``, and an EOS the model reaches: its output row is made a
scaled copy of a token that greedy decoding picks a few tokens in, so replies end by EOS after a few
tokens on some prompts and run to their length on others. transformers' ``AutoTokenizer`` and
``generate`` (``hf_peer.hf_greedy``, until the EOS) on the same directory are the reference."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoTokenizer

from tests.support.bpe_peer import save_bpe_peer
from tests.support.hf_peer import hf_greedy

TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant\n{% endif %}"
)
PROBES = ["hello there"]


def save_chat_peer(path: Path, seed: int, model=None):
    """Save the checkpoint in ``path`` (``model``: as ``save_bpe_peer`` takes it); returns
    (the transformers model, its tokenizer)."""
    hf = save_bpe_peer(path, seed, model)
    config = json.loads((path / "tokenizer_config.json").read_text())
    config |= {"chat_template": TEMPLATE, "bos_token": "<s>", "eos_token": "</s>"}
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    tok = AutoTokenizer.from_pretrained(str(path))
    eos = tok.convert_tokens_to_ids("</s>")
    # the token greedy decoding picks sixth: replies reach the EOS there, or earlier
    first = prompt_ids(tok, [{"role": "user", "content": PROBES[0]}])
    frequent = hf_greedy(hf, first, 6)[5]
    with torch.no_grad():
        hf.lm_head.weight[eos] = hf.lm_head.weight[frequent] * 1.25
    hf.generation_config.eos_token_id = eos
    hf.save_pretrained(str(path))
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    return hf, tok


def prompt_ids(tok, messages: list[dict[str, str]]) -> list[int]:
    """The prompt tokens transformers makes of ``messages``."""
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tok.encode(text, add_special_tokens=False)


def save_long_reply_peer(path: Path, seed: int = 5):
    """``save_chat_peer``'s checkpoint with its EOS row zeroed: greedy replies never pick the
    EOS (its logit is 0, below the best of the others), so every reply runs to its length; the
    EOS stays the configured one. Returns (the transformers model, its tokenizer)."""
    hf, tok = save_chat_peer(path, seed)
    eos = tok.convert_tokens_to_ids("</s>")
    with torch.no_grad():
        hf.lm_head.weight[eos] = 0
    hf.save_pretrained(str(path))
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    return hf, tok


def long_reply_peer(tmp_path_factory) -> tuple[str, object, object]:
    """A module's ``save_long_reply_peer`` checkpoint: (its directory, the transformers model,
    its tokenizer)."""
    path = tmp_path_factory.mktemp("chat-peer")
    hf, tok = save_long_reply_peer(path)
    return str(path), hf, tok
