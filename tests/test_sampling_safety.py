"""Sampling never takes an engine down: a temperature too small to compute is greedy, and a turn
whose logits are not finite fails alone (INTERNAL), rolled back, while the turns batched with it
run on. Issue 8: ``temperature=1e-45`` passed validation, ``logits / T`` overflowed to NaN and
``torch.multinomial`` raised on the engine thread, which died."""

from __future__ import annotations

import copy

import pytest
import torch

from replica.api import FinishReason, SamplingParams, StatusCode
from replica.engine.sampling import RowSampling, sample
from tests.support.engine import close_and_check, drain, make_engine, run_turn, tiny_bamba

SMALLEST_FLOAT32 = 1.401298464324817e-45  # what temperature=1e-45 becomes on the wire (float)
POISON = 7  # a token id whose embedding the poisoned model makes NaN


def test_a_temperature_too_small_to_compute_is_greedy():
    engine = make_engine()
    engine.open_session("tiny-t")
    engine.open_session("greedy")
    tiny = SamplingParams(max_new_tokens=8, temperature=SMALLEST_FLOAT32, seed=3)
    assert tiny.greedy
    got = run_turn(engine, "tiny-t", [5, 6, 7], tiny)
    want = run_turn(engine, "greedy", [5, 6, 7], SamplingParams(max_new_tokens=8))
    assert got == want and got[1] == FinishReason.LENGTH
    close_and_check(engine)


def rows(temperature: list[float]) -> RowSampling:
    """Rows sampled at ``temperature`` each (not greedy), no top_k / top_p."""
    n = len(temperature)
    return RowSampling(
        greedy=torch.zeros(n, dtype=torch.bool),
        temperature=torch.tensor(temperature),
        top_p=torch.ones(n),
        top_k=torch.zeros(n, dtype=torch.long),
        seeds=torch.zeros(n, 2, dtype=torch.long),
        all_greedy=False,
        filtered=False,
    )


def test_sample_refuses_what_it_cannot_compute():
    logits = torch.tensor([[1.0, 2.0, 3.0], [1.0, 9.0, 3.0], [1.0, float("nan"), 3.0]])
    tokens, good = sample(logits, rows([1e-45, 1e-5, 1.0]), torch.zeros(3, dtype=torch.long))
    # 3 / 1e-45 overflows; at 1e-5 all the mass is on the largest logit; NaN logits are bad
    assert good.tolist() == [False, True, False]
    assert int(tokens[1]) == 1


@pytest.fixture(scope="module")
def poisoned():
    """tiny-bamba with the embedding of token ``POISON`` set to NaN: any turn that feeds it
    gets non-finite logits, the turns batched with it do not (sequences never mix)."""
    cfg, net, tok = tiny_bamba()
    net = copy.deepcopy(net)
    with torch.no_grad():
        net.embed_tokens.weight[POISON] = float("nan")
    return cfg, net, tok


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_non_finite_logits_fail_only_their_turn(poisoned, temperature):
    clean = make_engine()
    clean.open_session("ref")
    want = run_turn(clean, "ref", [1, 2, 3], SamplingParams(max_new_tokens=6, seed=1))

    engine = make_engine(model=poisoned)
    for sid in ("bad", "good"):
        engine.open_session(sid)
    bad = engine.submit("bad", [POISON, 1, 2], SamplingParams(4, temperature, seed=5))
    good = engine.submit("good", [1, 2, 3], SamplingParams(max_new_tokens=6, seed=1))
    events = drain(engine)  # one batch: both turns prefill in the same step
    (failure,) = [e for e in events if e.turn_id == bad.rid]
    assert failure.error_code == StatusCode.INTERNAL and "non-finite" in failure.error
    assert failure.committed_tokens == 0  # rolled back to its state before the turn
    tokens = [t for e in events if e.turn_id == good.rid for t in e.token_ids]
    (last,) = [e for e in events if e.turn_id == good.rid and e.finished]
    assert (tokens, last.finish_reason, last.committed_tokens) == want

    # the failed session is intact: its next turn runs as on a fresh session
    assert run_turn(engine, "bad", [1, 2, 3], SamplingParams(max_new_tokens=6, seed=1)) == want
    close_and_check(engine)
