"""Runs the model over a step's turns, reading and writing state through the pools.

The runner translates turns into the model's tensors: the KV slots of each position come from
``req_to_token``, the mamba state from the turn's ``mamba_pool_idx``. It advances ``folded_len``
only after the forward that folded the tokens in has returned.
"""

from __future__ import annotations

import torch

from replica.api import StepStats
from replica.engine.decode_graphs import DecodeGraphs
from replica.engine.decode_inputs import DecodeInputs
from replica.engine.decode_shapes import DecodeShapes
from replica.model import HybridModel
from replica.pools.hybrid_pool import HybridReqToTokenPool
from replica.sessions.request import Req


class ModelRunner:
    def __init__(
        self, model: HybridModel, pool: HybridReqToTokenPool, cuda_graphs: bool, pad: bool
    ) -> None:
        """``cuda_graphs``: run decode steps as CUDA graphs where they can run (``DecodeGraphs``);
        ``pad``: pad decode batches to fixed shapes where graphs do not run too (tests)."""
        self.model = model
        self.pool = pool
        self.buffers = pool.buffers
        self.device = pool.req_to_token.device
        rows, context = pool.config.max_sessions, pool.config.max_context
        padded = DecodeShapes.padded(rows, context)
        self.graphs = DecodeGraphs.build(model, pool, padded, cuda_graphs)
        self.shapes = padded if self.graphs is not None or pad else DecodeShapes.exact(context)
        self.scratch = (pool.scratch_row, pool.mamba_pool.scratch_slot)
        self.prefilled_tokens = 0  # input tokens folded in by extend_batch, all turns so far
        # forwards that returned, and their rows (``step_stats``)
        self.decode_steps = self.decode_rows = self.prefill_steps = self.prefill_chunks = 0
        self._decoding: DecodeInputs | None = None  # the decode batch of the last step

    def extend_batch(self, chunks: list[tuple[Req, int]]) -> torch.Tensor:
        """Fold the next ``n`` input tokens of each ``(req, n)`` in one forward; logits of each
        chunk's last token ``[B, vocab]``."""
        ids, starts, kv_slots = [], [], []
        for req, n in chunks:
            first, start = req.turn_folded, req.folded_len
            ids.append(torch.tensor(req.input_ids[first : first + n], dtype=torch.long))
            starts.append(start)
            kv_slots.append(self.pool.req_to_token[req.slots.req_pool_idx, : start + n])
        mamba = torch.tensor([req.slots.mamba_pool_idx for req, _ in chunks], dtype=torch.long)
        logits = self.model.forward_extend_batch(ids, starts, mamba, kv_slots, self.buffers)
        for req, n in chunks:
            req.folded_len += n
        self.prefilled_tokens += sum(n for _, n in chunks)
        self.prefill_steps += 1
        self.prefill_chunks += len(chunks)
        return logits

    def decode(self, reqs: list[Req]) -> torch.Tensor:
        """Fold each turn's last generated token; logits ``[B, vocab]`` (with CUDA graphs, valid
        until the next decode). The batch's index tensors are kept while its turns are the same
        (``DecodeInputs``); with padding the forward runs the batch's padded shape."""
        inputs = self._decoding
        if inputs is None or not inputs.same(reqs):
            inputs = self._decoding = DecodeInputs(
                reqs, self.buffers.ssm, self.shapes, self.scratch, self.device
            )
        ids = inputs.ids(reqs)
        kv = self.pool.req_to_token[inputs.rows, : inputs.columns]
        if self.graphs is not None and self.graphs.serves():
            logits = self.graphs.forward(ids, inputs.positions, inputs.mamba_slots, kv)
        else:
            logits = self.model.forward_decode(
                ids,
                inputs.positions,
                inputs.mamba_slots,
                kv,
                inputs.positions + 1,
                self.buffers,
                inputs.state_rows,
                self.scratch[1] if inputs.pad else None,
            )
        inputs.advance()
        for req in reqs:
            req.folded_len += 1
        self.decode_steps += 1
        self.decode_rows += len(reqs)
        return logits[: len(reqs)] if inputs.pad else logits

    def step_stats(self) -> StepStats:
        """The forwards that returned so far, and their rows."""
        return StepStats(
            self.decode_steps, self.decode_rows, self.prefill_steps, self.prefill_chunks
        )
