"""Sampling of the next token of a whole batch in one call: greedy rows by argmax, the others by
the inverse CDF of their filtered distribution at one counter-based uniform draw per row.

Reproducible per turn: row ``b``'s uniform is a hash of its turn's seed and of the index of the
token it samples in that turn (``seeds``/``counters``), computed in integer tensor ops that give
the same bits on every device; so the same seed on the same session state gives the same tokens,
whatever else is in the batch, on whichever replica the turn runs.

Sampling never fails a step: a row whose logits are not finite (NaN or inf from the model), or
whose tempered probabilities are not, is marked bad (its turn fails, nothing else); temperatures
below ``MIN_TEMPERATURE`` are greedy (``SamplingParams``), so ``logits / temperature`` cannot
overflow. ``top_k`` keeps the k most likely tokens, then ``top_p`` the smallest set of those
reaching p (the order transformers applies them in); ``top_k`` 1 is greedy.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from replica.api import ReplicaError

_M32 = 0xFFFFFFFF


class SamplingError(ReplicaError):
    """A row that could not be sampled; fails its turn (INTERNAL) and nothing else."""


class RowSampling(NamedTuple):
    """The sampling parameters of ``B`` rows as tensors on the logits' device."""

    greedy: torch.Tensor  # [B] bool
    temperature: torch.Tensor  # [B] float32 (1 where greedy)
    top_p: torch.Tensor  # [B] float32 (1: off)
    top_k: torch.Tensor  # [B] long (0: off)
    seeds: torch.Tensor  # [B, 2] long, the seed's low and high 32 bits
    all_greedy: bool  # no row samples: argmax only
    filtered: bool  # some row has top_k or top_p on: the sorted path


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """``x * c mod 2**32`` for ``x < 2**32`` in int64 without overflow (16-bit halves of c)."""
    return (x * (c & 0xFFFF) + (((x * (c >> 16)) & 0xFFFF) << 16)) & _M32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (lowbias32) of ``x < 2**32``."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def uniforms(seeds: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """One uniform in [0, 1) (float64) per row from its seed halves ``[B, 2]`` and counter ``[B]``:
    a pure function of the three integers."""
    h = _mix32(seeds[:, 0] ^ 0x9E3779B9)
    h = _mix32(h ^ seeds[:, 1])
    h = _mix32(h ^ (counters & _M32))
    h = _mix32(h ^ ((counters >> 32) & _M32) ^ 0x85EBCA6B)
    return h.double() * 2.0**-32


def seed_halves(seed: int) -> tuple[int, int]:
    seed %= 2**64
    return seed & _M32, seed >> 32


def sample(
    logits: torch.Tensor, rows: RowSampling, counters: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Next token of each row of ``logits [B, vocab]`` (float32) and whether it is good ``[B]``
    (both on the logits' device); ``counters [B]`` index each row's token within its turn."""
    finite = torch.isfinite(logits).all(dim=-1)
    greedy_tokens = logits.argmax(dim=-1)
    if rows.all_greedy:
        return greedy_tokens, finite
    vocab = logits.shape[-1]
    probs = torch.softmax(logits / rows.temperature[:, None], dim=-1)
    good = finite & (rows.greedy | torch.isfinite(probs).all(dim=-1))
    probs = torch.where(good[:, None], probs, 0.0)  # bad rows: inert (their token is not used)
    if rows.filtered:  # which tokens each row keeps, found in sorted order, applied in place
        ranked, order = probs.sort(dim=-1, descending=True, stable=True)
        rank = torch.arange(vocab, device=logits.device)[None, :]
        use_k = (rows.top_k > 0) & (rows.top_k < vocab)
        keep = ~use_k[:, None] | (rank < rows.top_k[:, None])
        ranked = ranked * keep
        mass = ranked.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(ranked.dtype).tiny)
        ranked = torch.where(use_k[:, None], ranked / mass, ranked)  # top_p of what top_k kept
        use_p = (rows.top_p > 0.0) & (rows.top_p < 1.0)
        below = (ranked.cumsum(dim=-1) - ranked) < rows.top_p[:, None]  # smallest set reaching p
        keep = keep & (~use_p[:, None] | below)
        probs = probs * torch.zeros_like(keep).scatter_(1, order, keep)
    # the inverse CDF in vocabulary order, whatever the row's filters: a row's token depends on
    # its own distribution and draw only
    cdf = probs.double().cumsum(dim=-1)
    target = uniforms(rows.seeds, counters) * cdf[:, -1]
    choice = torch.searchsorted(cdf, target[:, None], right=True)[:, 0]
    last = (probs > 0).cumsum(dim=-1).argmax(dim=-1)  # the last token with probability
    choice = torch.minimum(choice, last)
    return torch.where(rows.greedy, greedy_tokens, choice), good
