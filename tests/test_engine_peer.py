"""The engine against transformers' ``BambaForCausalLM``: a checkpoint saved by transformers,
loaded with ``replica.model.load_model`` and served by an ``Engine``, generates the same greedy
tokens as ``generate`` over the whole conversation, also across session turns."""

from __future__ import annotations

import pytest

from replica.api import FinishReason
from replica.config import PoolConfig
from tests.support.engine import (
    close_and_check,
    greedy,
    make_checkpoint_engine,
    run_turn,
    token_ids,
)
from tests.support.hf_peer import hf_greedy, tiny_hf_bamba


@pytest.fixture(scope="module")
def peer(tmp_path_factory):
    """A tiny random HF Bamba saved with ``save_pretrained``; returns (hf model, path)."""
    hf = tiny_hf_bamba(seed=7)
    path = tmp_path_factory.mktemp("bamba-peer")
    hf.save_pretrained(str(path))
    return hf, str(path)


@pytest.fixture(params=[1, 16], ids=["page1", "page16"])
def engine(request, peer):
    pools = PoolConfig(max_sessions=4, kv_tokens=1024, max_context=256, page_size=request.param)
    eng = make_checkpoint_engine(peer[1], pools, max_prefill_chunk=24)
    yield eng
    close_and_check(eng)


def test_greedy_matches_generate(peer, engine):
    hf, _ = peer
    prompt = token_ids(30, 1)
    engine.open_session("s")
    tokens, reason, committed = run_turn(engine, "s", prompt, greedy(20))
    assert tokens == hf_greedy(hf, prompt, 20)
    assert reason is FinishReason.LENGTH and committed == 50


def test_append_then_generate_matches_one_prompt(peer, engine):
    hf, _ = peer
    a, b = token_ids(37, 2), token_ids(9, 3)
    engine.open_session("s")
    assert run_turn(engine, "s", a, greedy(0)) == ([], FinishReason.LENGTH, 37)
    tokens, _, committed = run_turn(engine, "s", b, greedy(12))
    assert tokens == hf_greedy(hf, a + b, 12)
    assert committed == 37 + 9 + 12


def test_multi_turn_matches_whole_conversation(peer, engine):
    """Turn 2 continues after turn 1's output (its last token folded first, as pending)."""
    hf, _ = peer
    a, b, c = token_ids(21, 4), token_ids(13, 5), token_ids(5, 6)
    engine.open_session("s")
    o1, _, committed = run_turn(engine, "s", a, greedy(10))
    assert o1 == hf_greedy(hf, a, 10) and committed == 31
    o2, _, committed = run_turn(engine, "s", b, greedy(8))
    assert o2 == hf_greedy(hf, a + o1 + b, 8) and committed == 31 + 13 + 8
    o3, _, _ = run_turn(engine, "s", c, greedy(6))
    assert o3 == hf_greedy(hf, a + o1 + b + o2 + c, 6)
