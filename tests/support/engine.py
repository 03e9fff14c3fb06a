"""Shared engine test helpers: build a strict ``Engine`` and drive turns to their end."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from functools import lru_cache

import torch

from replica.api import FinishReason, SamplingParams, TurnEvent
from replica.config import PoolConfig, ReplicaConfig
from replica.engine.engine import Engine
from replica.generation import GenerationDefaults
from replica.model import HybridModel, Tokenizer, build_tiny_bamba, load_model
from replica.model.config import ModelConfig
from tests.support.device import device_under_test, on_test_device
from tests.support.pools import read_state

MAX_STEPS = 100_000

# The engine tests run a tiny model: each op is microseconds of work, and a second intra-op thread
# only adds synchronisation, which costs milliseconds per op when the box is busy (measured: the
# churn test ran 6x slower with 2 threads on a loaded 2-core machine).
torch.set_num_threads(1)


@lru_cache(maxsize=1)
def tiny_bamba() -> tuple[ModelConfig, HybridModel, Tokenizer]:
    """The built-in tiny-bamba (fixed-seed weights), built once per test process."""
    return build_tiny_bamba(seed=0)


def make_engine(
    pools: PoolConfig | None = None,
    model: tuple[ModelConfig, HybridModel, Tokenizer] | None = None,
    clock: Callable[[], float] = time.monotonic,
    generation: GenerationDefaults | None = None,
    **replica_kwargs,
) -> Engine:
    """An engine over tiny-bamba (or ``model``) with the given pool sizes, on ``clock``, on the
    test device (``SESSION_ROUTER_TEST_DEVICE``), with the generation defaults ``generation``
    (none: the built-in ones); strict unless ``strict=False`` is given."""
    cfg, net, tok = model or tiny_bamba()
    pools = pools or PoolConfig(max_sessions=8, kv_tokens=4096, max_context=1024)
    pools = dataclasses.replace(pools, device=device_under_test())
    config = ReplicaConfig(pools=pools, **{"strict": True, **replica_kwargs})
    return Engine(config, on_test_device(net), tok, clock=clock, generation=generation)


def make_checkpoint_engine(path: str, pools: PoolConfig | None = None, **replica_kwargs) -> Engine:
    """A strict engine over the HF-format checkpoint at ``path``, with its generation defaults
    (as a replica serving it has)."""
    generation = GenerationDefaults.from_checkpoint(path)
    return make_engine(pools, load_model(path), generation=generation, **replica_kwargs)


def greedy(max_new_tokens: int, stop: Sequence[int] = ()) -> SamplingParams:
    return SamplingParams(max_new_tokens=max_new_tokens, stop_token_ids=tuple(stop))


def drain(engine: Engine, max_steps: int = MAX_STEPS) -> list[TurnEvent]:
    """Step until the engine has no work; every event produced on the way."""
    events = engine.take_events()
    for _ in range(max_steps):
        if not engine.has_work:
            return events + engine.take_events()
        events += engine.step()
    raise AssertionError(f"engine still busy after {max_steps} steps")


def run_turn(
    engine: Engine,
    session_id: str,
    ids: Sequence[int],
    sampling: SamplingParams | None = None,
    max_steps: int = MAX_STEPS,
) -> tuple[list[int], FinishReason | None, int]:
    """Submit one turn and step until its final event.

    Returns the tokens it streamed, its finish reason (``None`` when it ended with an error, which
    is raised as ``AssertionError``) and the session's ``committed_tokens`` after it.
    """
    req = engine.submit(session_id, ids, sampling)
    tokens: list[int] = []
    for _ in range(max_steps):
        for event in engine.step():
            if event.turn_id != req.rid:
                continue
            tokens += event.token_ids
            if event.error_code is not None:
                raise AssertionError(f"turn failed: {event.error_code}: {event.error}")
            if event.finished:
                return tokens, event.finish_reason, event.committed_tokens
    raise AssertionError(f"turn {req.rid} did not finish in {max_steps} steps")


def run_batch(
    engine: Engine, turns: dict[str, tuple[list[int], SamplingParams]]
) -> dict[str, list[int]]:
    """Submit one turn per session at once and step them together; tokens per session."""
    rids = {engine.submit(sid, ids, sp).rid: sid for sid, (ids, sp) in turns.items()}
    out: dict[str, list[int]] = {sid: [] for sid in turns}
    for event in drain(engine):
        assert event.error_code is None, event
        out[rids[event.turn_id]] += event.token_ids
    return out


def assert_engine_at_capacity(engine: Engine) -> None:
    """Strict invariant (leaked == 0, allocator integrity) and every pool at capacity: what is
    not free is cached states only, and once they are evicted every pool is free."""
    snap = engine.check_invariant()
    assert snap.leaked == 0
    for stats in snap.pools:
        assert stats.free + stats.cached == stats.capacity, stats.describe()
    engine.sessions.cache.clear()
    for stats in engine.check_invariant().pools:
        assert stats.free == stats.capacity, stats.describe()


def close_and_check(engine: Engine) -> None:
    """End of a test: close every session, drain, and check that every slot came back."""
    engine.session_ops.close_all()
    drain(engine)
    assert len(engine.sessions) == 0
    assert_engine_at_capacity(engine)


def session_state(engine: Engine, session_id: str) -> dict[str, object]:
    """An idle session's state, copied from wherever it lives (GPU slots or, parked, the host
    tier): mamba conv/SSM state of every layer, the K/V of its committed positions in every
    attention layer, its committed length and pending tokens."""
    slot = engine.sessions.get(session_id)
    return {
        "committed_len": slot.committed_len,
        "pending_ids": slot.pending_ids,
        **read_state(engine.sessions, session_id),
    }


def assert_same_state(got: dict[str, object], want: dict[str, object], exact: bool = False) -> None:
    """Equal layout, and equal tensors (bitwise when ``exact``, else up to float rounding)."""
    assert got["committed_len"] == want["committed_len"]
    assert got["pending_ids"] == want["pending_ids"]
    for name in ("conv", "ssm", "k", "v"):
        if exact:
            assert torch.equal(got[name], want[name]), name
        else:
            torch.testing.assert_close(got[name], want[name], atol=1e-5, rtol=1e-4, msg=name)


def token_ids(n: int, seed: int, vocab: int = 384) -> list[int]:
    """``n`` reproducible random token ids."""
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()
