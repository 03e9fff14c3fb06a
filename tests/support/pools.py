"""Shared test helpers: build a replica's pools and check the accounting invariant."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from replica.accounting import InvariantChecker, check_page_refs, count_pools
from replica.api import PoolSnapshot
from replica.config import PoolConfig
from replica.model import tiny_config
from replica.model.config import ModelConfig
from replica.pools.hybrid_pool import HybridReqToTokenPool
from replica.pools.kv_pool import pages_for
from replica.sessions.parking import Parker
from replica.sessions.request import Req
from replica.sessions.table import SessionTable
from tests.support.device import device_under_test

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
    max_parked: int = 0,
    host_kv_tokens: int = 0,
    failpoints: frozenset[str] = frozenset(),
    max_cached_states: int = 0,
):
    """GPU pools and sessions over them (with a host tier when ``max_parked``; caching states
    at turn boundaries only when ``max_cached_states``), on a fake clock, on the test device
    (``SESSION_ROUTER_TEST_DEVICE``)."""
    cfg = PoolConfig(
        max_sessions=max_sessions,
        kv_tokens=kv_tokens,
        page_size=page_size,
        mamba_track_buffers=track,
        max_context=max_context,
        max_parked_sessions=max_parked,
        host_kv_tokens=host_kv_tokens,
        max_cached_states=max_cached_states,
        device=device_under_test(),
    )
    pool = HybridReqToTokenPool(model, cfg)
    clock = FakeClock()
    parker = Parker.build(pool, model, cfg)
    sessions = SessionTable(
        pool, idle_timeout_s=idle_timeout_s, clock=clock, failpoints=failpoints, parker=parker
    )
    return pool, sessions, clock


def snapshot(
    pool: HybridReqToTokenPool, sessions: SessionTable, running: Iterable[Req] = ()
) -> PoolSnapshot:
    running = list(running)
    return PoolSnapshot(
        "test", "0", count_pools(pool, sessions, running), len(sessions), len(running), 0, 0.0
    )


def assert_consistent(
    pool: HybridReqToTokenPool, sessions: SessionTable, running: Iterable[Req] = ()
) -> PoolSnapshot:
    """Strict invariant check plus the allocators' own integrity check."""
    running = list(running)
    snap = snapshot(pool, sessions, running)
    InvariantChecker(strict=True).check(snap, check_page_refs(pool, sessions, running))
    pool.check_integrity()
    if sessions.residency.parker is not None:
        sessions.residency.parker.host.check_integrity()
    return snap


def assert_all_free(pool: HybridReqToTokenPool, sessions: SessionTable) -> None:
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


def read_state(sessions: SessionTable, session_id: str) -> dict[str, torch.Tensor]:
    """An idle session's state, copied to the CPU from wherever it lives (GPU or host tier): its
    live mamba state ``conv``/``ssm`` ``[layers, ...]`` and the ``k``/``v`` of its committed
    positions ``[attention layers, committed_len, heads, head_dim]``."""
    slot = sessions.get(session_id)
    assert slot.turn is None, f"session {session_id} has a turn running"
    n = slot.committed_len
    if slot.parked:
        host = sessions.residency.parker.host
        mamba, kv, idx = host.mamba, host.kv, slot.host.mamba_idx
        page = kv.page_size
        assert slot.host.kv_pages.numel() == pages_for(n, page)
        positions = torch.arange(n)
        token_slots = slot.host.kv_pages[positions // page] * page + positions % page
    else:
        pool = sessions.pool
        mamba, kv, idx = pool.mamba_pool, pool.kv_pool, slot.seq.mamba_pool_idx
        token_slots = pool.req_to_token[slot.req_pool_idx, :n].long()
    return {  # on the CPU, wherever the pools are (so tests compare them with CPU tensors)
        "conv": mamba.conv_all[:, idx].to("cpu", copy=True),
        "ssm": mamba.ssm_all[:, idx].to("cpu", copy=True),
        "k": kv.k_all[:, token_slots].to("cpu", copy=True),
        "v": kv.v_all[:, token_slots].to("cpu", copy=True),
    }
