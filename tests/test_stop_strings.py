"""``StopStrings`` against ``str.find`` on the whole text: however the text is cut into pieces,
what it streams is the text before the first stop string (all of it when none occurs), the match
is reported on the piece that completes it, and nothing is streamed after. The match is the one
that completes first (the longest of those), so the cuts never change what streams."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from replica.engine.stop_strings import StopStrings

ALPHABET = "ab✓ \n"
texts = st.text(alphabet=ALPHABET, max_size=40)
stops = st.lists(st.text(alphabet=ALPHABET, min_size=1, max_size=4), max_size=3)


@settings(max_examples=400, deadline=None)
@given(text=texts, stop_strings=stops, cuts=st.lists(st.integers(0, 40), max_size=12))
def test_streams_the_text_before_the_first_stop_string(text, stop_strings, cuts):
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    pieces = [text[a:b] for a, b in zip(bounds, bounds[1:])]
    matcher = StopStrings(tuple(stop_strings))
    streamed, stopped_at = [], None
    for i, piece in enumerate(pieces):
        out, stopped = matcher.feed(piece)
        streamed.append(out)
        if stopped and stopped_at is None:
            stopped_at = i
    if stopped_at is None:
        streamed.append(matcher.flush())
    found = [(i + len(s), i) for s in stop_strings if (i := text.find(s)) >= 0]
    end, first = min(found) if found else (None, len(text))  # completes first, then longest
    assert "".join(streamed) == text[:first]
    if found:
        assert stopped_at is not None and bounds[stopped_at] < end <= bounds[stopped_at + 1]
    else:
        assert stopped_at is None


def test_the_match_that_completes_first_wins():
    for pieces in (["abcd"], ["abc", "d"], ["a", "b", "c", "d"]):
        matcher = StopStrings(("abcd", "bc"))
        assert "".join(matcher.feed(p)[0] for p in pieces) == "a" and matcher.matched == "bc"


def test_holds_back_only_what_may_start_a_stop_string():
    matcher = StopStrings(("abc", "xy"))
    assert matcher.feed("hello a") == ("hello ", False)
    assert matcher.feed("b") == ("", False)
    assert matcher.feed("d x") == ("abd ", False)
    assert matcher.feed("y and more") == ("", True)
    assert matcher.feed("after") == ("", True) and matcher.flush() == ""
    assert matcher.matched == "xy"
