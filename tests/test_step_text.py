"""The batched text of a step's turns (``replica.engine.step_text``) is exactly what a
``DecodeStream`` per turn gives: piece by piece, for every turn of every batch, and what each
turn still holds back at its end; byte-level decoders take the batched table path, others one
stream per turn."""

from __future__ import annotations

import random

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from replica.engine.step_text import ByteLevelText, StreamedText, step_text
from replica.model.tokenizer import ByteTokenizer, TextStream
from tests.support.bpe_peer import CORPUS


class Wrapped:
    """A ``tokenizers.Tokenizer`` as the engine's ``Tokenizer`` protocol has it."""

    def __init__(self, backend: Tokenizer) -> None:
        self.backend = backend
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)
        self.bos_token_id = self.eos_token_id = None

    def encode(self, text: str) -> list[int]:
        return self.backend.encode(text, add_special_tokens=False).ids

    def decode(self, ids) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=True)


def trained(pre, decoder) -> Wrapped:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre
    tok.decoder = decoder
    alphabet = (
        pre_tokenizers.ByteLevel.alphabet() if isinstance(pre, pre_tokenizers.ByteLevel) else []
    )
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"], initial_alphabet=alphabet
    )
    tok.train_from_iterator(CORPUS, trainer)
    return Wrapped(tok)


def check_against_streams(tokenizer, text, vocab: int, seed: int, natural: list[int]) -> None:
    """Many turns, each step a random subset of them with a token each (random ids, or ids of
    real text cut anywhere): every piece and every end equals a ``TextStream``'s."""
    rng = random.Random(seed)
    for trial in range(60):
        turns = rng.randint(1, 12)
        base = trial * 100  # turn ids are never reused
        streams = {base + r: TextStream(tokenizer) for r in range(turns)}
        got: dict[int, list[str]] = {r: [] for r in streams}
        want: dict[int, list[str]] = {r: [] for r in streams}
        sent: dict[int, list[int]] = {r: [] for r in streams}
        for _ in range(40):
            rids = [r for r in streams if rng.random() < 0.8]
            if trial % 2:
                tokens = [rng.randrange(vocab) for _ in rids]
            else:
                tokens = [natural[rng.randrange(len(natural))] for _ in rids]
            for rid, token, piece in zip(rids, tokens, text.pieces(rids, tokens)):
                got[rid].append(piece)
                want[rid].append(streams[rid].push(token))
                sent[rid].append(token)
        for rid, stream in streams.items():
            got[rid].append(text.finish(rid))
            want[rid].append(stream.flush())
            assert got[rid] == want[rid], (trial, rid, sent[rid])
            if trial % 2 == 0:  # real text's ids, whole: the text is what decode gives
                assert "".join(got[rid]) == tokenizer.decode(sent[rid])


def test_byte_tokenizer_pieces_equal_decode_stream():
    tok = ByteTokenizer(384)
    text = step_text(tok, 384)
    assert isinstance(text, ByteLevelText)
    natural = list("naïve café 🙂 日本語 ok ✓\n".encode()) * 4 + [256, 257, 300]
    check_against_streams(tok, text, 384, seed=1, natural=natural)


def test_byte_level_bpe_pieces_equal_decode_stream():
    tok = trained(pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel())
    text = step_text(tok, tok.vocab_size)
    assert isinstance(text, ByteLevelText)
    natural = tok.encode(" ".join(CORPUS[:4])) + [1, 2]
    check_against_streams(tok, text, tok.vocab_size, seed=2, natural=natural)


def test_other_decoders_stream_per_turn():
    tok = trained(pre_tokenizers.Metaspace(), decoders.Metaspace())
    text = step_text(tok, tok.vocab_size)
    assert isinstance(text, StreamedText)
    natural = tok.encode(" ".join(CORPUS[:4]))
    check_against_streams(tok, text, tok.vocab_size, seed=3, natural=natural)


def test_ids_the_tokenizer_does_not_know_decode_to_nothing():
    """The model's vocabulary may be larger than the tokenizer's: such ids stream no text."""
    tok = ByteTokenizer(258)
    text = step_text(tok, 512)
    assert text.pieces([1, 2], [500, ord("a")]) == ["", "a"]
    stream = TextStream(tok)
    assert [stream.push(500), stream.push(ord("a"))] == ["", "a"]
