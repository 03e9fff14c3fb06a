"""Engine throughput on tiny-bamba: batched decode vs one session, prefill, time to first token.

For each concurrency N (1, 4, 16, 64 by default) N sessions each submit a short prompt and
generate ``--new`` tokens together. Decode tokens/s counts the tokens of decode-only steps over
their wall time; the ratio column is tokens/s at N over tokens/s at 1, measured side by side in
this run. TTFT is the median over the N turns of submit -> first token. Prefill tokens/s is for
``--prefill-len``-token inputs folded into a fresh session (append only).

Run: ``.venv/bin/python bench/decode.py`` (add ``--device cuda`` on a GPU). Goal: 16 concurrent
sessions reach >= 8x the decode tokens/s of one.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from replica.api import SamplingParams
from replica.config import PoolConfig, ReplicaConfig
from replica.engine.engine import Engine
from replica.model import build_tiny_bamba


def make_engine(max_sessions: int, device: str, chunk: int) -> Engine:
    cfg, model, tok = build_tiny_bamba()
    model.to(device)
    pools = PoolConfig(
        max_sessions=max_sessions,
        kv_tokens=max_sessions * 1024,
        max_context=1024,
        page_size=16,
        mamba_track_buffers=1,
        device=device,
    )
    config = ReplicaConfig(pools=pools, max_prefill_chunk=chunk, max_batch_tokens=8192)
    return Engine(config, model, tok)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def decode_run(engine: Engine, n: int, prompt_len: int, new: int, device: str) -> dict:
    """One round: n sessions, one turn each; returns decode tokens/s and TTFTs."""
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
        tokens = sum(len(e.token_ids) for e in events)
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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--prefill-len", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3, help="best of this many rounds")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch intra-op threads on the CPU (0: default)"
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    engine = make_engine(max(args.concurrency), args.device, chunk=args.prefill_len)
    decode_run(engine, 2, args.prompt_len, 8, args.device)  # warm up
    rows = []
    for n in args.concurrency:
        runs = [
            decode_run(engine, n, args.prompt_len, args.new, args.device)
            for _ in range(args.rounds)
        ]
        best = max(runs, key=lambda r: r["tok_s"])
        rows.append((n, best["tok_s"], statistics.median(r["ttft"] for r in runs)))
    prefill = prefill_tok_s(engine, args.prefill_len, 5, args.device)
    engine.check_invariant()

    base = rows[0][1] if rows[0][0] == 1 else None
    print(
        f"tiny-bamba on {args.device} (threads={torch.get_num_threads()}), prompt "
        f"{args.prompt_len} tokens, {args.new} new tokens per session, best of {args.rounds}"
    )
    print(f"{'sessions':>8}  {'decode tok/s':>12}  {'vs 1 session':>12}  {'TTFT median ms':>14}")
    for n, tok_s, ttft in rows:
        ratio = f"{tok_s / base:.2f}x" if base else "-"
        print(f"{n:>8}  {tok_s:>12.0f}  {ratio:>12}  {ttft * 1e3:>14.1f}")
    print(f"prefill: {prefill:.0f} tok/s for {args.prefill_len}-token inputs (one chunk)")
    if base:
        goal = [r for r in rows if r[0] == 16]
        if goal:
            ratio = goal[0][1] / base
            verdict = "met" if ratio >= 8 else "NOT met"
            print(f"goal 16 sessions >= 8x one session: {ratio:.2f}x ({verdict})")


if __name__ == "__main__":
    main()
