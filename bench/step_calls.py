"""The Python work of one decode step, by batch size: function calls (cProfile's count, builtins
included) of one decode-only ``Engine.step`` with 1 / 8 / 64 sessions decoding together, greedy
and seeded (temperature 0.8, top_p 0.9, top_k 50), and the step's time at the 10th percentile:
CPU time of this process on the CPU (the machine is shared; with one torch thread the step's
work is this process's), wall time after a synchronize on CUDA.

The calls are the engine's own work whatever else the machine does: a step whose Python work
is constant in the batch has the same count at every batch size (goal: within 10 %). The
tiny-bamba model on the CPU, one torch thread; ``--device cuda`` on a GPU.

Run: ``python -m bench.step_calls [--quick]``.
"""

from __future__ import annotations

import cProfile
import pstats
import time

import torch

from bench.decode import sync
from bench.harness import cli
from bench.harness.inprocess_driver import build_engine
from bench.harness.report import Table
from bench.harness.stats import Spread, percentile
from replica.api import SamplingParams
from replica.config import PoolConfig, ReplicaConfig
from replica.engine.engine import Engine

BATCHES = (1, 8, 64)
GOAL_SPREAD = 0.10
SAMPLINGS = {
    "greedy": lambda new, i: SamplingParams(new, temperature=0.0),
    "seeded": lambda new, i: SamplingParams(new, temperature=0.8, top_p=0.9, top_k=50, seed=i),
}


def step_engine(device: str, threads: int) -> Engine:
    pools = PoolConfig(max_sessions=max(BATCHES), kv_tokens=max(BATCHES) * 256, max_context=256)
    config = ReplicaConfig(
        pools=pools, max_prefill_chunk=512, max_batch_tokens=8192, threads=threads
    )
    return build_engine(config, device)


def decode_calls(
    engine: Engine, sessions: int, new: int, sampling: str, device: str
) -> tuple[int, float]:
    """``sessions`` sessions decode ``new`` tokens together: (Python calls of the second
    decode-only step, seconds of a decode-only step at the 10th percentile)."""
    sids = [f"step-{sessions}-{i}" for i in range(sessions)]
    for i, sid in enumerate(sids):
        engine.open_session(sid)
        prompt = [(7 * i + j) % 250 + 1 for j in range(16)]
        engine.submit(sid, prompt, SAMPLINGS[sampling](new, i))
    times: list[float] = []
    calls, decode_steps = 0, 0
    while engine.has_work:
        plan = engine.scheduler.plan()
        full = not engine.scheduler.waiting and not plan.prefill and len(plan.decode) == sessions
        if full:
            decode_steps += 1
        if full and decode_steps == 2:  # the first may still build what later steps reuse
            profile = cProfile.Profile()
            profile.runcall(engine.step)
            calls = pstats.Stats(profile).total_calls
            continue
        clock = time.perf_counter if device.startswith("cuda") else time.process_time
        start = clock()
        engine.step()
        sync(device)
        if full:
            times.append(clock() - start)
    for sid in sids:
        engine.close_session(sid)
    engine.check_invariant()
    return calls, percentile(times, 10)


def main() -> None:
    parser = cli.parser(__doc__)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: default)")
    args = cli.parse(parser)
    new = 16 if args.quick else 48
    engine = step_engine(args.device, args.threads)
    for n in BATCHES:  # warm up: on CUDA every shape the runs step through is captured here
        decode_calls(engine, n, new, "seeded", args.device)
    table = Table("sampling", "sessions", "calls per step", "vs 1 session", "step ms (p10)")
    spreads = {}
    for sampling in SAMPLINGS:
        counts = {}
        for n in BATCHES:
            runs = [
                decode_calls(engine, n, new, sampling, args.device) for _ in range(args.repeats)
            ]
            counts[n] = runs[0][0]
            ms = Spread.of(r[1] * 1e3 for r in runs).format(".2f")
            table.add(sampling, n, f"{counts[n]:,}", f"{counts[n] / counts[1]:.2f}", ms)
        spreads[sampling] = max(counts.values()) / min(counts.values()) - 1
    print(
        f"decode step of tiny-bamba on {args.device} (threads={torch.get_num_threads()}), "
        f"{new} new tokens per session, {args.repeats} repetition(s)"
    )
    table.print()
    for sampling, spread in spreads.items():
        verdict = "met" if spread <= GOAL_SPREAD else "NOT met"
        print(
            f"  {sampling}: calls spread {spread:.0%} over 1/8/64 sessions "
            f"(goal <= 10 %: {verdict})"
        )


if __name__ == "__main__":
    main()
