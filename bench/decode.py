"""Engine throughput on tiny-bamba: batched decode vs one session, prefill, time to first token.

For each concurrency N (1, 4, 16, 64 by default) N sessions each submit a short prompt and
generate ``--new`` tokens together, on an engine in this process. Decode tokens/s counts the
tokens of decode-only steps over their wall time; the ratio column is tokens/s at N over tokens/s
at 1 in the same repetition (every N runs once per repetition, side by side). TTFT is the median
over the N turns of submit -> first token. Prefill tokens/s is for ``--prefill-len``-token inputs
folded into a fresh session (append only). Figures: median (min–max) over repetitions.

Each N also runs on a second engine, side by side: on CUDA the same engine without CUDA graphs
(``--no-cuda-graphs``), so the graphs' column is graphs ÷ eager; on the CPU an engine whose decode
batches are padded to the fixed shapes the graphs run (``DecodeShapes``), so the column is what
padding costs where no graph replays. Every shape a measured step runs is captured in a warm-up
round first.

Run: ``python -m bench.decode [--quick]`` (add ``--device cuda`` on a GPU). Goal: 16 concurrent
sessions reach >= 8x the decode tokens/s of one (the engine as ``serve`` runs it: graphs on CUDA).
"""

from __future__ import annotations

import dataclasses
import statistics
import time

import torch

from bench.harness import cli
from bench.harness.inprocess_driver import build_engine
from bench.harness.report import Goal, Table, print_goals
from bench.harness.stats import Spread, ratios
from replica.api import SamplingParams
from replica.config import PoolConfig, ReplicaConfig
from replica.engine.engine import Engine

GOAL_SESSIONS = 16
GOAL_SPEEDUP = 8.0


def replica_config(max_sessions: int, chunk: int, threads: int) -> ReplicaConfig:
    pools = PoolConfig(
        max_sessions=max_sessions,
        kv_tokens=max_sessions * 1024,
        max_context=1024,
        page_size=16,
        mamba_track_buffers=1,
    )
    return ReplicaConfig(
        pools=pools, max_prefill_chunk=chunk, max_batch_tokens=8192, threads=threads
    )


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def decode_run(engine: Engine, n: int, prompt_len: int, new: int, device: str) -> dict:
    """n sessions, one turn each: decode tokens/s and the median time to first token (s)."""
    gen = torch.Generator().manual_seed(n)
    sids = [f"n{n}-s{i}" for i in range(n)]
    for sid in sids:
        engine.open_session(sid)
    sampling = SamplingParams(max_new_tokens=new)
    submitted, first = {}, {}
    for sid in sids:
        ids = torch.randint(0, 256, (prompt_len,), generator=gen).tolist()
        rid = engine.submit(sid, ids, sampling).rid
        submitted[rid] = time.perf_counter()
    decode_s, decode_tokens, total = 0.0, 0, 0
    while engine.has_work:
        # a step admits waiting turns before it plans, and then runs their prefill
        decode_only = not engine.scheduler.waiting and not engine.scheduler.plan().prefill
        start = time.perf_counter()
        events = engine.step()
        sync(device)
        now = time.perf_counter()
        tokens = events.token_count
        total += tokens
        if decode_only:
            decode_s += now - start
            decode_tokens += tokens
        for e in events:
            if e.token_ids and e.turn_id not in first:
                first[e.turn_id] = now - submitted[e.turn_id]
    assert total == n * new, (total, n * new)
    for sid in sids:
        engine.close_session(sid)
    return {"tok_s": decode_tokens / decode_s, "ttft": statistics.median(first.values())}


def prefill_tok_s(engine: Engine, length: int, repeats: int, device: str) -> float:
    """Tokens/s of one ``length``-token turn with nothing to generate, median of ``repeats``."""
    gen = torch.Generator().manual_seed(1)
    times = []
    for i in range(repeats + 1):
        sid = f"prefill-{i}"
        engine.open_session(sid)
        ids = torch.randint(0, 256, (length,), generator=gen).tolist()
        start = time.perf_counter()
        engine.submit(sid, ids, SamplingParams(max_new_tokens=0))
        while engine.has_work:
            engine.step()
        sync(device)
        if i:  # the first one warms up
            times.append(time.perf_counter() - start)
        engine.close_session(sid)
    return length / statistics.median(times)


def main() -> None:
    parser = cli.parser(__doc__)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--prefill-len", type=int, default=512)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (the replica setting; 0: default)"
    )
    args = cli.parse(parser)
    config = replica_config(max(args.concurrency), args.prefill_len, args.threads)
    cuda = args.device.startswith("cuda")
    # the engine as serve runs it, and beside it: eager on CUDA, padded on the CPU
    names = ("graphs", "eager") if cuda else ("exact", "padded")
    beside = {"cuda_graphs": False} if cuda else {"pad_decode": True}
    other = dataclasses.replace(config, **beside)
    engines = {
        names[0]: build_engine(config, args.device),
        names[1]: build_engine(other, args.device),
    }
    for engine in engines.values():  # warm up: every shape the runs step through
        for n in args.concurrency:
            decode_run(engine, n, args.prompt_len, args.new, args.device)
    runs = {(name, n): [] for name in engines for n in args.concurrency}
    for _ in range(args.repeats):
        for n in args.concurrency:
            for name, engine in engines.items():
                runs[name, n].append(decode_run(engine, n, args.prompt_len, args.new, args.device))
    engine = engines[names[0]]
    prefill = [
        prefill_tok_s(engine, args.prefill_len, 2 if args.quick else 5, args.device)
        for _ in range(args.repeats)
    ]
    for each in engines.values():
        each.check_invariant()
    graphs = engine.runner.graphs
    if cuda:
        captured = "off" if graphs is None else f"{len(graphs.graphs)} captured"
        print(
            f"CUDA graphs: {captured}"
            + (f" (turned off: {graphs.off})" if graphs and graphs.off else "")
        )

    print(
        f"tiny-bamba on {args.device} (threads={torch.get_num_threads()}), prompt "
        f"{args.prompt_len} tokens, {args.new} new tokens per session, {args.repeats} "
        "repetition(s): median (min–max)"
    )
    a, b = names
    table = Table(
        "sessions", f"{a} tok/s", f"{b} tok/s", f"{a} / {b}", f"{a} vs 1 session", "TTFT ms"
    )
    rates = {key: [r["tok_s"] for r in value] for key, value in runs.items()}
    single = rates.get((a, 1))
    for n in args.concurrency:
        table.add(
            n,
            Spread.of(rates[a, n]).format(",.0f"),
            Spread.of(rates[b, n]).format(",.0f"),
            ratios(rates[a, n], rates[b, n]).format(),
            ratios(rates[a, n], single).format() if single else "-",
            Spread.of(r["ttft"] * 1e3 for r in runs[a, n]).format(".1f"),
        )
    table.print()
    print(
        f"prefill: {Spread.of(prefill).format(',.0f')} tok/s for {args.prefill_len}-token "
        "inputs (one chunk)"
    )
    if single and (a, GOAL_SESSIONS) in rates:
        speedup = ratios(rates[a, GOAL_SESSIONS], single)
        print_goals([Goal(f"decode tok/s, {GOAL_SESSIONS} sessions / 1", speedup, GOAL_SPEEDUP)])


if __name__ == "__main__":
    main()
