"""Ours vs transformers on the same weights, per family: prefill, and decode at 1 and 16 sessions.

For each family a random transformers model of the bench size below is saved and loaded back by
``replica.model.load_model``, so both sides run the same weights in the same process. Measured:

* prefill tokens/s of one 512-token input: ours through the engine (one chunk, no new token),
  transformers' forward with its cache and only the last logits (what ``generate`` runs first);
* decode tokens/s of one session (a 32-token prompt) and of 16 sessions with prompts of 16..376
  tokens, ``--new`` tokens each: ours times the engine's decode-only steps; transformers runs
  ``generate`` with its cache (the 16 prompts left-padded into one batch), timed from its first
  generated token to its last (a stopping criterion notes the time of each step).

With 16 sessions it also measures a floor: the products of one of our decode steps (linear
layers, expert GEMMs, attention, the state's matrix products: ``bench.harness.products``)
replayed alone on the same weights. ``transformers' step / our products`` is the most that
making everything else free could give over transformers: where it exceeds the goal, the goal
is not bounded by the products, and what is left is the rest of our step (its other ops).
On CUDA ours runs as ``serve`` does, its decode steps as CUDA graphs; the products are recorded
from an engine without graphs (a graph's replay dispatches no op to record).

On the CPU, times are the CPU time of this process (``time.process_time``): the machine is
shared, and wall time would measure the neighbours too; with one torch thread and an idle machine
the two agree. On CUDA (``--device cuda``) they are wall time after a synchronize (the GPU's work
is no process's CPU time). Best of ``--rounds``. The ours/transformers ratios are printed per
family; goal: >= 1.0x at 1 session and >= 2x at 16. Greedy tokens of the single session must
agree on both sides in float32 (``--dtype``; in bf16 the two round differently).

Run: ``.venv/bin/python -m bench.vs_transformers`` (``--threads`` torch intra-op
threads, default 1; ``--device cuda --dtype bfloat16`` on a GPU).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import transformers

from bench.harness.bench_models import VOCAB, configs
from bench.harness.products import Products, StepFloor, record_products, small_op_seconds
from bench.harness.report import Table
from replica.api import SamplingParams
from replica.config import DTYPES, PoolConfig, ReplicaConfig, torch_dtype
from replica.engine.engine import Engine
from replica.model import load_model

MANY = 16
Clock = Callable[[], float]


def clock_for(device: str) -> Clock:
    """The process's CPU time on the CPU; on CUDA wall time once the GPU has finished."""
    if device != "cuda":
        return time.process_time

    def cuda_clock() -> float:
        torch.cuda.synchronize()
        return time.perf_counter()

    return cuda_clock


def best_of(rounds: int, fn, clock: Clock) -> float:
    """The smallest time of ``rounds`` calls of ``fn`` (after one warm-up call)."""
    fn()
    times = []
    for _ in range(rounds):
        start = clock()
        fn()
        times.append(clock() - start)
    return min(times)


def make_engine(
    path: str, sessions: int, device: str, dtype: torch.dtype, cuda_graphs: bool = True
) -> Engine:
    """An engine as ``serve`` runs it (on CUDA its decode steps are CUDA graphs unless
    ``cuda_graphs`` is off)."""
    cfg, model, tok = load_model(path, device=device, dtype=dtype)
    pools = PoolConfig(
        max_sessions=sessions,
        kv_tokens=sessions * 1024,
        max_context=1024,
        page_size=16,
        device=device,
    )
    config = ReplicaConfig(
        pools=pools, max_prefill_chunk=512, max_batch_tokens=8192, cuda_graphs=cuda_graphs
    )
    return Engine(config, model, tok)


def ours_prefill(engine: Engine, ids: list[int]) -> None:
    engine.open_session("prefill")
    engine.submit("prefill", ids, SamplingParams(max_new_tokens=0))
    while engine.has_work:
        engine.step()
    engine.close_session("prefill")


@contextmanager
def turns(engine: Engine, prompts: list[list[int]], new: int) -> Iterator[dict[int, str]]:
    """Sessions ``s0``, ``s1``, ... with ``prompts`` submitted for ``new`` tokens each; yields
    each turn's id -> its session, and runs the engine dry and closes them on the way out."""
    sids = [f"s{i}" for i in range(len(prompts))]
    rids = {}
    for sid, ids in zip(sids, prompts):
        engine.open_session(sid)
        rids[engine.submit(sid, ids, SamplingParams(max_new_tokens=new)).rid] = sid
    try:
        yield rids
    finally:
        while engine.has_work:
            engine.step()
        for sid in sids:
            engine.close_session(sid)


def ours_decode(
    engine: Engine, prompts: list[list[int]], new: int, clock: Clock
) -> tuple[float, list[int]]:
    """Sessions with ``prompts`` generate ``new`` tokens together: (decode-only seconds, tokens
    of the first session)."""
    seconds, first = 0.0, []
    with turns(engine, prompts, new) as rids:
        while engine.has_work:
            decode_only = not engine.scheduler.waiting and not engine.scheduler.plan().prefill
            start = clock()
            events = engine.step()
            if decode_only:
                seconds += clock() - start
            first += [t for e in events if rids[e.turn_id] == "s0" for t in e.token_ids]
    return seconds, first


