"""Live migration and session checkpoints: what they cost, in one run.

The model has a real model's per-session state with few layers (``bench.park_measures``'
``REAL_STATE``: Bamba-9B's Mamba2 heads, 128 x 64 x 128, 3 mamba layers and 1 attention layer
of 8 KV heads of 128; float32): 12.9 MB of live mamba state per session and 8 KiB of KV per
token. It is saved as an HF checkpoint in a temporary directory and served (``--model-path``)
by 2 CPU replicas of 66 sessions each (no track buffer, to keep 2 x 66 x 12.9 MB in memory),
twice: without, then with, ``--session-checkpoints``. On each cluster:

1. migration time per session: ``MigrateSession`` of an idle session with a 256-token history
   (15.0 MB of state) from one replica to the other, through the router, against a plain copy
   of as many bytes through Ray's object store between the same two replica processes (the
   source puts them, the target gets them and copies them into a buffer of its own; two actor
   calls), taking turns, 8 sessions (4 with ``--quick``): the median of the ratios;
2. (with checkpoints) the drain time of a replica holding 64 sessions, each with a 32-token
   history: DrainReplica(migrate=true) until it holds none;
3. turn latency: one session's turns back to back (8 tokens in, 16 out, after a 64-token
   history) through the gateway, from submission to the last chunk, 16 turns (6 with
   ``--quick``): p50 and p99, and the checkpoint bytes written per turn.
With checkpoints on, a migration answers once the target's first checkpoint of the session is
stored (the state is never in one replica's hands only), and a turn's last chunk once its
checkpoint is stored.

Run: ``python -m bench.migration [--quick]``. Goals: migration <= 1.5x the plain copy (without
checkpoints: the move itself); turn latency p50 with checkpoints within 10 % of without.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time

from bench.harness import cli
from bench.harness.cluster import local_cluster
from bench.harness.report import Goal, Table, number, print_goals
from bench.harness.stats import Spread, p50, p99, ratios
from bench.migration_measures import (
    DRAINED,
    HISTORY,
    drain_s,
    migration_vs_copy,
    turn_latencies,
)
from bench.park_measures import REAL_STATE
from replica.model import HybridModel, init_weights, save_checkpoint

GOAL_MOVE, GOAL_TURN = 1.5, 1.1
SESSIONS_PER_REPLICA = DRAINED + 2


def save_real_state_model(path: str) -> None:
    model = HybridModel(REAL_STATE)
    init_weights(model, seed=0)
    save_checkpoint(REAL_STATE, model.eval(), path)


async def measure(path: str, checkpoints: bool, quick: bool) -> dict[str, object]:
    flags = dict(
        replicas=2,
        model_path=path,
        threads=1,
        max_sessions=SESSIONS_PER_REPLICA,
        kv_tokens=SESSIONS_PER_REPLICA * (HISTORY + 64),
        max_context=768,
        page_size=16,
        mamba_track_buffers=0,
        max_prefill_chunk=512,
        session_checkpoints=checkpoints,
    )
    async with local_cluster(**flags) as cluster:
        moves, copies, nbytes = await migration_vs_copy(cluster, 4 if quick else 8)
        turns, per_turn = await turn_latencies(cluster, 6 if quick else 16)
        drain = await drain_s(cluster) if checkpoints else None
    return dict(
        moves=moves, copies=copies, nbytes=nbytes, turns=turns, per_turn=per_turn, drain=drain
    )


def main() -> None:
    args = cli.parse(cli.parser(__doc__))
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as path:
        save_real_state_model(path)
        off = asyncio.run(measure(path, False, args.quick))
        on = asyncio.run(measure(path, True, args.quick))

    nbytes = off["nbytes"]
    print(f"\nmigration of one idle session ({nbytes / 1e6:.1f} MB of state), median of each:")
    table = Table("checkpoints", "migration ms", "plain copy ms", "ratio", "MB/s migrated")
    spread = {}
    for name, run in (("off", off), ("on", on)):
        spread[name] = ratios(run["moves"], run["copies"])
        move = statistics.median(run["moves"])
        table.add(
            name,
            number(1000 * move, ".1f"),
            number(1000 * statistics.median(run["copies"]), ".1f"),
            spread[name].format(),
            number(nbytes / move / 1e6, ".0f"),
        )
    table.print()

    seconds, migrated, left = on["drain"]
    print(f"\ndrain of a replica holding {DRAINED} sessions (checkpoints on):")
    table = Table("sessions", "migrated", "left", "drain s", "ms per session")
    table.add(
        DRAINED, migrated, left, number(seconds, ".2f"), number(1000 * seconds / DRAINED, ".1f")
    )
    table.print()

    print("\nturn latency, one session, 8 tokens in and 16 out, through the gateway:")
    table = Table("checkpoints", "turns", "p50 ms", "p99 ms", "checkpoint MB per turn")
    for name, run in (("off", off), ("on", on)):
        turns = run["turns"]
        table.add(
            name,
            len(turns),
            number(1000 * p50(turns), ".1f"),
            number(1000 * p99(turns), ".1f"),
            number(run["per_turn"] / 1e6, ".1f"),
        )
    table.print()

    turn_ratio = p50(on["turns"]) / p50(off["turns"])
    print_goals(
        [
            Goal("migration / plain copy (checkpoints off)", spread["off"], GOAL_MOVE, False),
            Goal("turn p50 with / without checkpoints", Spread.of([turn_ratio]), GOAL_TURN, False),
        ]
    )
    print(f"\ntotal run time {time.perf_counter() - t0:.0f}s")


if __name__ == "__main__":
    main()
