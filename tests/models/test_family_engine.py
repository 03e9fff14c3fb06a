"""Each family served by the engine from the checkpoint transformers saved: greedy tokens equal
transformers' ``generate`` across session turns for prefill chunks of 1, 7 and 64 tokens, and
with decode batches padded to fixed shapes (as CUDA graphs run them); a batch of sessions gives
each the tokens and state it gets alone; a cancelled turn rolls the session back to exactly the
state it had before."""

from __future__ import annotations

import pytest

from replica.api import FinishReason
from replica.config import PoolConfig
from replica.engine.engine import Engine
from replica.model import load_model
from tests.models.peers import FAMILIES, VOCAB, conversation
from tests.support.engine import (
    assert_same_state,
    close_and_check,
    drain,
    greedy,
    make_engine,
    run_turn,
    session_state,
    token_ids,
)

pytestmark = pytest.mark.parametrize("name", FAMILIES)


def _engine(path: str, chunk: int = 16, sessions: int = 4, pad: bool = False) -> Engine:
    pools = PoolConfig(max_sessions=sessions, kv_tokens=1024, max_context=256, page_size=16)
    return make_engine(pools, load_model(path), max_prefill_chunk=chunk, pad_decode=pad)


def _ids(n: int, seed: int) -> list[int]:
    return token_ids(n, seed, vocab=VOCAB)


def test_turns_match_generate_for_chunk_sizes(name, peer_checkpoint):
    a, o1, b, o2 = conversation(name)
    states = []
    for chunk in (1, 7, 64):
        engine = _engine(peer_checkpoint(name), chunk)
        engine.open_session("s")
        assert run_turn(engine, "s", a, greedy(10)) == (o1, FinishReason.LENGTH, 50)
        assert run_turn(engine, "s", b, greedy(8)) == (o2, FinishReason.LENGTH, 67)
        states.append(session_state(engine, "s"))
        close_and_check(engine)
    for other in states[1:]:
        assert_same_state(other, states[0])


def test_batch_gives_each_session_what_it_gets_alone(name, peer_checkpoint):
    engine = _engine(peer_checkpoint(name), sessions=6)
    prompts = {f"s{i}": _ids(3 + 11 * i, 100 + i) for i in range(6)}
    new = {sid: 4 + 2 * i for i, sid in enumerate(prompts)}
    alone, alone_state = {}, {}
    for sid, ids in prompts.items():
        engine.open_session(sid)
        alone[sid] = run_turn(engine, sid, ids, greedy(new[sid]))[0]
        alone_state[sid] = session_state(engine, sid)
        engine.close_session(sid)
    rids = {}
    for sid, ids in prompts.items():
        engine.open_session(sid)
        rids[engine.submit(sid, ids, greedy(new[sid])).rid] = sid
    batched = {sid: [] for sid in prompts}
    for event in drain(engine):
        assert event.error_code is None, event
        batched[rids[event.turn_id]] += event.token_ids
    assert batched == alone
    for sid in prompts:
        assert_same_state(session_state(engine, sid), alone_state[sid])
    close_and_check(engine)


@pytest.mark.parametrize("during", ["prefill", "decode"])
def test_cancelled_turn_restores_the_exact_state(name, during, peer_checkpoint):
    a, o1, b, o2 = conversation(name)
    engine = _engine(peer_checkpoint(name), chunk=8)
    for sid in ("ref", "x"):
        engine.open_session(sid)
        assert run_turn(engine, sid, a, greedy(10))[0] == o1
    req = engine.submit("x", _ids(30, 3), greedy(20))
    while (len(req.output_ids) < 4) if during == "decode" else (req.turn_folded < 16):
        engine.step()
    assert during == "decode" or not req.output_ids
    assert engine.cancel("x")
    drain(engine)
    assert_same_state(session_state(engine, "x"), session_state(engine, "ref"), exact=True)
    assert run_turn(engine, "x", b, greedy(8))[0] == o2
    close_and_check(engine)


def test_padded_decode_batches_match_generate(name, peer_checkpoint):
    """Decode batches padded to fixed shapes: the conversation's replies are transformers' while
    two more sessions decode beside it (3 rows run as 4, the KV read 64 columns wide), and its
    state is the unpadded engine's."""
    a, o1, b, o2 = conversation(name)
    states = []
    for pad in (False, True):
        engine = _engine(peer_checkpoint(name), pad=pad)
        assert engine.runner.shapes.pads == pad
        for sid in ("s", "x", "y"):
            engine.open_session(sid)
        for prompt, new, reply in ((a, 10, o1), (b, 8, o2)):
            for i, sid in enumerate("xy"):
                engine.submit(sid, _ids(5 + i, i), greedy(12))
            rid = engine.submit("s", prompt, greedy(new)).rid
            got = [t for e in drain(engine) if e.turn_id == rid for t in e.token_ids]
            assert got == reply
        states.append(session_state(engine, "s"))
        close_and_check(engine)
    assert_same_state(states[1], states[0])
