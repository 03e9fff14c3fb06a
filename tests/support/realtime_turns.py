"""What the Realtime tests do with a connection of the ``openai`` SDK's ``realtime.connect``, and
their reference: transformers' greedy continuation of the token sequence the session holds.

``peer`` is ``(path, transformers model, tokenizer)`` of a chat checkpoint
(``tests.support.chat_peer``).
"""

from __future__ import annotations

from tests.support.chat_peer import prompt_ids
from tests.support.hf_peer import hf_greedy

NEW = 8


def reference(peer, ids: list[int], new: int = NEW) -> tuple[list[int], str]:
    """transformers' greedy reply to ``ids`` (until the EOS, at most ``new`` tokens): its ids
    and its text."""
    _, hf, tok = peer
    out = hf_greedy(hf, ids, new, until_eos=True)
    return out, tok.decode(out, skip_special_tokens=True)


def continued(peer, state: list[int], messages: list[dict[str, str]]) -> list[int]:
    """What a response feeds: the rendering past the text of ``state`` (the session's tokens)."""
    tok = peer[2]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    prior = tok.decode(state, skip_special_tokens=False)
    assert text.startswith(prior)
    return tok.encode(text[len(prior) :], add_special_tokens=False)


def replies_of_new_tokens(conn) -> None:
    """Take ``session.created``, and have the session's replies end at ``NEW`` tokens (its
    ``session.updated`` taken too)."""
    conn.recv()
    conn.session.update(session={"type": "realtime", "max_output_tokens": NEW})
    conn.recv()


def user(text: str) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def until_done(conn) -> tuple[list, object]:
    """The events up to and with the next ``response.done``, and that response."""
    events = []
    for event in conn:
        events.append(event)
        if event.type == "response.done":
            return events, event.response
    raise AssertionError("the socket closed before response.done")


async def until_done_async(conn) -> tuple[list, object]:
    events = []
    async for event in conn:
        events.append(event)
        if event.type == "response.done":
            return events, event.response
    raise AssertionError("the socket closed before response.done")


def deltas(events) -> str:
    return "".join(e.delta for e in events if e.type == "response.output_text.delta")


def ask(conn, text: str) -> tuple[list, object]:
    """A user message and a response to it; its events and the response."""
    conn.conversation.item.create(item=user(text))
    conn.response.create()
    return until_done(conn)


def first_exchange(conn, peer, text: str = "hello there") -> tuple[list[dict], list[int], str]:
    """On a fresh connection (replies of ``NEW`` tokens from then on), ``text`` asked, its reply
    checked equal to transformers' greedy one: (the messages so far, the state the session
    holds after it, the reply's text)."""
    replies_of_new_tokens(conn)
    first = [{"role": "user", "content": text}]
    ids = prompt_ids(peer[2], first)
    out, reply = reference(peer, ids)
    events, _ = ask(conn, text)
    assert deltas(events) == reply
    return first, ids + out, reply
