"""The measurements of ``bench.park_restore`` (see its docstring), each on its own pools or
engine: park/restore throughput against a plain copy, time to first token of a parked session
against re-prefilling, decode with sessions parked, sessions held at a fixed GPU budget."""

from __future__ import annotations

import cProfile
import pstats
import statistics
import time

import torch

from bench.decode import sync
from bench.harness.inprocess_driver import build_engine
from bench.harness.stats import percentile
from replica.api import PoolExhaustedError, SamplingParams
from replica.config import PoolConfig, ReplicaConfig
from replica.engine.engine import Engine
from replica.model import ByteTokenizer, HybridModel, init_weights
from replica.model.config import ModelConfig
from replica.pools.hybrid_pool import HybridReqToTokenPool
from replica.sessions.parking import Parker
from replica.sessions.request import Req
from replica.sessions.table import SessionTable

REAL_STATE = ModelConfig(
    vocab_size=512,
    hidden_size=1024,
    intermediate_size=2048,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=8,
    attn_layer_indices=(3,),
    mamba_n_heads=128,
    mamba_d_head=64,
    mamba_d_state=128,
    mamba_expand=8,
    mamba_chunk_size=256,
)
BATCH, HISTORY = 8, 2048
GPU_SESSIONS, PARKED_SESSIONS, HELD_HISTORY = 8, 88, 64


# ----- 1. park and restore throughput ---------------------------------------------------------


def session_layer(pools: PoolConfig) -> SessionTable:
    pool = HybridReqToTokenPool(REAL_STATE, pools)
    return SessionTable(pool, parker=Parker.build(pool, REAL_STATE, pools))


def with_history(sessions: SessionTable, sid: str, length: int, seed: int) -> None:
    """Open ``sid`` and give it ``length`` committed tokens of random state (no model)."""
    sessions.open(sid)
    slot = sessions.get(sid)
    if not sessions.residency.room_for_turn(slot, length):
        raise PoolExhaustedError(f"no room for a {length}-token history")
    req = Req(sid, [1] * length)
    sessions.restore_to_req(req)
    pool, gen = sessions.pool, torch.Generator().manual_seed(seed)
    pool.kv_pool.extend(pool.req_to_token, req.seq.req_pool_idx, 0, length)
    req.kv_len = req.folded_len = length
    if seed >= 0:
        for t in (pool.mamba_pool.conv_all, pool.mamba_pool.ssm_all):
            t[:, req.seq.mamba_pool_idx] = torch.randn(t[:, 0].shape, generator=gen).to(t)
        rows = pool.req_to_token[req.seq.req_pool_idx, :length].long()
        for t in (pool.kv_pool.k_all, pool.kv_pool.v_all):
            t[:, rows] = torch.randn(t[:, rows].shape, generator=gen).to(t)
    sessions.save_from_req(req)


def copy_throughput(device: str, rounds: int) -> dict[str, float]:
    """Bytes/s of parking and restoring BATCH sessions, and of a plain copy of as many bytes."""
    pools = PoolConfig(
        max_sessions=BATCH,
        kv_tokens=BATCH * HISTORY,
        max_context=HISTORY,
        max_parked_sessions=BATCH,
        host_kv_tokens=BATCH * HISTORY,
        device=device,
    )
    sessions = session_layer(pools)
    for i in range(BATCH):
        with_history(sessions, f"s{i}", HISTORY, seed=i)
    parker, slots = sessions.residency.parker, list(sessions.sessions.values())
    before = parker.bytes_moved
    sessions.residency.park(slots)
    nbytes = parker.bytes_moved - before
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty(nbytes, dtype=torch.uint8, pin_memory=device.startswith("cuda"))
    times: dict[str, list[float]] = {"restore": [], "park": [], "plain": []}
    for _ in range(rounds):
        for name, op in (
            ("restore", lambda: sessions.residency.unpark(slots)),
            ("plain", lambda: dst.copy_(src)),
            ("park", lambda: sessions.residency.park(slots)),
            ("plain", lambda: dst.copy_(src)),
        ):
            start = time.perf_counter()
            op()
            sync(device)
            times[name].append(time.perf_counter() - start)
    return {name: nbytes / statistics.median(t) for name, t in times.items()} | {"bytes": nbytes}


# ----- 2. time to first token: restore vs re-prefill ------------------------------------------


def real_state_engine(device: str, longest: int, threads: int) -> Engine:
    model = HybridModel(REAL_STATE)
    init_weights(model, seed=0)
    model.eval().to(device)
    pools = PoolConfig(
        max_sessions=2,
        kv_tokens=longest + 1024,
        max_context=longest + 64,
        max_parked_sessions=2,
        host_kv_tokens=longest + 1024,
        device=device,
    )
    config = ReplicaConfig(
        pools=pools, max_prefill_chunk=2048, max_batch_tokens=2048, threads=threads
    )
    if threads:
        torch.set_num_threads(threads)
    return Engine(config, model, ByteTokenizer(REAL_STATE.vocab_size))


