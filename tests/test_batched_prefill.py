"""Batched prefill: B chunks in one forward equal B forwards of one chunk each.

Model level: ``forward_extend_batch`` against ``forward_extend`` one sequence at a time, for chunk
lengths 1..70 (several SSD chunks with chunk size 16 and 64), fresh and continuing sequences, and
garbage left in reused slots. Engine level: the same greedy tokens and session states as the
one-forward-per-chunk path, failures rolled back per turn, every pool back at capacity.
"""

from __future__ import annotations

import pytest
import torch

from replica.config import PoolConfig
from replica.model import HybridModel, LayerBuffers, build_tiny_bamba
from replica.model.config import ModelConfig
from replica.model.factory import init_weights
from tests.support.engine import (
    assert_same_state,
    close_and_check,
    drain,
    greedy,
    make_engine,
    session_state,
    tiny_bamba,
    token_ids,
)

KV_SLOTS = 1024


def _small_chunk_model():
    """Chunk size 16, two B/C groups and a dt floor (padding must stay inert despite the clamp)."""
    cfg = ModelConfig(mamba_chunk_size=16, mamba_n_groups=2, time_step_limit=(1e-3, 0.05))
    model = HybridModel(cfg)
    init_weights(model, seed=3)
    return cfg, model.eval()


MODELS = {"tiny-bamba": lambda: build_tiny_bamba(seed=0)[:2], "chunk16": _small_chunk_model}


def _clone(buffers: LayerBuffers) -> LayerBuffers:
    return LayerBuffers(*([t.clone() for t in ts] for ts in buffers))


def _assert_buffers_close(got: LayerBuffers, want: LayerBuffers) -> None:
    for name, gs, ws in zip(("conv", "ssm", "k", "v"), got, want, strict=True):
        for i, (g, w) in enumerate(zip(gs, ws, strict=True)):
            torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-4, msg=f"{name}[{i}]")


def _check_batch(cfg, model, lengths: list[int], starts: list[int], seed: int) -> None:
    """Run the chunks batched and one by one from the same state; logits and buffers agree."""
    gen = torch.Generator().manual_seed(seed)
    n = len(lengths)
    buffers = LayerBuffers.allocate(cfg, mamba_slots=2 * n + 1, kv_token_slots=KV_SLOTS)
    for ts in buffers:  # stale garbage everywhere, including the slots of fresh sequences
        for t in ts:
            t.copy_(torch.randn(t.shape, generator=gen))
    perm = torch.randperm(KV_SLOTS, generator=gen)
    kv, used = [], 0
    for s, length in zip(starts, lengths, strict=True):
        kv.append(perm[used : used + s + length])
        used += s + length
    mamba = torch.randperm(2 * n + 1, generator=gen)[:n]
    ids = [
        torch.randint(0, cfg.vocab_size, (s + length,), generator=gen)
        for s, length in zip(starts, lengths, strict=True)
    ]
    for b, s in enumerate(starts):  # the history of continuing sequences
        if s:
            model.forward_extend(ids[b][:s], 0, int(mamba[b]), kv[b][:s], buffers)
    alone_buf = _clone(buffers)
    alone = torch.cat(
        [
            model.forward_extend(ids[b][s:], s, int(mamba[b]), kv[b], alone_buf)
            for b, s in enumerate(starts)
        ]
    )
    got = model.forward_extend_batch(
        [ids[b][s:] for b, s in enumerate(starts)], starts, mamba, kv, buffers
    )
    assert got.shape == (n, cfg.vocab_size)
    torch.testing.assert_close(got, alone, atol=1e-5, rtol=0)
    _assert_buffers_close(buffers, alone_buf)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_batched_extend_matches_one_by_one(name):
    cfg, model = MODELS[name]()
    # lengths across SSD chunk boundaries (16, 64), shorter than the conv window, and 1..70
    _check_batch(cfg, model, [1, 70, 64, 65, 16, 17, 2, 3], [0, 0, 5, 0, 40, 1, 0, 3], seed=0)
    for seed in range(1, 7):
        gen = torch.Generator().manual_seed(seed)
        n = int(torch.randint(1, 7, (1,), generator=gen))
        lengths = torch.randint(1, 71, (n,), generator=gen).tolist()
        starts = [
            0 if torch.rand(1, generator=gen) < 0.4 else int(s)
            for s in torch.randint(1, 90, (n,), generator=gen)
        ]
        _check_batch(cfg, model, lengths, starts, seed)