def ours_products(engine: Engine, prompts: list[list[int]]) -> Products:
    """The products of one decode step of sessions with ``prompts`` (recorded while it runs)."""
    with turns(engine, prompts, 3):
        while engine.scheduler.waiting or engine.scheduler.plan().prefill:
            engine.step()
        return record_products(engine.runner.model, engine.step)


class StepClock(transformers.StoppingCriteria):
    """Notes the time at each generated token (generate asks it after every step)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.times: list[float] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
        self.times.append(self.clock())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


def hf_decode(hf, prompts: list[list[int]], new: int, clock: Clock) -> tuple[float, list[int]]:
    """Greedy ``generate`` of the left-padded batch: (seconds from the first generated token to
    the last, the first row's new tokens)."""
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=hf.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=hf.device)
    step_clock = StepClock(clock)
    with torch.no_grad():
        out = hf.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            pad_token_id=0,
            stopping_criteria=transformers.StoppingCriteriaList([step_clock]),
        )
    return step_clock.times[-1] - step_clock.times[0], out[0, width:].tolist()


def measure(
    family: str,
    hidden: int,
    rounds: int,
    new: int,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> tuple[dict[str, tuple[float, float]], StepFloor]:
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(configs(hidden)[family]()).eval()
    with tempfile.TemporaryDirectory() as path:
        hf.save_pretrained(path)
        engine = make_engine(path, MANY, device, dtype)
        # the products are recorded from an eager step: a CUDA graph's replay dispatches no op
        eager = (
            engine
            if engine.runner.graphs is None
            else make_engine(path, MANY, device, dtype, False)
        )
    hf = hf.to(device=device, dtype=dtype)
    clock = clock_for(device)
    gen = torch.Generator().manual_seed(1)

    def tokens(n: int) -> list[int]:
        return torch.randint(1, VOCAB, (n,), generator=gen).tolist()

    long = tokens(512)
    one = [tokens(32)]
    many = [tokens(16 + 24 * i) for i in range(MANY)]
    out = {}
    with torch.no_grad():
        ids = torch.tensor([long], device=device)
        hf_prefill = best_of(rounds, lambda: hf(ids, use_cache=True, logits_to_keep=1), clock)
    ours_prefill_s = best_of(rounds, lambda: ours_prefill(engine, long), clock)
    out["prefill"] = (512 / ours_prefill_s, 512 / hf_prefill)
    for label, prompts in (("decode x1", one), (f"decode x{MANY}", many)):
        ours_decode(engine, prompts, 4, clock)  # warm-up
        hf_decode(hf, prompts, 4, clock)
        ours = [ours_decode(engine, prompts, new, clock) for _ in range(rounds)]
        theirs = [hf_decode(hf, prompts, new, clock) for _ in range(rounds)]
        count = len(prompts) * (new - 1)  # the first token of each turn comes from its prefill
        out[label] = (count / min(s for s, _ in ours), count / min(s for s, _ in theirs))
        same = ours[0][1] == theirs[0][1] or len(prompts) > 1 or dtype != torch.float32
        assert same, f"{family}: tokens differ"
    products = ours_products(eager, many)
    ours_tps, theirs_tps = out[f"decode x{MANY}"]
    floor = StepFloor(
        MANY / ours_tps, products.seconds(rounds, clock), products.others, MANY / theirs_tps
    )
    return out, floor


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    families = list(configs(256))
    parser.add_argument("--families", nargs="+", default=families, choices=families)
    parser.add_argument("--hidden", type=int, default=256, help="hidden size (a multiple of 64)")
    parser.add_argument("--new", type=int, default=32, help="tokens generated per session")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="float32", choices=tuple(DTYPES))
    args = parser.parse_args()
    dtype = torch_dtype(args.dtype)
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    print(
        f"hidden {args.hidden}, {args.device}, {args.dtype}, torch threads {args.threads}; "
        "tokens/s, ours vs transformers"
    )
    header = ["family", "prefill 512", "decode x1", f"decode x{MANY}"]
    print(" | ".join(f"{h:<28}" if i else f"{h:<17}" for i, h in enumerate(header)))
    floors = Table(
        "family",
        "ours ms",
        "its products ms",
        "other ops",
        "x one op's cost ms",
        "transformers ms",
        "theirs / ours",
        "theirs / products",
    )
    op_seconds = small_op_seconds(args.device, clock_for(args.device))
    for family in args.families:
        row, floor = measure(family, args.hidden, args.rounds, args.new, args.device, dtype)
        cells = [f"{o:8.0f} vs {t:8.0f} ({o / t:4.2f}x)" for o, t in row.values()]
        print(" | ".join([f"{family:<17}", *cells]), flush=True)
        floors.add(family, *floor.cells(op_seconds))
    print(
        f"\na decode step of {MANY} sessions, and its products alone (linear layers, experts, "
        "attention, state products) replayed on the same weights; theirs / products: the most "
        f"that making every other op free could give; one small op costs {op_seconds * 1e6:.1f} us"
    )
    floors.print()


if __name__ == "__main__":
    main()
