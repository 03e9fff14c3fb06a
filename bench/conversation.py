"""A 20-turn conversation through the OpenAI-compatible front door: time to first token per turn
when each turn continues the held state (Responses, ``previous_response_id``) against a client
that resends the whole history every turn (Chat Completions: the server prefills it again, as
any server without exact reuse of hybrid state must when its prefix cache misses).

Each turn adds ~100 new tokens of user text and asks for 16 tokens (``ignore_eos``); both
conversations run side by side on one cluster, turn by turn (A then B), ``--repeats`` times;
the client is the official ``openai`` SDK, streaming, in this process. The checkpoint is a
random Bamba of ~11 M parameters (``bench_bamba``) with a BPE tokenizer and a chat template
(tests.support.chat_peer's): on a real model the prefill the state saves costs far more.

Run: ``python -m bench.conversation [--quick]``. Goals: TTFT at turn 20 <= 1.3x turn 2 with
state; resend ÷ state at turn 20 >= 5x.
"""

from __future__ import annotations

import asyncio
import random
import tempfile
import time
from pathlib import Path

import openai

from bench.harness import cli
from bench.harness.cluster import local_cluster
from bench.harness.report import Goal, Table, print_goals
from bench.harness.stats import Spread, ratios
from tests.support.bpe_peer import CORPUS

TURNS, NEW_TOKENS, OUTPUT = 20, 100, 16
GOAL_FLAT, GOAL_RATIO = 1.3, 5.0


def bench_bamba():
    """A random Bamba large enough that prefill, not the serving path, is what a turn costs on
    a CPU (hidden 384, 6 layers, 2 of them attention; ~11 M parameters)."""
    import torch
    import transformers

    from tests.support.hf_peer import VOCAB

    torch.manual_seed(0)
    config = transformers.BambaConfig(
        vocab_size=VOCAB, hidden_size=384, intermediate_size=1024, num_hidden_layers=6,
        num_attention_heads=6, num_key_value_heads=2, attn_layer_indices=[2, 5],
        mamba_n_heads=12, mamba_d_head=64, mamba_n_groups=1, mamba_d_state=64,
        mamba_chunk_size=64, initializer_range=0.05, eos_token_id=None, pad_token_id=None,
        bos_token_id=None,
    )  # fmt: skip
    return transformers.BambaForCausalLM(config).eval()


def user_text(rng: random.Random, tokens: int) -> str:
    words = " ".join(CORPUS).split()
    return " ".join(rng.choice(words) for _ in range(tokens // 2))  # ~2 tokens a word


async def first_token_s(stream) -> tuple[float, str, str | None]:
    """Seconds to the first text delta of a streamed answer, its whole text, and the id of the
    response it made (Responses' last event carries it)."""
    started, first, text, made = time.perf_counter(), None, "", None
    async for event in stream:
        delta = getattr(event, "delta", None)
        if getattr(event, "choices", None):
            delta = event.choices[0].delta.content
        if isinstance(delta, str) and delta:
            first = first or time.perf_counter() - started
            text += delta
        response = getattr(event, "response", None)
        if response is not None:
            made = response.id
    return first if first is not None else time.perf_counter() - started, text, made


async def conversation(client, model: str, seed: int, turns: int) -> list[tuple[float, float]]:
    """Per turn: TTFT continuing the held state, TTFT resending the whole history."""
    rng = random.Random(seed)
    history: list[dict[str, str]] = []
    previous, out = None, []
    extra = {"ignore_eos": True}
    for _ in range(turns):
        message = user_text(rng, NEW_TOKENS)
        stream = await client.responses.create(
            model=model, input=message, previous_response_id=previous,
            max_output_tokens=OUTPUT, stream=True, extra_body=extra,
        )  # fmt: skip
        ttft_state, reply, previous = await first_token_s(stream)
        history.append({"role": "user", "content": message})
        stream = await client.chat.completions.create(
            model=model, messages=history, max_tokens=OUTPUT, stream=True, extra_body=extra
        )
        ttft_resend, _, _ = await first_token_s(stream)
        history.append({"role": "assistant", "content": reply})
        out.append((ttft_state, ttft_resend))
    return out


async def main(argv=None) -> None:
    p = cli.parser(__doc__)
    args = cli.parse(p, argv)
    turns = 6 if args.quick else TURNS
    from tests.support.chat_peer import save_chat_peer

    with tempfile.TemporaryDirectory() as tmp:
        save_chat_peer(Path(tmp), seed=5, model=bench_bamba())
        flags = dict(model_path=tmp, replicas=1, threads=1, max_sessions=64,
                     max_context=4096, kv_tokens=64 * 4096, page_size=16)  # fmt: skip
        async with local_cluster(**flags) as cluster:
            url = cluster.server.front.http_url
            client = openai.AsyncOpenAI(base_url=url, api_key="none", max_retries=0)
            model = (await client.models.list()).data[0].id
            await conversation(client, model, seed=99, turns=2)  # warm-up
            runs = [await conversation(client, model, seed=r, turns=turns)
                    for r in range(args.repeats)]  # fmt: skip
    print(f"\n{turns}-turn conversation, ~{NEW_TOKENS} new tokens a turn, {OUTPUT} out; "
          f"TTFT in ms, median (min–max) over {args.repeats} run(s)")  # fmt: skip
    table = Table("turn", "state (previous_response_id)", "resend history", "resend ÷ state")
    for t in range(turns):
        state = [run[t][0] * 1000 for run in runs]
        resend = [run[t][1] * 1000 for run in runs]
        table.add(t + 1, Spread.of(state).format(".1f"), Spread.of(resend).format(".1f"),
                  ratios(resend, state).format())  # fmt: skip
    table.print()
    last, second = turns - 1, 1
    flat = ratios([r[last][0] for r in runs], [r[second][0] for r in runs])
    gain = ratios([r[last][1] for r in runs], [r[last][0] for r in runs])
    print_goals([
        Goal(f"state: TTFT turn {turns} ÷ turn 2", flat, GOAL_FLAT, at_least=False),
        Goal(f"resend ÷ state at turn {turns}", gain, GOAL_RATIO),
    ])  # fmt: skip


if __name__ == "__main__":
    asyncio.run(main())
