"""Sampling of the next token: greedy rows in one op, seeded rows each with its own generator.

A request's generator is seeded from ``SamplingParams.seed`` when its turn starts, so the same
seed on the same session state gives the same tokens, whatever else is in the batch.
"""

from __future__ import annotations

import torch

from replica.sessions.request import Req


def make_generator(req: Req) -> torch.Generator | None:
    if req.sampling.greedy:
        return None
    return torch.Generator().manual_seed(req.sampling.seed % 2**63)


def sample_row(
    logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator
) -> int:
    probs = torch.softmax(logits.float().cpu() / temperature, dim=-1)
    if 0.0 < top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        keep = sorted_probs.cumsum(-1) - sorted_probs < top_p  # the smallest set reaching top_p
        sorted_probs = sorted_probs * keep
        choice = torch.multinomial(sorted_probs, 1, generator=generator)
        return int(order[choice])
    return int(torch.multinomial(probs, 1, generator=generator))


def sample(
    logits: torch.Tensor, reqs: list[Req], generators: dict[int, torch.Generator | None]
) -> list[int]:
    """Next token of each row of ``logits [B, vocab]`` for ``reqs[b]``."""
    tokens = logits.argmax(dim=-1).tolist()
    for b, req in enumerate(reqs):
        gen = generators.get(req.rid)
        if gen is not None:
            tokens[b] = sample_row(logits[b], req.sampling.temperature, req.sampling.top_p, gen)
    return tokens
