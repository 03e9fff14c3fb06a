"""What one turn's checkpoint costs: bytes written for one 8-in/8-out turn of a session with a
1,536-token history against one with a 16-token history, as delta checkpoints (what a replica
writes: the recurrent state and the KV of the positions the turn wrote) and as whole states
(what it wrote before deltas: every committed position's KV on every turn), side by side in
one run, on the same engine; and the time the engine thread spends taking each.

The model: tiny-bamba (the default, small recurrent state: KV dominates a long session), or
with ``--real-state`` ``bench.park_measures``' ``REAL_STATE`` (Bamba-9B's Mamba2 heads, 12.9 MB
of recurrent state per session: the recurrent state dominates). In-process engine, no Ray: the
bytes are the records' own.

Run: ``python -m bench.checkpoint_bytes [--quick] [--real-state]``. Goal: delta bytes with the
long history / with the short one <= 2.
"""

from __future__ import annotations

import statistics
import time

import torch

from bench.harness import cli
from bench.harness.report import Goal, Table, print_goals
from bench.harness.stats import ratios
from bench.park_measures import real_state_engine
from replica.api import SamplingParams
from replica.config import PoolConfig, ReplicaConfig
from replica.engine.engine import Engine
from replica.model.factory import build_tiny_bamba

LONG, SHORT, TURN_IN, TURN_OUT = 1536, 16, 8, 8
GOAL = 2.0


def tiny_engine() -> Engine:
    _, model, tokenizer = build_tiny_bamba(seed=0)
    pools = PoolConfig(max_sessions=4, kv_tokens=8192, max_context=2048)
    config = ReplicaConfig(pools=pools, session_checkpoints=True, max_prefill_chunk=2048)
    return Engine(config, model, tokenizer)


def checkpointing(engine: Engine) -> Engine:
    if engine.checkpoints is None:  # the REAL_STATE engine is built without checkpoints
        engine = Engine(
            ReplicaConfig(
                pools=engine.config.pools, session_checkpoints=True, max_prefill_chunk=2048
            ),
            engine.runner.model,
            engine.tokenizer,
        )
    engine.checkpoints.enabled = True  # as when a checkpoint store follows the replica
    return engine


def run(engine: Engine, session_id: str, ids: list[int], new: int) -> None:
    engine.submit(session_id, ids, SamplingParams(max_new_tokens=new, ignore_eos=True))
    while engine.has_work:
        engine.step()
    engine.take_events()


def turn_bytes(engine: Engine, history: int, seed: int) -> dict[str, float]:
    """Bytes of the checkpoint after one turn of a session with ``history`` tokens, as a delta
    and as a whole state; seconds the engine took to take the delta."""
    sid = f"s{history}-{seed}"
    vocab = engine.model_config.vocab_size
    engine.open_session(sid)
    run(engine, sid, [(seed + 7 * i) % (vocab - 1) + 1 for i in range(history - 1)], 1)
    engine.session_ops.take_checkpoints()  # the history's checkpoint: a whole state
    run(engine, sid, [(seed + 3 * i) % (vocab - 1) + 1 for i in range(TURN_IN)], TURN_OUT)
    started = time.perf_counter()
    (delta,) = engine.session_ops.take_checkpoints().saved
    took = time.perf_counter() - started
    whole = engine.transfer.export([engine.sessions.get(sid)])
    engine.close_session(sid)
    engine.session_ops.take_checkpoints()
    return {"delta": delta.nbytes, "whole": whole.nbytes, "take_s": took}


def main() -> None:
    parser = cli.parser(__doc__)
    parser.add_argument("--real-state", action="store_true", help="a real model's state size")
    args = cli.parse(parser)
    torch.set_num_threads(1)
    built = real_state_engine("cpu", LONG + 64, 1) if args.real_state else tiny_engine()
    engine = checkpointing(built)
    long = [turn_bytes(engine, LONG, seed) for seed in range(args.repeats)]
    short = [turn_bytes(engine, SHORT, seed) for seed in range(args.repeats)]

    def median(rows: list[dict[str, float]], key: str) -> float:
        return statistics.median(r[key] for r in rows)

    model = "REAL_STATE" if args.real_state else "tiny-bamba"
    print(f"checkpoint of one {TURN_IN}-in/{TURN_OUT}-out turn ({model}, {args.repeats} reps)")
    table = Table("history", "delta (bytes)", "whole state (bytes)", "take (ms)")
    for name, rows in ((LONG, long), (SHORT, short)):
        table.add(
            name,
            f"{median(rows, 'delta'):.0f}",
            f"{median(rows, 'whole'):.0f}",
            f"{median(rows, 'take_s') * 1e3:.2f}",
        )
    table.print()
    whole = ratios([r["whole"] for r in long], [r["whole"] for r in short])
    print(f"\nwhole states (before deltas), {LONG} / {SHORT} tokens: {whole.format('.2f')}")
    delta = ratios([r["delta"] for r in long], [r["delta"] for r in short])
    print_goals([Goal(f"delta bytes, {LONG} / {SHORT} tokens of history", delta, GOAL, False)])


if __name__ == "__main__":
    main()
