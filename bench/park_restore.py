"""Parking idle sessions in host memory: what it costs and what it buys, in one run.

The model has a real model's per-session state with few layers (``REAL_STATE``): Mamba2 mixers
of 128 heads x 64 head dim x 128 d_state (Bamba-9B's), attention with 8 KV heads of 128 (8 KiB of
KV per token and layer), 3 mamba layers and 1 attention layer: 12.9 MB of live mamba state per
session, float32. Measured:

1. park and restore throughput: 8 sessions with 2,048-token histories parked in one batch and
   restored in one batch (``Parker``), bytes/s against a plain torch copy of the same number of
   bytes (one contiguous ``copy_``; GPU -> pinned host on CUDA), taking turns 9 times (5 with
   ``--quick``), the median of each;
2. a parked session's time to first token (restore, then a one-token turn) against re-prefilling
   its history of 256 / 2,048 / 8,192 tokens (``--quick``: 256 and 2,048) in a fresh session, on
   an engine of this model;
3. decode tokens/s of 8 active sessions with 0 / 100 / 1,000 sessions parked (tiny-bamba: the
   engine's bookkeeping is what could grow with parked sessions, and a small model's short steps
   show it most), the counts taking turns: tokens/s of a decode step at the 10th percentile of
   step times (robust to other work on a shared machine), median over 3 runs of 8 x 128 tokens,
   and the Python function calls of one decode step (the engine's own work, whatever else the
   machine does);
4. sessions one replica holds at a fixed GPU budget (8 GPU sessions of this model, 1 track
   buffer), each with a 64-token history, without and with parking (88 parked).
Figures: median (min–max) over repetitions.

Run: ``python -m bench.park_restore [--quick]`` (``--device cuda`` on a GPU). Goals: park and
restore >= 0.8x a plain copy; restore >= 20x faster than re-prefill at 2,048; decode with
parked sessions within 5 % of none; >= 10x the sessions held.
"""

from __future__ import annotations

import statistics

import torch

from bench.harness import cli
from bench.harness.report import Goal, Table, print_goals
from bench.harness.stats import Spread, ratios
from bench.park_measures import (
    BATCH,
    GPU_SESSIONS,
    HISTORY,
    PARKED_SESSIONS,
    REAL_STATE,
    copy_throughput,
    decode_engine,
    decode_with_parked,
    real_state_engine,
    sessions_held,
    ttft_pair,
)

GOAL_COPY, GOAL_TTFT, GOAL_DECODE, GOAL_HELD = 0.8, 20.0, 0.95, 10.0

# ----- the run --------------------------------------------------------------------------------


def main() -> None:
    parser = cli.parser(__doc__)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (the replica setting; 0: default)"
    )
    parser.add_argument("--new", type=int, default=128, help="tokens each decoding session makes")
    args = cli.parse(parser)
    device, repeats = args.device, args.repeats
    histories = (256, 2048) if args.quick else (256, 2048, 8192)
    parked_counts = (0, 100, 1000)
    if args.threads:
        torch.set_num_threads(args.threads)

    copies = [copy_throughput(device, 5 if args.quick else 9) for _ in range(repeats)]

    engine = real_state_engine(device, max(histories), args.threads)
    ttft_pair(engine, 64, device, seed=99)  # warm up
    ttft = {h: [ttft_pair(engine, h, device, seed) for seed in range(repeats)] for h in histories}
    del engine

    engine = decode_engine(device, max(parked_counts), args.threads)
    decode_with_parked(engine, 0, args.new, 1, device)  # warm up (on CUDA: the graphs too)
    rates: dict[int, list[float]] = {n: [] for n in parked_counts}
    calls: dict[int, float] = {}
    for _ in range(repeats):
        for n in parked_counts:
            rate, calls[n] = decode_with_parked(engine, n, args.new, 3, device)
            rates[n].append(rate)
    engine.check_invariant()

    plain, parking = sessions_held(0), sessions_held(PARKED_SESSIONS)

    state_mb = (
        REAL_STATE.num_mamba_layers
        * (
            (REAL_STATE.conv_dim * (REAL_STATE.mamba_d_conv - 1))
            + REAL_STATE.mamba_n_heads * REAL_STATE.mamba_d_head * REAL_STATE.mamba_d_state
        )
        * 4
        / 1e6
    )
    print(
        f"model: {REAL_STATE.num_mamba_layers} Mamba2 layers of {REAL_STATE.mamba_n_heads} heads x "
        f"{REAL_STATE.mamba_d_head} x {REAL_STATE.mamba_d_state} state ({state_mb:.1f} MB live "
        f"state per session) + {REAL_STATE.num_attn_layers} attention layer, float32, on "
        f"{device} (threads={torch.get_num_threads()}); {repeats} repetition(s): median (min–max)"
    )
    gb = [c["bytes"] / 1e6 for c in copies]
    print(
        f"\n1. {BATCH} sessions of {HISTORY} tokens ({statistics.median(gb):.0f} MB) in one batch"
    )
    table = Table("copy", "GB/s", "vs plain copy")
    plain_rate = [c["plain"] for c in copies]
    for name in ("park", "restore", "plain"):
        rate = [c[name] for c in copies]
        table.add(
            name, Spread.of(r / 1e9 for r in rate).format(".2f"), ratios(rate, plain_rate).format()
        )
    table.print()

    print("\n2. time to first token of a session with a history")
    table = Table("history", "re-prefill ms", "parked: restore + 1 token ms", "restore faster by")
    for h in histories:
        pre, res = ([p[i] for p in ttft[h]] for i in (0, 1))
        table.add(
            f"{h:,}",
            Spread.of(x * 1e3 for x in pre).format(",.0f"),
            Spread.of(x * 1e3 for x in res).format(",.1f"),
            ratios(pre, res).format(".0f") + "x",
        )
    table.print()

    print(f"\n3. decode of 8 active sessions ({args.new} new tokens each), tiny-bamba")
    table = Table("sessions parked", "decode tok/s", "vs none parked", "Python calls per step")
    for n in parked_counts:
        table.add(
            n,
            Spread.of(rates[n]).format(",.0f"),
            ratios(rates[n], rates[0]).format(),
            f"{calls[n]:,.0f}",
        )
    table.print()

    print(f"\n4. sessions one replica holds, {GPU_SESSIONS} GPU sessions of this model")
    table = Table("", "sessions held", "GPU state MB", "host state MB")
    for name, (held, gpu, host) in (("without parking", plain), ("with parking", parking)):
        table.add(name, held, f"{gpu / 1e6:,.0f}", f"{host / 1e6:,.0f}")
    table.print()

    held_ratio = Spread.of([parking[0] / plain[0]])
    print_goals(
        [
            Goal(
                "park bytes/s / plain copy",
                ratios([c["park"] for c in copies], plain_rate),
                GOAL_COPY,
            ),
            Goal(
                "restore bytes/s / plain copy",
                ratios([c["restore"] for c in copies], plain_rate),
                GOAL_COPY,
            ),
            Goal(
                "TTFT re-prefill / restore at 2,048",
                ratios(*([p[i] for p in ttft[2048]] for i in (0, 1))),
                GOAL_TTFT,
                unit="x",
                spec=".0f",
            ),
            Goal(
                "decode tok/s, 1,000 parked / none",
                ratios(rates[max(parked_counts)], rates[0]),
                GOAL_DECODE,
            ),
            Goal(
                "sessions held, with / without parking", held_ratio, GOAL_HELD, unit="x", spec=".1f"
            ),
        ]
    )


if __name__ == "__main__":
    main()
