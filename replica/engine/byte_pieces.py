"""``BytePieces``: each token id's bytes and text, for a tokenizer whose decoder is byte-level
(``decoders.ByteLevel``: GPT-2 style BPE, and the built-in ``ByteTokenizer``).

Such a decoder maps every token to bytes and decodes their concatenation as UTF-8 (invalid
sequences replaced): decoding is concatenation, so the text a token adds to a stream whose
earlier text is complete is its own bytes decoded, and a token that leaves no incomplete
sequence needs no per-turn stream state at all. ``text_of[id]`` is that text, or None when the
token's bytes decode to text ending in U+FFFD (an incomplete or invalid tail, which
``DecodeStream`` holds back until a later token completes it); ``bytes_of[id]`` its bytes (empty
for special tokens and ids the tokenizer does not know, which decode to nothing). Built once per
engine (one batched decode of the vocabulary), read-only after.
"""

from __future__ import annotations

from tokenizers import decoders

from replica.model.tokenizer import Tokenizer, byte_level_chars

REPLACEMENT = "\ufffd"


class BytePieces:
    def __init__(self, bytes_of: list[bytes], text_of: list[str | None]) -> None:
        self.bytes_of = bytes_of
        self.text_of = text_of

    @staticmethod
    def of(tokenizer: Tokenizer, ids: int = 0) -> BytePieces | None:
        """The table of ``tokenizer``, for at least ``ids`` ids (the model's vocabulary may be
        larger than the tokenizer's); None when its decoder is not byte-level, or some token's
        bytes cannot be recovered exactly (its text then streams through ``DecodeStream``)."""
        backend = tokenizer.backend
        if not isinstance(backend.decoder, decoders.ByteLevel):
            return None
        size = backend.get_vocab_size(with_added_tokens=True)
        texts = backend.decode_batch([[i] for i in range(size)], skip_special_tokens=True)
        byte_of_char = {c: b for b, c in enumerate(byte_level_chars())}
        bytes_of: list[bytes] = []
        text_of: list[str | None] = []
        for i, text in enumerate(texts):
            if REPLACEMENT not in text:  # valid UTF-8: the text is its bytes
                raw = text.encode()
            else:  # the decoder's own mapping: byte-level characters, else the token's UTF-8
                token = backend.id_to_token(i) or ""
                if all(c in byte_of_char for c in token):
                    raw = bytes(byte_of_char[c] for c in token)
                else:
                    raw = token.encode()
                if raw.decode("utf-8", "replace") != text:
                    return None
            bytes_of.append(raw)
            text_of.append(None if text.endswith(REPLACEMENT) else text)
        unknown = max(ids - size, 0)
        return BytePieces(bytes_of + [b""] * unknown, text_of + [""] * unknown)
