"""A checkpoint as a real one is laid out: a tiny random transformers Bamba (no EOS of its own)
saved with ``save_pretrained``, a byte-level BPE ``tokenizer.json`` trained here with
``tokenizers``, and a ``tokenizer_config.json`` transformers' ``AutoTokenizer`` loads; plus the
helpers the generation tests share (an EOS in ``generation_config.json``, a stop string across
two tokens); transformers' greedy ``generate`` is ``tests.support.hf_peer.hf_greedy``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from replica.model import Tokenizer as OurTokenizer
from tests.support.hf_peer import VOCAB, tiny_hf_bamba

CORPUS = [
    "the session keeps its state between turns",
    "hello there, how are you today? très bien, merci",
    "mamba slots are freed when a session ends ✓",
    "stream the tokens as they come 🙂 — naïve café",
] * 20


def save_bpe_peer(path: Path, seed: int, model=None):
    """Save the checkpoint in ``path`` (``model``: a transformers model of ``VOCAB`` tokens
    instead of ``tiny_hf_bamba``'s); returns the transformers model."""
    hf = model if model is not None else tiny_hf_bamba(seed=seed)
    hf.save_pretrained(str(path))
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer)
    tok.save(str(path / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "</s>"}
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return hf


def with_generation_config(src: str, dst: Path, config: dict) -> str:
    """A copy of the checkpoint ``src`` whose ``generation_config.json`` is ``config``."""
    shutil.copytree(src, dst)
    (dst / "generation_config.json").write_text(json.dumps(config))
    return str(dst)


def first_new_at(tokens: list[int], start: int) -> int:
    """An index >= ``start`` whose token does not occur before it."""
    return next(k for k in range(start, len(tokens)) if tokens[k] not in tokens[:k])


def stop_across_tokens(tok: OurTokenizer, tokens: list[int]) -> tuple[int, str]:
    """``(j, stop)``: a string made of up to two characters of the end of token j and of the
    start of token j + 1 (both decoding to whole characters), occurring first there in the
    tokens' text; the boundary with the longest such string."""
    full = tok.decode(tokens)
    ends = [len(tok.decode(tokens[: i + 1])) for i in range(len(tokens))]

    def across(j: int) -> str:
        a, b = min(2, ends[j] - ends[j - 1]), min(2, ends[j + 1] - ends[j])
        stop = full[ends[j] - a : ends[j] + b]
        whole = "\ufffd" not in full[ends[j - 1] : ends[j + 1]]
        whole = whole and tok.decode(tokens[: j + 1]) == full[: ends[j]]
        return stop if a and b and whole and full.find(stop) == ends[j] - a else ""

    j = max(range(2, len(tokens) - 2), key=lambda j: len(across(j)))
    assert across(j), "no boundary of whole characters in the tokens' text"
    return j, across(j)
