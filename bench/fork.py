"""Forking a session: what a fork costs against one mamba-slot copy, and what sharing buys.

The model has a real model's per-session state with few layers (``bench.park_measures``'
``REAL_STATE``: Bamba-9B's Mamba2 heads, 12.9 MB of live mamba state per session, float32; 8 KiB
of KV per token and attention layer), KV pages of 16 tokens. Measured, side by side in one run:

1. fork time: ``SessionTable.fork`` of a session with a 2,053-token history (128 whole pages
   shared, one partial page copied), against one ``MambaPool.copy`` of one slot into another
   (what any fork must copy at least); the two take turns, ``--rounds`` times each (median);
2. KV bytes copied per fork (the forker's own count), against the bytes of one KV page and the
   bytes of the history's whole KV (what a copy without sharing would move);
3. sessions held at a fixed KV budget (8 x 2,048 tokens of KV, tiny-bamba's state: only KV is
   the limit) when every session holds the same 2,048-token history: forks of one session
   against sessions that each hold their own copy.
Figures: median (min–max) over repetitions.

Run: ``python -m bench.fork [--quick]`` (``--device cuda`` on a GPU). Goals: a fork <= 2x one
mamba-slot copy; at most one KV page copied per fork; >= 10x the sessions held.
"""

from __future__ import annotations

import statistics
import time

import torch

from bench.decode import sync
from bench.harness import cli
from bench.harness.report import Goal, Table, print_goals
from bench.harness.stats import Spread, ratios
from bench.park_measures import REAL_STATE, with_history
from replica.api import PoolExhaustedError
from replica.config import PoolConfig
from replica.model.config import ModelConfig
from replica.pools.hybrid_pool import HybridReqToTokenPool
from replica.sessions.table import SessionTable

HISTORY, PAGE = 2053, 16
BUDGET_SESSIONS, SHARED_HISTORY = 8, 2048
GOAL_TIME, GOAL_HELD = 2.0, 10.0
GOAL_PAGES = 1.5  # a whole number of pages: below 1.5 is at most one


def sessions_over(model: ModelConfig, pools: PoolConfig) -> SessionTable:
    return SessionTable(HybridReqToTokenPool(model, pools))


def fork_costs(device: str, rounds: int, seed: int) -> dict[str, float]:
    """Median seconds of a fork and of one mamba-slot copy, taking turns; KV bytes per fork."""
    pools = PoolConfig(
        max_sessions=3, kv_tokens=HISTORY + 4 * PAGE, max_context=HISTORY + PAGE,
        page_size=PAGE, device=device,
    )  # fmt: skip
    sessions = sessions_over(REAL_STATE, pools)
    with_history(sessions, "parent", HISTORY, seed)
    mamba = sessions.pool.mamba_pool
    src, dst = sessions.get("parent").seq.mamba_pool_idx, int(mamba.alloc(1)[0])
    forker = sessions.forker
    forks, copies, kv_bytes = [], [], []
    for i in range(rounds + 1):  # the first of each is a warm-up
        sync(device)
        started = time.perf_counter()
        mamba.copy(src, dst)
        sync(device)
        copies.append(time.perf_counter() - started)
        before = forker.kv_bytes_copied
        started = time.perf_counter()
        sessions.fork("parent", f"child{i}")
        sync(device)
        forks.append(time.perf_counter() - started)
        kv_bytes.append(forker.kv_bytes_copied - before)
        sessions.release_session(f"child{i}")
    k = sessions.pool.kv_pool.k_all
    page_bytes = 2 * k.shape[0] * PAGE * k[0, 0].numel() * k.element_size()
    return {
        "fork_s": statistics.median(forks[1:]),
        "copy_s": statistics.median(copies[1:]),
        "kv_bytes": statistics.median(kv_bytes[1:]),
        "page_bytes": page_bytes,
        "history_bytes": page_bytes * -(-HISTORY // PAGE),
    }


def sessions_held(device: str, shared: bool) -> int:
    """Sessions holding the same 2,048-token history that a KV budget of 8 such histories holds:
    forks of one session (``shared``), or sessions with their own copy."""
    pools = PoolConfig(
        max_sessions=256, kv_tokens=BUDGET_SESSIONS * SHARED_HISTORY,
        max_context=SHARED_HISTORY, page_size=PAGE, mamba_track_buffers=0, device=device,
    )  # fmt: skip
    sessions = sessions_over(ModelConfig(), pools)
    with_history(sessions, "s0", SHARED_HISTORY, seed=-1)
    held = 1
    while held < pools.max_sessions:
        try:
            if shared:
                sessions.fork("s0", f"s{held}")
            else:
                with_history(sessions, f"s{held}", SHARED_HISTORY, seed=-1)
        except PoolExhaustedError:
            sessions.release_session(f"s{held}")  # an open that found no KV room
            break
        held += 1
    return held


def main() -> None:
    parser = cli.parser(__doc__)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--rounds", type=int, default=None, help="forks per repetition")
    args = cli.parse(parser)
    torch.set_num_threads(1)
    rounds = args.rounds or (5 if args.quick else 21)
    costs = [fork_costs(args.device, rounds, seed) for seed in range(args.repeats)]
    shared = [sessions_held(args.device, True) for _ in range(args.repeats)]
    own = [sessions_held(args.device, False) for _ in range(args.repeats)]

    def spread(key: str, scale: float = 1.0) -> Spread:
        return Spread.of(c[key] * scale for c in costs)

    print(f"fork of a {HISTORY}-token session ({args.device}, pages of {PAGE} tokens)")
    table = Table("measure", "value")
    table.add("fork (ms)", spread("fork_s", 1e3).format(".3f"))
    table.add("one mamba-slot copy (ms)", spread("copy_s", 1e3).format(".3f"))
    table.add("KV bytes copied per fork", spread("kv_bytes").format(".0f"))
    table.add("one KV page (bytes)", spread("page_bytes").format(".0f"))
    table.add("the history's KV (bytes)", spread("history_bytes").format(".0f"))
    table.add(
        f"sessions held, {SHARED_HISTORY}-token history shared", Spread.of(shared).format(".0f")
    )
    table.add("sessions held, each its own copy", Spread.of(own).format(".0f"))
    table.print()
    print_goals(
        [
            Goal(
                "fork time / one mamba-slot copy",
                ratios([c["fork_s"] for c in costs], [c["copy_s"] for c in costs]),
                GOAL_TIME,
                at_least=False,
                unit="x",
            ),
            Goal(
                "KV pages copied per fork (at most one)",
                ratios([c["kv_bytes"] for c in costs], [c["page_bytes"] for c in costs]),
                GOAL_PAGES,
                at_least=False,
            ),
            Goal("sessions held, shared / own", ratios(shared, own), GOAL_HELD, unit="x"),
        ]
    )


if __name__ == "__main__":
    main()
