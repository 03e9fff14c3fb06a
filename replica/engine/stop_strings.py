"""``StopStrings``: finds a turn's stop strings in its text as it streams, across piece (token and
chunk) boundaries, and holds back what may be the start of one.

``feed(piece)`` returns the text now safe to stream and whether a stop string is complete; once
one is, the text from its first character on is never returned (nor anything after it). The
match is the one that completes first in the text (the longest of those ending there), so what
streams does not depend on how the text was cut into pieces. The text
held back is the longest tail that is a proper prefix of some stop string, so text streams as soon
as it can no longer be part of a match. One per turn.
"""

from __future__ import annotations


class StopStrings:
    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = stops
        self.matched: str | None = None  # the stop string that ended the turn
        self._held = ""  # text not streamed yet: a tail that may begin a stop string

    def feed(self, piece: str) -> tuple[str, bool]:
        """The text to stream after ``piece``, and whether a stop string is now complete."""
        if self.matched is not None:
            return "", True
        if not self.stops:
            return piece, False
        text = self._held + piece
        # the match that completes first (then the longest), whatever the pieces' cuts
        hits = [(i + len(s), i, s) for s in self.stops if (i := text.find(s)) >= 0]
        if hits:
            _, at, self.matched = min(hits)
            self._held = ""
            return text[:at], True
        keep = self._partial_tail(text)
        self._held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep], False

    def flush(self) -> str:
        """The held-back text, at the end of a turn that did not stop on a string."""
        held, self._held = self._held, ""
        return "" if self.matched is not None else held

    def _partial_tail(self, text: str) -> int:
        """Length of the longest tail of ``text`` that a stop string starts with (shorter than
        the stop string: a whole one would have matched)."""
        longest = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:n]):
                    longest = n
                    break
        return longest
