"""Parking is bit-exact: a parked session's host copy and its restored state equal its state
before parking, tensor for tensor, and its greedy continuation equals that of a session never
parked and transformers' ``BambaForCausalLM`` over the whole conversation (the peer checkpoint).
"""

from __future__ import annotations

import pytest

from replica.config import PoolConfig
from tests.support.engine import (
    assert_same_state,
    close_and_check,
    greedy,
    make_checkpoint_engine,
    run_turn,
    session_state,
    token_ids,
)
from tests.support.hf_peer import hf_greedy, tiny_hf_bamba


@pytest.fixture(scope="module")
def peer(tmp_path_factory):
    """A tiny random HF Bamba and the checkpoint it saved: (hf model, path)."""
    hf = tiny_hf_bamba(seed=11)
    path = tmp_path_factory.mktemp("bamba-parking-peer")
    hf.save_pretrained(str(path))
    return hf, str(path)


def engines(path: str, page_size: int):
    """An engine that parks (2 GPU sessions, 4 in host memory) and one that never does."""
    common = dict(max_sessions=2, kv_tokens=1024, max_context=256, page_size=page_size)
    parking = make_checkpoint_engine(path, PoolConfig(**common, max_parked_sessions=4))
    plain = make_checkpoint_engine(path, PoolConfig(**common))
    return parking, plain


@pytest.mark.parametrize("page_size", [1, 16])
def test_parked_and_restored_state_is_bit_identical_and_continues_like_never_parked(
    peer, page_size
):
    hf, path = peer
    parking, plain = engines(path, page_size)
    a, b, c = token_ids(29, 1), token_ids(11, 2), token_ids(6, 3)
    outputs = {}
    for engine in (parking, plain):
        engine.open_session("s")
        outputs[engine] = run_turn(engine, "s", a, greedy(9))[0]
    o1 = outputs[parking]
    assert o1 == outputs[plain] == hf_greedy(hf, a, 9)

    before = session_state(parking, "s")
    for i in range(2):  # two more sessions, with turns: "s" is the least recently used
        parking.open_session(f"other{i}")
        run_turn(parking, f"other{i}", token_ids(14, 10 + i), greedy(3))
    slot = parking.sessions.get("s")
    assert slot.parked and parking.session_info("s").parked
    assert_same_state(session_state(parking, "s"), before, exact=True)  # the host copy

    # restore alone (parking another to make room), then compare the GPU state
    assert parking.sessions.residency.room_for_turn(slot, slot.committed_len)
    assert not slot.parked
    assert_same_state(session_state(parking, "s"), before, exact=True)
    parking.sessions.residency.park([slot])  # and park again: the next turn restores it

    o2 = {e: run_turn(e, "s", b, greedy(8))[0] for e in (parking, plain)}
    assert o2[parking] == o2[plain] == hf_greedy(hf, a + o1 + b, 8)
    assert_same_state(session_state(parking, "s"), session_state(plain, "s"), exact=True)

    parking.sessions.residency.park([parking.sessions.get("s")])
    o3 = {e: run_turn(e, "s", c, greedy(5))[0] for e in (parking, plain)}
    assert o3[parking] == o3[plain] == hf_greedy(hf, a + o1 + b + o2[plain] + c, 5)
    snap = parking.snapshot()
    assert snap.parking.parks_total >= 3 and snap.parking.restores_total >= 2
    for engine in (parking, plain):
        close_and_check(engine)
