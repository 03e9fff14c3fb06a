"""Tokenizers: a byte tokenizer for the built-in tiny models and a wrapper of ``tokenizer.json``
checkpoints, both over a ``tokenizers.Tokenizer`` (``backend``) that streams text through
``tokenizers.decoders.DecodeStream`` (``TextStream``).

Both provide ``encode(text) -> list[int]``, ``decode(ids) -> str`` (special ids skipped),
``vocab_size``, ``bos_token_id``, ``eos_token_id`` and ``backend``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as Backend
from tokenizers.decoders import DecodeStream


class Tokenizer(Protocol):
    vocab_size: int
    bos_token_id: int | None
    eos_token_id: int | None
    backend: Backend

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class ByteTokenizer:
    """Ids ``0..255`` are bytes of the UTF-8 text, ``256`` is BOS, ``257`` is EOS.

    ``vocab_size`` may be larger than 258 (to match a model's embedding); ids above EOS are
    reserved and, like BOS/EOS, decode to nothing. Text is decoded by a byte-level ``backend``
    (each byte one token, invalid UTF-8 replaced as Python's ``errors="replace"`` does).
    """

    BOS = 256
    EOS = 257

    def __init__(self, vocab_size: int = 258) -> None:
        if vocab_size < 258:
            raise ValueError(f"ByteTokenizer needs vocab_size >= 258, got {vocab_size}")
        self.vocab_size = vocab_size
        self.bos_token_id: int | None = self.BOS
        self.eos_token_id: int | None = self.EOS
        self.backend = _byte_backend(vocab_size)

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=True)


LONG_TEXT_CHARS = 16_384  # beyond this, encoding takes milliseconds: let go of the GIL


class HFTokenizer:
    """A ``tokenizers.Tokenizer`` loaded from ``tokenizer.json``."""

    def __init__(
        self, path: str, bos_token_id: int | None = None, eos_token_id: int | None = None
    ) -> None:
        from tokenizers import Tokenizer as _Tok

        self._tok = self.backend = _Tok.from_file(path)
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` without added special tokens (the engine adds what it needs).

        A long text goes through ``encode_batch``, which releases the GIL while it works
        (``encode`` holds it: seconds for megabytes, in which no other thread of the process,
        the actor's event loop included, runs); both give the same ids."""
        if len(text) < LONG_TEXT_CHARS:
            return self._tok.encode(text, add_special_tokens=False).ids
        return self._tok.encode_batch([text], add_special_tokens=False)[0].ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)


def _byte_backend(vocab_size: int) -> Backend:
    """Ids 0..255: the bytes, spelt as byte-level BPE spells them (so ``decoders.ByteLevel``
    turns them back into UTF-8); the ids above are special tokens."""
    alphabet = byte_level_chars()
    vocab = {alphabet[b]: b for b in range(256)}
    special = ["<bos>", "<eos>", *(f"<reserved_{i}>" for i in range(258, vocab_size))]
    vocab.update({token: 256 + i for i, token in enumerate(special)})
    backend = Backend(models.WordLevel(vocab, unk_token="<eos>"))
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(token, special=True) for token in special])
    return backend


def byte_level_chars() -> list[str]:
    """The character byte-level BPE (GPT-2's ``bytes_to_unicode``) spells each byte with."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    assert set(chars.values()) == set(pre_tokenizers.ByteLevel.alphabet())
    return [chars[b] for b in range(256)]


class TextStream:
    """The text of a stream of token ids, piece by piece, through ``DecodeStream``.

    ``push(id)`` returns the text that became final with that token ("" while the decoded tail is
    an incomplete UTF-8 sequence, or the token is special). ``flush()`` returns what is still
    held back (an incomplete sequence at the end, replaced as the decoder replaces it). One per
    turn; not thread-safe.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._backend = tokenizer.backend
        self._stream = DecodeStream(skip_special_tokens=True)
        self._last: list[int] = []  # the ids of the last piece emitted (left context of a flush)
        self._held: list[int] = []  # ids pushed since then

    def push(self, token_id: int) -> str:
        piece = self._stream.step(self._backend, token_id)
        self._held.append(token_id)
        if piece is None:
            return ""
        self._last, self._held = self._held, []
        return piece

    def flush(self) -> str:
        if not self._held:
            return ""
        before = self._backend.decode(self._last, skip_special_tokens=True)
        text = self._backend.decode(self._last + self._held, skip_special_tokens=True)
        self._last, self._held = self._last + self._held, []
        return text[len(before) :] if text.startswith(before) else text
