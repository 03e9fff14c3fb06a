"""Pool operation throughput: session lifecycles and mamba alloc/free at several batch sizes.

Prints a table, and the ratio of slots/s freed and allocated in batches of 64 vs one at a time,
measured side by side in this run. Run: ``.venv/bin/python bench/pool_ops.py``.
"""

from __future__ import annotations

import argparse
import time

from replica.config import PoolConfig
from replica.model.config import ModelConfig
from replica.pools.hybrid_pool import HybridReqToTokenPool
from replica.sessions.request import Req
from replica.sessions.session import StreamingSession


def timed(fn, seconds: float) -> tuple[int, float]:
    n, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        fn()
        n += 1
    return n, elapsed


def session_cycles_per_s(page_size: int, track: int, seconds: float) -> float:
    pools = PoolConfig(
        max_sessions=64,
        kv_tokens=16384,
        page_size=page_size,
        mamba_track_buffers=track,
        max_context=1024,
    )
    pool = HybridReqToTokenPool(ModelConfig(), pools)
    sessions = StreamingSession(pool)
    counter = iter(range(10**9))

    def cycle() -> None:
        sid = f"s{next(counter)}"
        sessions.open(sid)
        req = Req(sid, [1] * 32)
        sessions.restore_to_req(req)
        pool.kv_pool.extend(pool.req_to_token, req.seq.req_pool_idx, 0, 40)
        req.kv_len = req.folded_len = 40
        sessions.save_from_req(req)
        sessions.release_session(sid)

    n, elapsed = timed(cycle, seconds)
    return n / elapsed


def mamba_pairs_per_s(batch: int, seconds: float) -> float:
    pool = HybridReqToTokenPool(ModelConfig(), PoolConfig(max_sessions=128, mamba_track_buffers=1))
    mamba = pool.mamba_pool

    def pair() -> None:
        mamba.free(mamba.alloc(batch))

    n, elapsed = timed(pair, seconds)
    return n * batch / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=1.0, help="time per measurement")
    args = parser.parse_args()
    print("session open -> turn (40 tokens) -> release cycles/s")
    print(f"{'page_size':>10} {'track':>6} {'cycles/s':>10}")
    for page_size in (1, 16):
        for track in (0, 2):
            rate = session_cycles_per_s(page_size, track, args.seconds)
            print(f"{page_size:>10} {track:>6} {rate:>10,.0f}")
    print("\nmamba alloc+free (slots zeroed on alloc; tiny-bamba state shapes)")
    print(f"{'batch':>6} {'pairs/s':>12} {'calls/s':>10}")
    rates = {}
    for batch in (1, 8, 64):
        rates[batch] = mamba_pairs_per_s(batch, args.seconds)
        print(f"{batch:>6} {rates[batch]:>12,.0f} {rates[batch] / batch:>10,.0f}")
    print(f"\nbatched/sequential: slots/s at batch 64 vs batch 1 = {rates[64] / rates[1]:.1f}x")


if __name__ == "__main__":
    main()
