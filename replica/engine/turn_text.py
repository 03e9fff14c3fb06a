"""``TurnText``: the streamed text of one turn: its tokens detokenized (``TextStream``) and cut at
the first of its stop strings (``StopStrings``).

``push(token)`` returns the text to stream with that token and whether a stop string is complete
(the turn must end on it); ``finish()`` the text still held back when the turn ends for any other
reason (length, a stop id, the model's EOS, an interrupt). Text of a token pushed after a stop
string completed, and the stop string itself, is never returned. One per turn.
"""

from __future__ import annotations

from replica.engine.stop_strings import StopStrings
from replica.model.tokenizer import TextStream, Tokenizer


class TurnText:
    def __init__(self, tokenizer: Tokenizer, stops: tuple[str, ...] = ()) -> None:
        self._stream = TextStream(tokenizer)
        self._stops = StopStrings(stops)
        self._has_stops = bool(stops)  # most turns have none: their pieces stream as they come

    def push(self, token_id: int) -> tuple[str, bool]:
        piece = self._stream.push(token_id)
        return self._stops.feed(piece) if self._has_stops else (piece, False)

    def finish(self) -> str:
        text, _ = self._stops.feed(self._stream.flush())
        return text + self._stops.flush()