def test_batched_extend_rejects_bad_input():
    cfg, model = MODELS["tiny-bamba"]()
    buffers = LayerBuffers.allocate(cfg, mamba_slots=4, kv_token_slots=64)
    one = torch.tensor([1, 2, 3])
    with pytest.raises(ValueError, match="kv_slots"):
        model.forward_extend_batch([one], [0], torch.tensor([0]), [torch.arange(4)], buffers)
    with pytest.raises(ValueError, match="at least one token"):
        model.forward_extend_batch(
            [one, one[:0]],
            [0, 0],
            torch.tensor([0, 1]),
            [torch.arange(3), torch.arange(0)],
            buffers,
        )
    with pytest.raises(ValueError):
        model.forward_extend_batch([], [], torch.tensor([], dtype=torch.long), [], buffers)


def _run_sessions(sids: list[int], turns: int = 3):
    """Sessions ``sids`` on one engine, several turns each of different lengths, small prefill
    chunks so that one step prefills fresh and continuing turns together; returns the tokens of
    each (turn, session) and each session's final state."""
    pools = PoolConfig(max_sessions=6, kv_tokens=4096, max_context=1024, page_size=16)
    engine = make_engine(pools, max_prefill_chunk=24, max_batch_tokens=96)
    for i in sids:
        engine.open_session(f"s{i}")
    tokens: dict[tuple[int, int], list[int]] = {}
    for turn in range(turns):
        reqs = {}
        for i in sids:
            ids = token_ids(1 + (13 * i + 29 * turn) % 70, seed=100 * turn + i)
            reqs[i] = engine.submit(f"s{i}", ids, greedy(4 + i % 3 if i != 4 else 0))
        events = drain(engine)
        assert not [e for e in events if e.error_code]
        for i, req in reqs.items():
            tokens[(turn, i)] = [t for e in events if e.turn_id == req.rid for t in e.token_ids]
    states = {i: session_state(engine, f"s{i}") for i in sids}
    close_and_check(engine)
    return tokens, states


def test_engine_batched_prefill_matches_each_session_alone():
    want_tokens, want_states = {}, {}
    for i in range(6):
        tokens, states = _run_sessions([i])
        want_tokens.update(tokens)
        want_states.update(states)
    got_tokens, got_states = _run_sessions(list(range(6)))
    assert got_tokens == want_tokens
    assert any(len(t) > 0 for t in got_tokens.values())
    for i, want in want_states.items():
        assert_same_state(got_states[i], want)


def test_engine_batched_prefill_failure_rolls_back_each_turn(monkeypatch):
    engine = make_engine(max_prefill_chunk=16)
    for sid in ("a", "b", "c"):
        engine.open_session(sid)
    engine.submit("a", token_ids(5, 1), greedy(2))
    assert not [e for e in drain(engine) if e.error_code]
    before = session_state(engine, "a")
    net = tiny_bamba()[1]

    def boom(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(net, "forward_extend_batch", boom)
    reqs = [engine.submit(sid, token_ids(20, i), greedy(3)) for i, sid in enumerate("abc")]
    events = drain(engine)
    errors = {e.turn_id: e.error_code for e in events if e.error_code}
    assert errors == {req.rid: "INTERNAL" for req in reqs}
    assert_same_state(session_state(engine, "a"), before, exact=True)
    monkeypatch.undo()
    # the sessions still work, and everything comes back on close
    reqs = [engine.submit(sid, token_ids(20, i), greedy(3)) for i, sid in enumerate("abc")]
    events = drain(engine)
    assert not [e for e in events if e.error_code]
    assert all(sum(len(e.token_ids) for e in events if e.turn_id == r.rid) == 3 for r in reqs)
    close_and_check(engine)
