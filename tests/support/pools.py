"""Shared test helpers: build a replica's pools and check the accounting invariant."""

from __future__ import annotations

from collections.abc import Iterable

from replica.accounting import InvariantChecker, count_pools
from replica.api import PoolSnapshot
from replica.config import PoolConfig
from replica.model import tiny_config
from replica.model.config import ModelConfig
from replica.pools.hybrid_pool import HybridReqToTokenPool
from replica.sessions.request import Req
from replica.sessions.session import StreamingSession

TINY_MODEL = ModelConfig()
# The two shapes of recurrent state the mamba pool holds: Mamba2's conv + SSM state (tiny-bamba)
# and the gated DeltaNet's conv + recurrent matrix (tiny-qwen3-next).
STATE_MODELS = {"mamba2": TINY_MODEL, "deltanet": tiny_config("tiny-qwen3-next")}


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_pools(
    max_sessions: int = 4,
    kv_tokens: int = 512,
    page_size: int = 1,
    track: int = 1,
    max_context: int = 256,
    idle_timeout_s: float = 60.0,
    model: ModelConfig = TINY_MODEL,
):
    cfg = PoolConfig(
        max_sessions=max_sessions,
        kv_tokens=kv_tokens,
        page_size=page_size,
        mamba_track_buffers=track,
        max_context=max_context,
    )
    pool = HybridReqToTokenPool(model, cfg)
    clock = FakeClock()
    sessions = StreamingSession(pool, idle_timeout_s=idle_timeout_s, clock=clock)
    return pool, sessions, clock


def snapshot(
    pool: HybridReqToTokenPool, sessions: StreamingSession, running: Iterable[Req] = ()
) -> PoolSnapshot:
    running = list(running)
    return PoolSnapshot(
        "test", "0", count_pools(pool, sessions, running), len(sessions), len(running), 0, 0.0
    )


def assert_consistent(
    pool: HybridReqToTokenPool, sessions: StreamingSession, running: Iterable[Req] = ()
) -> PoolSnapshot:
    """Strict invariant check plus the allocators' own integrity check."""
    snap = snapshot(pool, sessions, running)
    InvariantChecker(strict=True).check(snap)
    pool.check_integrity()
    return snap


def assert_all_free(pool: HybridReqToTokenPool, sessions: StreamingSession) -> None:
    snap = assert_consistent(pool, sessions)
    for stats in snap.pools:
        assert stats.free == stats.capacity, stats.describe()


def grow(pool: HybridReqToTokenPool, req: Req, new_tokens: int) -> None:
    """Fold ``new_tokens`` more tokens into a running request (KV reserved as it grows)."""
    target = req.folded_len + new_tokens
    if target > req.kv_len:
        pool.kv_pool.extend(pool.req_to_token, req.seq.req_pool_idx, req.kv_len, target)
        req.kv_len = target
    req.folded_len = target
