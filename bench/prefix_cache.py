"""Time to first token of a new session whose prefix a replica has cached, against a cold one.

One engine over tiny-bamba, on the CPU or ``--device cuda``. A first session folds a 2,048-token
prefix ``P`` in and ends its turn there, which caches its state (as a conversation's previous
request leaves it). Then, side by side in one run, the two kinds taking turns, new sessions are
opened as the OpenAI front door opens them (``prefix_ids = P``, then the turn of one more token,
greedy, one new token):

- cached: the new session starts from the cached state of ``P`` and prefills 1 token;
- cold: the same open on the same engine with a prefix no cached state begins (``P`` with its
  first token changed; what the cold session itself leaves cached is evicted after it), so the
  new session prefills all 2,049 tokens.
TTFT is from the open to the first token (the open's own cost included). Also reported: the
tokens each prefilled (the runner's count) and the cache's reused-token count.
Figures: median (min–max) over repetitions.

Run: ``python -m bench.prefix_cache [--quick]``. Goal: cold / cached TTFT >= 20x.
"""

from __future__ import annotations

import statistics
import time

import torch

from bench.decode import sync
from bench.harness import cli
from bench.harness.report import Goal, Table, print_goals
from bench.harness.stats import Spread, ratios
from replica.api import SamplingParams
from replica.config import PoolConfig, ReplicaConfig
from replica.engine.engine import Engine
from replica.model import build_tiny_bamba

PREFIX = 2048
GOAL = 20.0
ONE_TOKEN = SamplingParams(max_new_tokens=1)


def make_engine(device: str) -> Engine:
    pools = PoolConfig(
        max_sessions=8, kv_tokens=8 * (PREFIX + 64), max_context=PREFIX + 64, page_size=16,
        max_cached_states=8, device=device,
    )  # fmt: skip
    _, model, tokenizer = build_tiny_bamba(seed=0)
    config = ReplicaConfig(pools=pools, session_checkpoints=False, strict=True)
    return Engine(config, model.to(device), tokenizer)


def first_token(engine: Engine, session_id: str, prefix: list[int], last: int) -> float:
    """Seconds from the open (with ``prefix``) to the first token of the turn ``[last]``."""
    started = time.perf_counter()
    engine.open_session(session_id, prefix_ids=prefix)
    req = engine.submit(session_id, [last], ONE_TOKEN)
    while not req.output_ids:
        engine.step()
    sync(engine.config.pools.device)
    took = time.perf_counter() - started
    engine.take_events()
    engine.close_session(session_id)
    return took


def measure(device: str, rounds: int, seed: int) -> dict[str, float]:
    engine = make_engine(device)
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, 256, (PREFIX + 1,), generator=gen).tolist()
    prefix, last = prompt[:-1], prompt[-1]
    engine.open_session("primer")  # its turn's end leaves the state of ``prefix`` cached
    engine.submit("primer", prefix, SamplingParams(max_new_tokens=0))
    while engine.has_work:
        engine.step()
    engine.take_events()
    engine.close_session("primer")
    cold_prefix = [(prefix[0] + 1) % 256, *prefix[1:]]
    cached, cold, prefilled = [], [], {"cached": [], "cold": []}
    for i in range(rounds + 1):  # the first of each is a warm-up
        for kind, ids, times in (("cached", prefix, cached), ("cold", cold_prefix, cold)):
            before = engine.runner.prefilled_tokens
            times.append(first_token(engine, f"{kind}{i}", ids, last))
            prefilled[kind].append(engine.runner.prefilled_tokens - before)
        cache = engine.sessions.cache
        cache.evict(cache.entries[(*cold_prefix, last)])  # the next cold open starts cold too
    engine.check_invariant()
    return {
        "cached_s": statistics.median(cached[1:]),
        "cold_s": statistics.median(cold[1:]),
        "cached_prefilled": statistics.median(prefilled["cached"][1:]),
        "cold_prefilled": statistics.median(prefilled["cold"][1:]),
        "reused": engine.sessions.cache.reused_tokens_total / (rounds + 1),
    }


def main() -> None:
    parser = cli.parser(__doc__)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--rounds", type=int, default=None, help="opens of each kind")
    args = cli.parse(parser)
    torch.set_num_threads(1)
    rounds = args.rounds or (3 if args.quick else 9)
    runs = [measure(args.device, rounds, seed) for seed in range(args.repeats)]

    def spread(key: str, scale: float = 1.0) -> Spread:
        return Spread.of(r[key] * scale for r in runs)

    print(f"new session with a {PREFIX}-token prefix, tiny-bamba on {args.device}")
    table = Table("measure", "cached", "cold")
    table.add(
        "TTFT (ms)", spread("cached_s", 1e3).format(".2f"), spread("cold_s", 1e3).format(".2f")
    )
    table.add(
        "tokens prefilled",
        spread("cached_prefilled").format(".0f"),
        spread("cold_prefilled").format(".0f"),
    )
    table.add("prefix tokens from the cache", spread("reused").format(".0f"), "0")
    table.print()
    cold_over_cached = ratios([r["cold_s"] for r in runs], [r["cached_s"] for r in runs])
    print_goals([Goal("TTFT cold / cached", cold_over_cached, GOAL, unit="x")])


if __name__ == "__main__":
    main()