def first_token_s(engine: Engine, sid: str, ids: list[int], device: str) -> float:
    """Seconds from submitting a one-new-token turn to its token (the turn then ends)."""
    start = time.perf_counter()
    req = engine.submit(sid, ids, SamplingParams(max_new_tokens=1))
    while True:
        events = engine.step()
        sync(device)
        if any(e.turn_id == req.rid and e.token_ids for e in events):
            return time.perf_counter() - start


def ttft_pair(engine: Engine, history: int, device: str, seed: int) -> tuple[float, float]:
    """(re-prefill, restore) time to first token for a session with ``history`` tokens."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, REAL_STATE.vocab_size, (history,), generator=gen).tolist()
    sid = f"h{history}-{seed}"
    engine.open_session(sid)
    prefill = first_token_s(engine, sid, ids, device)  # folds the history, then a token
    engine.sessions.residency.park([engine.sessions.get(sid)])
    restore = first_token_s(engine, sid, [7], device)  # restores it, then one token
    engine.close_session(sid)
    return prefill, restore


# ----- 3. decode with sessions parked ---------------------------------------------------------


def decode_engine(device: str, most_parked: int, threads: int) -> Engine:
    pools = PoolConfig(
        max_sessions=8,
        kv_tokens=8 * 1024,
        max_context=1024,
        mamba_track_buffers=1,
        max_parked_sessions=most_parked,
        host_kv_tokens=most_parked * 16,
    )
    config = ReplicaConfig(
        pools=pools, max_prefill_chunk=512, max_batch_tokens=8192, threads=threads
    )
    return build_engine(config, device)


def decode_steps(engine: Engine, sessions: int, new: int, device: str) -> tuple[float, float]:
    """``sessions`` sessions decode ``new`` tokens together: (tokens per second of the decode-only
    step at the 10th percentile of step times, Python function calls per decode-only step). A
    low percentile, not the total, so that other processes' bursts on a shared machine do not
    pass for the cost of a step; the calls count the engine's own work, whatever else the
    machine does."""
    sids = [f"active-{i}" for i in range(sessions)]
    for i, sid in enumerate(sids):
        engine.open_session(sid)
        engine.submit(sid, [(7 * i + j) % 250 + 1 for j in range(16)], SamplingParams(new))
    steps, calls, profile = [], 0, cProfile.Profile()
    while engine.has_work:
        decode_only = not engine.scheduler.waiting and not engine.scheduler.plan().prefill
        start = time.perf_counter()
        if decode_only and len(steps) == 1 and not calls:  # one step profiled: its calls
            profile.runcall(engine.step)
            calls = pstats.Stats(profile).total_calls
            continue
        events = engine.step()
        sync(device)
        if decode_only:
            steps.append((time.perf_counter() - start, events.token_count))
    for sid in sids:
        engine.close_session(sid)
    full = [seconds for seconds, tokens in steps if tokens == sessions]
    return sessions / percentile(full, 10), float(calls)


def decode_with_parked(
    engine: Engine, parked: int, new: int, rounds: int, device: str
) -> tuple[float, float]:
    """Decode of 8 active sessions while ``parked`` idle sessions (each with a short history)
    sit in host memory: (median over ``rounds`` runs of the tokens/s of a fast step, Python calls
    per decode step)."""
    idle = [f"p{parked}-{i}" for i in range(parked)]
    for sid in idle:
        engine.open_session(sid)
        engine.submit(sid, [3, 1, 4, 1], SamplingParams(max_new_tokens=0))
        while engine.has_work:
            engine.step()
    runs = []
    for _ in range(rounds):
        runs.append(decode_steps(engine, 8, new, device))
        assert len(engine.sessions.parked) == parked, (len(engine.sessions.parked), parked)
    for sid in idle:
        engine.close_session(sid)
    return statistics.median(r[0] for r in runs), runs[0][1]


# ----- 4. sessions held at a fixed GPU budget --------------------------------------------------


def sessions_held(parked: int) -> tuple[int, int, int]:
    """(sessions held, GPU state bytes, host state bytes) of one replica with 8 GPU sessions
    and ``parked`` in host memory, each session with a HELD_HISTORY-token history."""
    pools = PoolConfig(
        max_sessions=GPU_SESSIONS,
        kv_tokens=GPU_SESSIONS * 2048,
        max_context=2048,
        max_parked_sessions=parked,
        host_kv_tokens=parked * HELD_HISTORY,
    )
    sessions = session_layer(pools)
    held = 0
    while True:
        try:
            with_history(sessions, f"s{held}", HELD_HISTORY, seed=-1)
        except PoolExhaustedError:
            break
        held += 1
    pool = sessions.pool
    gpu = sum(t.nbytes for t in (pool.mamba_pool.conv_all, pool.mamba_pool.ssm_all))
    gpu += pool.kv_pool.k_all.nbytes + pool.kv_pool.v_all.nbytes
    host = 0
    if sessions.residency.parker:
        h = sessions.residency.parker.host
        host = sum(t.nbytes for t in (h.mamba.conv_all, h.mamba.ssm_all, h.kv.k_all, h.kv.v_all))
    return held, gpu, host
