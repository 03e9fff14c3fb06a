"""Runs the model over a step's turns, reading and writing state through the pools.

The runner translates turns into the model's tensors: the KV slots of each position come from
``req_to_token``, the mamba state from the turn's ``mamba_pool_idx``. It advances ``folded_len``
only after the forward that folded the tokens in has returned.
"""

from __future__ import annotations

import torch

from replica.engine.request import Req
from replica.model import BambaModel
from replica.pools.hybrid_pool import HybridReqToTokenPool


class ModelRunner:
    def __init__(self, model: BambaModel, pool: HybridReqToTokenPool) -> None:
        self.model = model
        self.pool = pool
        self.buffers = pool.buffers
        self.device = pool.req_to_token.device
        # False: each prefill chunk of a step runs as its own forward (the pre-batching path,
        # kept for comparison in tests)
        self.batch_prefill = True

    def extend(self, req: Req, n: int) -> torch.Tensor:
        """Fold the next ``n`` input tokens of ``req``; logits of the last one ``[1, vocab]``."""
        start = req.folded_len
        first = req.turn_folded
        ids = torch.tensor(req.input_ids[first : first + n], dtype=torch.long, device=self.device)
        kv_slots = self.pool.req_to_token[req.req_pool_idx, : start + n]
        logits = self.model.forward_extend(ids, start, req.mamba_pool_idx, kv_slots, self.buffers)
        req.folded_len += n
        return logits

    def extend_batch(self, chunks: list[tuple[Req, int]]) -> torch.Tensor:
        """Fold the next ``n`` input tokens of each ``(req, n)`` in one forward (one chunk alone
        goes through :meth:`extend`); logits of each chunk's last token ``[B, vocab]``."""
        if len(chunks) == 1 or not self.batch_prefill:
            return torch.cat([self.extend(req, n) for req, n in chunks])
        ids, starts, kv_slots = [], [], []
        for req, n in chunks:
            first, start = req.turn_folded, req.folded_len
            ids.append(torch.tensor(req.input_ids[first : first + n], dtype=torch.long))
            starts.append(start)
            kv_slots.append(self.pool.req_to_token[req.req_pool_idx, : start + n])
        mamba = torch.tensor([req.mamba_pool_idx for req, _ in chunks], dtype=torch.long)
        logits = self.model.forward_extend_batch(ids, starts, mamba, kv_slots, self.buffers)
        for req, n in chunks:
            req.folded_len += n
        return logits

    def decode(self, reqs: list[Req]) -> torch.Tensor:
        """Fold each turn's last generated token; logits ``[B, vocab]``."""
        positions = [req.folded_len for req in reqs]
        width = max(positions) + 1
        rows = torch.tensor(
            [req.req_pool_idx for req in reqs], dtype=torch.long, device=self.device
        )
        logits = self.model.forward_decode(
            torch.tensor([req.output_ids[-1] for req in reqs], dtype=torch.long),
            torch.tensor(positions, dtype=torch.long),
            torch.tensor([req.mamba_pool_idx for req in reqs], dtype=torch.long),
            self.pool.req_to_token[rows, :width],
            torch.tensor(positions, dtype=torch.long) + 1,
            self.buffers,
        )
        for req in reqs:
            req.folded_len += 1
        return logits
