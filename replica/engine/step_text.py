"""The text of the running turns' tokens, a batch at a time: ``step_text(tokenizer)``.

Both kinds give the text ``DecodeStream`` gives each turn, token by token (what a turn's
``TextStream`` would: "" while a token leaves an incomplete UTF-8 tail, which comes with the
token that completes it): ``pieces(turn_ids, tokens)`` for one token of each of a batch's turns,
``push(turn_id, token)`` for one, and ``finish(turn_id)`` the text a turn still holds back when it
ends (and forgets it). A row whose text could not be made (its decoder raised) is None in
``pieces``, and why is in ``failed`` (by turn id) for the caller to take. Stop strings are not
theirs (``StopStrings``, for the turns that have them).

``ByteLevelText`` (byte-level decoders, ``BytePieces``): a step whose turns hold nothing back and
whose tokens are complete text is one table look-up per row; otherwise the rows' pending bytes and
new bytes are decoded in one pass over the batch, and only the turns left with an incomplete tail
keep state. Its Python calls per step do not grow with the batch (the per-row work is in
comprehensions and C loops).
``StreamedText`` (any other decoder, e.g. SentencePiece's, whose text of a token depends on what
came before): one ``TextStream`` per turn. Used on the engine thread only.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

from replica.engine.byte_pieces import REPLACEMENT, BytePieces
from replica.model.tokenizer import TextStream, Tokenizer

_decode = partial(bytes.decode, encoding="utf-8", errors="replace")


class ByteLevelText:
    failed: dict[int, Exception] = {}  # never set: a table look-up and a lossy decode cannot fail

    def __init__(self, pieces: BytePieces) -> None:
        self._bytes_of = pieces.bytes_of
        self._text_of = pieces.text_of
        self._held: dict[int, bytes] = {}  # turn id -> bytes not streamed yet (an incomplete tail)

    def pieces(self, turn_ids: Sequence[int], tokens: Sequence[int]) -> list[str | None]:
        text_of, held = self._text_of, self._held
        texts = [text_of[t] for t in tokens]
        if not held and None not in texts:  # the common case: every token is complete text
            return texts
        bytes_of = self._bytes_of
        chunks = [
            held[r] + bytes_of[t] if r in held else bytes_of[t] for r, t in zip(turn_ids, tokens)
        ]
        texts = list(map(_decode, chunks))
        if held:
            batch = set(turn_ids)
            held = self._held = {r: b for r, b in held.items() if r not in batch}
        # a tail DecodeStream holds back: text ending in U+FFFD (an empty chunk decodes to "")
        rows = zip(turn_ids, chunks, texts)
        held.update({r: c for r, c, s in rows if c and s[-1] == REPLACEMENT})
        return ["" if c and s[-1] == REPLACEMENT else s for c, s in zip(chunks, texts)]

    def push(self, turn_id: int, token: int) -> str:
        return self.pieces((turn_id,), (token,))[0] or ""

    def finish(self, turn_id: int) -> str:
        tail = self._held.pop(turn_id, None)
        return _decode(tail) if tail else ""


class StreamedText:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._streams: dict[int, TextStream] = {}  # by turn id, from its first token
        self.failed: dict[int, Exception] = {}

    def pieces(self, turn_ids: Sequence[int], tokens: Sequence[int]) -> list[str | None]:
        return [self._piece(r, t) for r, t in zip(turn_ids, tokens)]

    def _piece(self, turn_id: int, token: int) -> str | None:
        try:
            return self.push(turn_id, token)
        except Exception as exc:  # noqa: BLE001 - fails that turn only (the caller's to end)
            self.failed[turn_id] = exc
            return None

    def push(self, turn_id: int, token: int) -> str:
        stream = self._streams.get(turn_id)
        if stream is None:
            stream = self._streams[turn_id] = TextStream(self.tokenizer)
        return stream.push(token)

    def finish(self, turn_id: int) -> str:
        stream = self._streams.pop(turn_id, None)
        return stream.flush() if stream is not None else ""


StepText = ByteLevelText | StreamedText


def step_text(tokenizer: Tokenizer, ids: int = 0) -> StepText:
    """The batched text of ``tokenizer``'s byte-level table (for token ids below ``ids`` at
    least: the model's vocabulary), else per-turn streams."""
    pieces = BytePieces.of(tokenizer, ids)
    return StreamedText(tokenizer) if pieces is None else ByteLevelText(pieces)
