"""A chat turn rendered in its submit's own call (``ChatInput``, ``TurnCalls.submit_turns``):
the replica renders the conversation with the checkpoint's template (transformers' rendering
of the same messages is the reference), feeds only what follows the text of the state named
(``prior_ids``), and does nothing at all (no turn, no fork, no release) when the rendering does
not begin with that text, so its caller can replay the conversation elsewhere; each turn of a
batch gets its own result, in order, and the pools stay exact."""

from __future__ import annotations

import asyncio

import pytest

from replica.actor.engine_host import EngineHost
from replica.actor.turns import TurnCalls
from replica.api import ChatInput, ChatPrompt, ForkedTurn, RenderedTurn, SamplingParams
from replica.failpoints import CallFaults
from replica.generation.chat_prompts import ChatPrompts
from tests.support.chat_peer import prompt_ids, save_chat_peer
from tests.support.engine import make_checkpoint_engine

FIRST = [{"role": "user", "content": "hello there"}]
SECOND = [*FIRST, {"role": "assistant", "content": "hi"}, {"role": "user", "content": "more"}]
OTHER = [{"role": "user", "content": "something else entirely"}]
GREEDY = SamplingParams(max_new_tokens=3)


@pytest.fixture(scope="module")
def peer(tmp_path_factory):
    path = tmp_path_factory.mktemp("chat-peer")
    _, tok = save_chat_peer(path, seed=3)
    return str(path), tok


def served(path: str, body):
    """``body(calls, engine, ends)`` on a replica's ``TurnCalls`` over the checkpoint at
    ``path``, its engine on its own thread (``ends``: session id -> the final event of its
    turn, filled as the engine produces them)."""
    engine = make_checkpoint_engine(path)
    ends: dict = {}

    def events(outputs) -> None:
        for out in outputs:
            ends.update((e.session_id, e) for e in out.events if e.finished)

    async def run():
        host = EngineHost(engine, events, lambda ids: None, lambda exc: None, None, lambda: None)
        prompts = ChatPrompts(path, engine.tokenizer)
        calls = TurnCalls(engine, host, engine.tokenizer, prompts, CallFaults(frozenset()))
        try:
            return await body(calls, engine, ends)
        finally:
            host.stop()

    return asyncio.run(run())


def mamba_held(snapshot) -> int:
    """The SSM state slots sessions hold: one per open session (a fork takes its own)."""
    return next(p.session_held for p in snapshot.pools if p.pool == "mamba")


async def until_ended(ends: dict, session_id: str):
    for _ in range(2000):
        if session_id in ends:
            return ends.pop(session_id)
        await asyncio.sleep(0.01)
    raise AssertionError(f"the turn of {session_id} did not end")


def test_a_chat_turn_is_rendered_in_its_submit_and_continues_the_state(peer):
    path, tok = peer
    first, second = prompt_ids(tok, FIRST), prompt_ids(tok, SECOND)

    async def body(calls: TurnCalls, engine, ends):
        await calls.host.call(engine.open_session, "fresh")
        await calls.host.call(engine.open_session, "held", 0.0, "", "", first)
        fresh, held = await calls.submit_turns(
            "gw", [("fresh", ChatInput(FIRST), None, GREEDY),
                   ("held", ChatInput(SECOND, first), None, GREEDY)]
        )  # fmt: skip
        assert fresh == RenderedTurn(ChatPrompt(first, 0), fresh.turn)
        assert type(fresh.turn) is int
        text = tok.decode(second, skip_special_tokens=False)
        rest = tok.encode(text[len(tok.decode(first, skip_special_tokens=False)) :],
                          add_special_tokens=False)  # fmt: skip
        assert held.prompt == ChatPrompt(rest, len(first)) and type(held.turn) is int
        assert (await until_ended(ends, "fresh")).committed_tokens == len(first) + 3
        assert (await until_ended(ends, "held")).committed_tokens == len(first) + len(rest) + 3
        assert (await calls.host.call(engine.snapshot)).consistent

    served(path, body)


def test_a_rendering_that_does_not_continue_the_state_does_nothing(peer):
    path, tok = peer
    first = prompt_ids(tok, FIRST)

    async def body(calls: TurnCalls, engine, ends):
        for sid in ("held", "previous", "plain"):
            await calls.host.call(engine.open_session, sid, 0.0, "", "", first)
        before = await calls.host.call(engine.snapshot)
        fork = ("child", 0.0, "previous")  # fork "held" into "child", releasing "previous"
        skipped, plain = await calls.submit_turns(
            "gw", [("held", ChatInput(OTHER, first), None, GREEDY, fork),
                   ("plain", None, [5, 6], GREEDY)]
        )  # fmt: skip
        assert skipped == RenderedTurn(ChatPrompt(prompt_ids(tok, OTHER), 0), None)
        assert type(plain) is int  # the batch's other turn went
        assert (await until_ended(ends, "plain")).committed_tokens == len(first) + 2 + 3
        sessions = engine.sessions.sessions
        assert {"held", "previous"} <= set(sessions) and "child" not in sessions
        assert "held" not in ends and engine.scheduler.find("held")[0] is None
        after = await calls.host.call(engine.snapshot)
        assert after.consistent  # no state taken or freed for "held" ("plain" grew its own)
        assert mamba_held(after) == mamba_held(before)
        # the same turn, continuing: forked and submitted, "previous" released first
        (forked,) = await calls.submit_turns(
            "gw", [("held", ChatInput(SECOND, first), None, GREEDY, fork)]
        )
        assert type(forked.turn) is ForkedTurn and forked.turn.replaced
        assert "child" in sessions and "previous" not in sessions
        await until_ended(ends, "held")
        assert (await calls.host.call(engine.snapshot)).consistent

    served(path, body)
