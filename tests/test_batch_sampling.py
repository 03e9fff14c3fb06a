"""The whole batch sampled in one call (``replica.engine.sampling.sample``): each row draws from
its own filtered distribution (checked against frequencies computed here in plain Python from
the definitions of temperature, top_k and top_p), independently of the other rows, and
reproducibly from its seed and token index. And the decode step's Python work: its function
calls do not grow by more than the one output record and detokenizer step per session."""

from __future__ import annotations

import cProfile
import math
import pstats

import pytest
import torch

from replica.api import SamplingParams
from replica.config import PoolConfig
from replica.engine.sampling import RowSampling, sample, seed_halves, uniforms
from tests.support.engine import close_and_check, make_engine, run_turn, token_ids

LOGITS = [2.0, 1.5, 0.3, -0.2, 1.1, -1.0]


def row_params(n: int, temperature: float, top_p: float, top_k: int, seed: int) -> RowSampling:
    greedy = temperature == 0.0
    return RowSampling(
        greedy=torch.full((n,), greedy),
        temperature=torch.full((n,), 1.0 if greedy else temperature),
        top_p=torch.full((n,), top_p),
        top_k=torch.full((n,), top_k, dtype=torch.long),
        seeds=torch.tensor([seed_halves(seed)] * n),
        all_greedy=greedy,
        filtered=not greedy and (top_k > 0 or 0.0 < top_p < 1.0),
    )


def expected(logits: list[float], temperature: float, top_p: float, top_k: int) -> list[float]:
    """The filtered distribution by its definition: softmax at the temperature, the k most likely
    kept and renormalised, then the smallest most-likely set whose mass reaches top_p."""
    weights = [math.exp(x / temperature) for x in logits]
    probs = [w / sum(weights) for w in weights]
    order = sorted(range(len(probs)), key=lambda i: -probs[i])
    keep = order[:top_k] if top_k else order
    mass = sum(probs[i] for i in keep)
    kept, reached = [], 0.0
    for i in keep:
        if top_p < 1.0 and reached >= top_p:
            break
        kept.append(i)
        reached += probs[i] / mass
    total = sum(probs[i] for i in kept)
    return [probs[i] / total if i in kept else 0.0 for i in range(len(probs))]


@pytest.mark.parametrize(
    "temperature,top_p,top_k", [(1.0, 1.0, 0), (0.7, 1.0, 3), (1.3, 0.8, 0), (0.9, 0.75, 4)]
)
def test_frequencies_follow_the_filtered_distribution(temperature, top_p, top_k):
    n = 40_000  # one row per token index of one turn: every draw of a long turn at once
    logits = torch.tensor([LOGITS] * n)
    tokens, good = sample(logits, row_params(n, temperature, top_p, top_k, 5), torch.arange(n))
    assert bool(good.all())
    counts = torch.bincount(tokens, minlength=len(LOGITS)).tolist()
    want = expected(LOGITS, temperature, top_p, top_k)
    for got, p in zip(counts, want):
        if p == 0.0:
            assert got == 0  # filtered out: never drawn
        else:  # within 5 standard deviations of the binomial count
            assert abs(got - n * p) <= 5 * math.sqrt(n * p * (1 - p)) + 1


def test_a_row_does_not_depend_on_the_rest_of_the_batch():
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(5, 300, generator=gen)
    counters = torch.tensor([0, 7, 3, 11, 2])
    params = [(1.0, 0.9, 0, 42), (0.0, 1.0, 0, 0), (0.8, 1.0, 20, 7), (1.5, 0.5, 5, 2**64 - 1)]
    params.append((1.0, 1.0, 0, 9))
    rows = [row_params(1, *p) for p in params]
    batch = RowSampling(
        *(torch.cat([getattr(r, f) for r in rows]) for f in RowSampling._fields[:5]),
        all_greedy=False,
        filtered=True,
    )
    together, _ = sample(logits, batch, counters)
    for b, row in enumerate(rows):
        alone, _ = sample(logits[b : b + 1], row, counters[b : b + 1])
        assert int(alone[0]) == int(together[b])
    assert int(together[1]) == int(logits[1].argmax())  # the greedy row


def test_draws_are_a_function_of_seed_and_token_index():
    seeds = torch.tensor([seed_halves(s) for s in (0, 1, 2**32, 2**64 - 1)])
    counters = torch.tensor([0, 0, 0, 5])
    first, again = uniforms(seeds, counters), uniforms(seeds, counters)
    assert torch.equal(first, again)
    assert len(set(first.tolist())) == 4  # distinct seeds (low and high halves) draw apart
    many = uniforms(seeds[:1].expand(50_000, 2), torch.arange(50_000))
    assert 0.0 <= float(many.min()) and float(many.max()) < 1.0
    assert abs(float(many.mean()) - 0.5) < 0.01 and abs(float(many.var()) - 1 / 12) < 0.005


def step_calls(sessions: int, sampling: SamplingParams) -> int:
    """Function calls (cProfile's count) of the second decode-only step of ``sessions``."""
    engine = make_engine(PoolConfig(max_sessions=64, kv_tokens=64 * 64, max_context=64))
    for i in range(sessions):
        engine.open_session(f"s{i}")
        engine.submit(f"s{i}", [1 + (i + j) % 200 for j in range(8)], sampling)
    decode_steps, calls = 0, 0
    while engine.has_work:
        plan = engine.scheduler.plan()
        if not plan.prefill and len(plan.decode) == sessions:
            decode_steps += 1
            if decode_steps == 2:
                profile = cProfile.Profile()
                profile.runcall(engine.step)
                calls = pstats.Stats(profile).total_calls
                continue
        engine.step()
    close_and_check(engine)
    return calls


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_decode_step_calls_do_not_grow_with_the_batch(temperature):
    sampling = SamplingParams(8, temperature=temperature, top_p=0.9, top_k=20, seed=1)
    one, many = step_calls(1, sampling), step_calls(64, sampling)
    # one output record per step and the batch's text in one pass: no call per session (before
    # the batch state was kept, 26 to 38 per session; before the record, 8)
    assert one and many <= one * 1.10, (one, many)


def test_a_seeded_turn_is_the_same_while_the_batch_around_it_changes():
    """The decode batch's kept state (plan, index tensors, sampling rows) is rebuilt when turns
    join and end: a seeded turn's tokens are those it makes alone, whoever joins or leaves."""
    prompt = token_ids(12, 3)
    sampling = SamplingParams(24, temperature=1.0, top_p=0.9, top_k=40, seed=77)
    engine = make_engine(PoolConfig(max_sessions=8, kv_tokens=2048, max_context=128))
    engine.open_session("alone")
    alone = run_turn(engine, "alone", prompt, sampling)
    for sid in ("a", "short", "late", "later"):
        engine.open_session(sid)
    turn = engine.submit("a", prompt, sampling)
    engine.submit("short", token_ids(5, 4), SamplingParams(3, temperature=0.7, seed=1))
    tokens, joined, last = [], [], None
    while engine.has_work:
        for event in engine.step():
            if event.turn_id == turn.rid:
                tokens += event.token_ids
                last = event if event.finished else last
        if len(tokens) in (6, 11) and len(joined) < 2:  # join mid-turn, greedy and seeded
            sid = ("late", "later")[len(joined)]
            params = SamplingParams(30) if not joined else SamplingParams(4, 1.2, seed=5)
            joined.append(engine.submit(sid, token_ids(9, 5 + len(joined)), params))
    assert len(joined) == 2
    assert (tokens, last.finish_reason, last.committed_tokens) == alone
    close_and_check(engine)
