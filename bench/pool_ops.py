"""Pool operation throughput: session lifecycles and mamba alloc/free at several batch sizes.

Session cycles: open a session, fold a 40-token turn into it (KV extended, state saved) and
release it, on the pools alone (no model), for page sizes 1 and 16 and 0 or 2 track buffers.
Mamba alloc+free pairs at batch 1, 8 and 64 (slots zeroed on alloc; tiny-bamba state shapes),
the batch sizes taking turns in short slices so that they are measured side by side. Each
measurement runs ``--seconds``; figures are the median (min–max) over repetitions, the ratio of
slots/s at batch 64 vs one at a time taken per repetition. Goal: the pool operations are
O(batch) tensor ops with no Python loop over slots (which would give about 1x), so batch 64
moves >= 5x the slots/s of batch 1.

Run: ``python -m bench.pool_ops [--quick]``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from bench.harness import cli
from bench.harness.report import Goal, Table, print_goals
from bench.harness.stats import Spread, ratios
from replica.config import PoolConfig
from replica.model.config import ModelConfig
from replica.pools.hybrid_pool import HybridReqToTokenPool
from replica.sessions.request import Req
from replica.sessions.table import SessionTable

GOAL_BATCHED_VS_SEQUENTIAL = 5.0  # a Python loop per slot would give about 1x
BATCHES = (1, 8, 64)
SLICE_S = 0.05


def timed(fn: Callable[[], object], seconds: float) -> tuple[int, float]:
    """Calls ``fn`` back to back for ``seconds``: (calls, elapsed seconds)."""
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
    sessions = SessionTable(pool)
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


def mamba_slots_per_s(seconds: float) -> dict[int, float]:
    """Slots/s of alloc+free pairs at each batch size, the sizes taking turns in slices of
    ``SLICE_S`` for ``seconds`` each, so that the batch sizes are measured side by side."""
    pool = HybridReqToTokenPool(ModelConfig(), PoolConfig(max_sessions=128, mamba_track_buffers=1))
    mamba = pool.mamba_pool
    pairs = dict.fromkeys(BATCHES, 0)
    elapsed = dict.fromkeys(BATCHES, 0.0)
    for _ in range(max(1, round(seconds / SLICE_S))):
        for batch in BATCHES:
            n, spent = timed(lambda b=batch: mamba.free(mamba.alloc(b)), SLICE_S)
            pairs[batch] += n
            elapsed[batch] += spent
    return {batch: pairs[batch] * batch / elapsed[batch] for batch in BATCHES}


def main() -> None:
    parser = cli.parser(__doc__)
    parser.add_argument(
        "--seconds", type=float, default=None, help="time per measurement (1; --quick 0.3)"
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (default 1; 0: torch's default)"
    )
    args = cli.parse(parser)
    if args.threads:  # more than one thread on a busy box: OpenMP barriers dominate the copies
        torch.set_num_threads(args.threads)
    seconds = args.seconds or (0.3 if args.quick else 1.0)
    shapes = [(page_size, track) for page_size in (1, 16) for track in (0, 2)]
    cycles: dict[tuple[int, int], list[float]] = {shape: [] for shape in shapes}
    slots: dict[int, list[float]] = {batch: [] for batch in BATCHES}
    for _ in range(args.repeats):
        for page_size, track in shapes:
            cycles[page_size, track].append(session_cycles_per_s(page_size, track, seconds))
        for batch, rate in mamba_slots_per_s(seconds).items():
            slots[batch].append(rate)

    print(
        f"torch threads={torch.get_num_threads()}; {args.repeats} repetition(s) of {seconds:g}s "
        "each: median (min–max)"
    )
    print("\nsession open -> turn (40 tokens) -> release")
    table = Table("page_size", "track buffers", "cycles/s")
    for page_size, track in shapes:
        table.add(page_size, track, Spread.of(cycles[page_size, track]).format(",.0f"))
    table.print()
    print("\nmamba alloc+free (slots zeroed on alloc; tiny-bamba state shapes)")
    table = Table("batch", "slots/s", "calls/s", "vs batch 1")
    for batch in BATCHES:
        table.add(
            batch,
            Spread.of(slots[batch]).format(",.0f"),
            Spread.of(s / batch for s in slots[batch]).format(",.0f"),
            ratios(slots[batch], slots[1]).format(".1f"),
        )
    table.print()
    batched = ratios(slots[64], slots[1])
    print_goals(
        [Goal("slots/s, batch 64 / batch 1", batched, GOAL_BATCHED_VS_SEQUENTIAL, spec=".1f")]
    )


if __name__ == "__main__":
    main()
