"""Tokenizers: a byte tokenizer for tiny-bamba, a wrapper of ``tokenizer.json`` checkpoints, and an
incremental detokenizer for streaming text out of tokens that may split UTF-8 characters.

Both tokenizers provide ``encode(text) -> list[int]``, ``decode(ids) -> str`` (special ids
skipped), ``vocab_size``, ``bos_token_id`` and ``eos_token_id``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class Tokenizer(Protocol):
    vocab_size: int
    bos_token_id: int | None
    eos_token_id: int | None

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class ByteTokenizer:
    """Ids ``0..255`` are bytes of the UTF-8 text, ``256`` is BOS, ``257`` is EOS.

    ``vocab_size`` may be larger than 258 (to match a model's embedding); ids above EOS are
    reserved and, like BOS/EOS, decode to nothing.
    """

    BOS = 256
    EOS = 257

    def __init__(self, vocab_size: int = 258) -> None:
        if vocab_size < 258:
            raise ValueError(f"ByteTokenizer needs vocab_size >= 258, got {vocab_size}")
        self.vocab_size = vocab_size
        self.bos_token_id: int | None = self.BOS
        self.eos_token_id: int | None = self.EOS

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


class HFTokenizer:
    """A ``tokenizers.Tokenizer`` loaded from ``tokenizer.json``."""

    def __init__(
        self, path: str, bos_token_id: int | None = None, eos_token_id: int | None = None
    ) -> None:
        from tokenizers import Tokenizer as _Tok

        self._tok = _Tok.from_file(path)
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` without added special tokens (the engine adds what it needs)."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)


class IncrementalDetokenizer:
    """Turns a stream of token ids into a stream of text pieces.

    ``push(id)`` returns the text that became final with that token: nothing while the decoded
    tail ends in an incomplete UTF-8 sequence (U+FFFD), unless ``max_pending`` tokens are already
    held back (then the replacement character is emitted). ``flush()`` returns what is left.
    Each push re-decodes only the last emitted piece plus the pending tokens (for tokenizers whose
    text depends on the left context), so the cost per token stays bounded.
    """

    def __init__(self, tokenizer: Tokenizer, max_pending: int = 8) -> None:
        self._tok = tokenizer
        self._ids: list[int] = []
        self._prefix = 0  # start of the already-emitted context re-decoded with the pending ids
        self._read = 0  # ids before this have been emitted
        self._max_pending = max_pending

    def push(self, token_id: int) -> str:
        self._ids.append(token_id)
        pending = len(self._ids) - self._read
        if self._tok.decode(self._ids[self._read :]).endswith("\ufffd"):
            if pending < self._max_pending:
                return ""
        return self._emit()

    def flush(self) -> str:
        return self._emit() if len(self._ids) > self._read else ""

    def _emit(self) -> str:
        before = self._tok.decode(self._ids[self._prefix : self._read])
        text = self._tok.decode(self._ids[self._prefix :])
        piece = text[len(before) :]
        self._prefix, self._read = self._read, len(self._ids)
        return piece
