"""What folding a step's prefill chunks and its decode rows into one forward could save, side by
side in one run, at the shapes ``bench.lifecycles`` runs through a gateway (a step of drifting
lifecycles: a few 8-token prompts to prefill while a few dozen sessions decode).

For each (prefill chunks, decode rows), the CPU time of:

- two forwards, as the engine runs such a step: ``forward_extend_batch`` of the chunks, then
  ``forward_decode`` of the rows;
- one forward of all of them in today's extend layout (right-padded: each decoding row is a
  chunk of one token, padded to the longest chunk);
- a decode forward of one row: the fixed cost of a forward, which is the most a packed layout
  (every row's tokens end to end, nothing padded) could save a step by folding the two forwards
  into one: the tokens' own work remains either way.

All on tiny-bamba, the benchmark cluster's model, with torch on one thread, best of ``--rounds``
rounds of ``--calls`` calls, the variants alternating. The bench checks that the padded forward
gives both forwards' logits (the same work). Run: ``python -m bench.mixed_step [--quick]``.
"""

from __future__ import annotations

import argparse

import torch

from bench.harness.report import Table
from bench.state_update import best_alternating
from replica.model import LayerBuffers, build_tiny

PROMPT_TOKENS = 8  # bench.lifecycles' prompt
CONTEXT = 12  # a decoding row's tokens so far (prompt and a few generated)
SPAN = CONTEXT + PROMPT_TOKENS + 1  # KV slots a row may use
SHAPES = ((7, 31), (3, 10), (20, 31))  # (prefill chunks, decode rows); the first is the gateway's


def step_variants(model, cfg, chunks: int, rows: int) -> dict[str, object]:
    """The step's calls: ``two`` forwards, ``padded`` one, and ``one row``'s decode forward;
    the first two, each on fresh buffers, are checked here to give the same logits."""
    fresh = [step_calls(model, cfg, chunks, rows) for _ in range(2)]
    with torch.inference_mode():
        torch.testing.assert_close(fresh[0]["padded"](), fresh[1]["two"](), rtol=1e-4, atol=1e-4)
    return step_calls(model, cfg, chunks, rows)


def step_calls(model, cfg, chunks: int, rows: int) -> dict[str, object]:
    """The three calls on buffers of their own (zeroed): chunk ``i`` prefills its prompt into
    mamba slot ``i + 1``, row ``r`` decodes its token at position ``CONTEXT``."""
    gen = torch.Generator().manual_seed(chunks * 100 + rows)
    seqs = chunks + rows
    buffers = LayerBuffers.allocate(cfg, mamba_slots=seqs + 1, kv_token_slots=1 + SPAN * seqs)
    prompts = [
        torch.randint(0, cfg.vocab_size, (PROMPT_TOKENS,), generator=gen) for _ in range(chunks)
    ]
    tokens = torch.randint(0, cfg.vocab_size, (rows,), generator=gen)
    kv = [torch.arange(1 + i * SPAN, 1 + (i + 1) * SPAN) for i in range(seqs)]
    chunk_kv = [s[:PROMPT_TOKENS] for s in kv[:chunks]]
    chunk_slots, row_slots = torch.arange(1, chunks + 1), torch.arange(chunks + 1, seqs + 1)
    row_kv = torch.stack([s[: CONTEXT + 1] for s in kv[chunks:]])
    positions, lengths = torch.full((rows,), CONTEXT), torch.full((rows,), CONTEXT + 1)

    def two() -> torch.Tensor:
        a = model.forward_extend_batch(prompts, [0] * chunks, chunk_slots, chunk_kv, buffers)
        b = model.forward_decode(tokens, positions, row_slots, row_kv, lengths, buffers)
        return torch.cat([a, b])

    def padded() -> torch.Tensor:
        return model.forward_extend_batch(
            prompts + [t[None] for t in tokens],
            [0] * chunks + [CONTEXT] * rows,
            torch.cat([chunk_slots, row_slots]),
            chunk_kv + list(row_kv),
            buffers,
        )

    def one_row() -> torch.Tensor:
        return model.forward_decode(
            tokens[:1], positions[:1], row_slots[:1], row_kv[:1], lengths[:1], buffers
        )

    return {"two": two, "padded": padded, "one row": one_row}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer calls and rounds")
    p.add_argument("--calls", type=int, default=None)
    p.add_argument("--rounds", type=int, default=None)
    args = p.parse_args(argv)
    calls = args.calls or (5 if args.quick else 30)
    rounds = args.rounds or (2 if args.quick else 5)
    torch.set_num_threads(1)
    cfg, model, _ = build_tiny("tiny-bamba")
    table = Table(
        "prefill chunks",
        "decode rows",
        "two forwards ms",
        "one padded ms",
        "padded ÷ two",
        "a forward's fixed cost ms",
        "packed saves at most",
    )
    for chunks, rows in SHAPES:
        best = best_alternating(step_variants(model, cfg, chunks, rows), calls, rounds)
        two, padded, fixed = best["two"] * 1e3, best["padded"] * 1e3, best["one row"] * 1e3
        table.add(
            str(chunks),
            str(rows),
            f"{two:.2f}",
            f"{padded:.2f}",
            f"{padded / two:.2f}",
            f"{fixed:.2f}",
            f"{fixed / two:.0%}",
        )
    print(
        f"\nA step of prefill chunks ({PROMPT_TOKENS} tokens) and decode rows: two forwards or one"
    )
    table.print()


if __name__ == "__main__":
    main()
