"""Sampling of the next token: greedy rows in one op, seeded rows each with its own generator.

A request's generator is seeded from ``SamplingParams.seed`` when its turn starts, so the same
seed on the same session state gives the same tokens, whatever else is in the batch.

Sampling never fails a step: each row gets its token or a ``SamplingError`` that fails only its
own turn. A row whose logits are not finite (NaN or inf from the model) is refused rather than
sampled from garbage; temperatures below ``MIN_TEMPERATURE`` are greedy (``SamplingParams``), so
``logits / temperature`` cannot overflow. ``top_k`` keeps the k most likely tokens, then ``top_p``
the smallest set of those reaching p (the order transformers applies them in); ``top_k`` 1 is
greedy.
"""

from __future__ import annotations

import torch

from replica.api import ReplicaError
from replica.sessions.request import Req


class SamplingError(ReplicaError):
    """A row that could not be sampled; fails its turn (INTERNAL) and nothing else."""


def make_generator(req: Req) -> torch.Generator | None:
    if req.sampling.greedy:
        return None
    return torch.Generator().manual_seed(req.sampling.seed % 2**63)


def sample_row(
    logits: torch.Tensor,
    temperature: float,
    top_p: float,
    generator: torch.Generator,
    top_k: int = 0,
) -> int:
    probs = torch.softmax(logits.float().cpu() / temperature, dim=-1)
    if not bool(torch.isfinite(probs).all()):
        raise SamplingError(f"temperature {temperature} gave non-finite probabilities")
    if 0 < top_k < probs.numel() or 0.0 < top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True, stable=True)
        if 0 < top_k < probs.numel():
            sorted_probs[top_k:] = 0.0
            sorted_probs = sorted_probs / sorted_probs.sum()
        if 0.0 < top_p < 1.0:
            keep = sorted_probs.cumsum(-1) - sorted_probs < top_p  # smallest set reaching top_p
            sorted_probs = sorted_probs * keep
        choice = torch.multinomial(sorted_probs, 1, generator=generator)
        return int(order[choice])
    return int(torch.multinomial(probs, 1, generator=generator))


def sample(
    logits: torch.Tensor, reqs: list[Req], generators: dict[int, torch.Generator | None]
) -> list[int | SamplingError]:
    """Next token of each row of ``logits [B, vocab]`` for ``reqs[b]``, or why it has none."""
    tokens: list[int | SamplingError] = logits.argmax(dim=-1).tolist()
    finite = torch.isfinite(logits).all(dim=-1).tolist()
    for b, req in enumerate(reqs):
        if not finite[b]:
            tokens[b] = SamplingError("the model produced non-finite logits for this turn")
            continue
        gen = generators.get(req.rid)
        if gen is None:
            continue
        try:
            s = req.sampling
            tokens[b] = sample_row(logits[b], s.temperature, s.top_p, gen, s.top_k)
        except (RuntimeError, SamplingError) as exc:  # torch raises RuntimeError on bad input
            tokens[b] = exc if isinstance(exc, SamplingError) else SamplingError(str(exc))
    return tokens
