"""The hybrid decoder: embedding, decoder layers of any mixer kind, final norm, LM head.

The model holds weights only. Per-sequence state lives in a :class:`LayerBuffers` passed to every
call; the engine addresses a sequence's state by mamba slot (conv + temporal state of every
recurrent layer) and by the token slots of its positions (K/V of every attention layer). How a
family's HF checkpoint maps onto these modules is in :mod:`replica.model.families`.
"""

from __future__ import annotations

import torch
from torch import nn

from replica.model.batch import DecodeBatch, ExtendBatch
from replica.model.buffers import LayerBuffers
from replica.model.config import ModelConfig
from replica.model.decoder_layer import DecoderLayer
from replica.model.layers import RMSNorm, RotaryEmbedding
from replica.model.state_rows import StateRows


class HybridModel(nn.Module):
    """A causal LM over externally owned state (see the ``forward_*`` methods)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        mamba_layers, attn_layers = cfg.mamba_layer_indices, cfg.attn_layer_indices
        self.layers = nn.ModuleList(
            DecoderLayer(
                cfg,
                i,
                mamba_layers.index(i) if i in mamba_layers else None,
                attn_layers.index(i) if i in attn_layers else None,
            )
            for i in range(cfg.num_hidden_layers)
        )
        self.final_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.norm_unit_offset)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.rotary = None
        if cfg.partial_rotary_factor > 0 and cfg.num_attn_layers:
            self.rotary = RotaryEmbedding(cfg.head_dim, cfg.partial_rotary_factor, cfg.rope_theta)

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed_tokens(ids)
        scale = self.cfg.multipliers.embedding
        return h * scale if scale != 1.0 else h

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(self.final_norm(h))
        scale = self.cfg.multipliers.logits
        return (logits * scale if scale != 1.0 else logits).float()

    def _rope(self, positions: torch.Tensor, dtype: torch.dtype):
        return (None, None) if self.rotary is None else self.rotary(positions, dtype)

    @torch.inference_mode()
    def forward_extend(
        self,
        input_ids: torch.Tensor,
        start_pos: int,
        mamba_slot: int,
        kv_slots: torch.Tensor,
        buffers: LayerBuffers,
        all_logits: bool = False,
    ) -> torch.Tensor:
        """Run one sequence's chunk of ``L`` new tokens and return logits (float32).

        ``input_ids [L]`` sit at absolute positions ``start_pos .. start_pos + L - 1``. The chunk
        continues from the recurrent state in ``mamba_slot`` and from the K/V at
        ``kv_slots[:start_pos]``; it writes its own K/V into ``kv_slots[start_pos:]`` and the
        updated recurrent state back into ``mamba_slot``. ``kv_slots`` has ``start_pos + L``
        entries. When ``start_pos == 0`` the slot's previous contents are ignored (the state is
        taken as zero), so the caller need not clear a reused slot.

        Returns ``[L, vocab]`` when ``all_logits`` else ``[1, vocab]`` (the last position).
        Feeding a prompt in one chunk or in several gives the same logits up to float rounding.
        """
        slot = torch.tensor([mamba_slot], dtype=torch.long)
        logits = self.forward_extend_batch(
            [input_ids], [start_pos], slot, [kv_slots], buffers, all_logits=all_logits
        )
        return logits[0] if all_logits else logits

    @torch.inference_mode()
    def forward_extend_batch(
        self,
        input_ids: list[torch.Tensor],
        start_pos: list[int],
        mamba_slots: torch.Tensor,
        kv_slots: list[torch.Tensor],
        buffers: LayerBuffers,
        all_logits: bool = False,
    ) -> torch.Tensor:
        """:meth:`forward_extend` of ``B`` sequences' chunks in one forward; logits ``[B, vocab]``
        (``[B, L_max, vocab]`` when ``all_logits``, meaningless beyond each row's length).

        Sequence ``b`` has ``input_ids[b] [L_b]`` at positions ``start_pos[b] ..``, its state in
        the distinct slot ``mamba_slots[b]`` and its K/V slots in ``kv_slots[b]`` (``start_pos[b]
        + L_b`` entries), exactly as one :meth:`forward_extend` call; returns the logits of each
        sequence's last position. The chunks are right-padded to the longest; padding is masked
        out of attention and made inert in the recurrent mixers (zero time step / write strength),
        so each row equals its own :meth:`forward_extend` up to float rounding.
        """
        batch = ExtendBatch.build(input_ids, start_pos, mamba_slots, kv_slots, self.device)
        h = self._embed(batch.ids)
        cos, sin = self._rope(batch.positions, h.dtype)
        for layer in self.layers:
            h = layer.extend(h, batch, buffers, cos, sin)
        if not all_logits:
            h = h[torch.arange(h.shape[0], device=h.device), batch.lengths - 1]
        return self._logits(h)

    @torch.inference_mode()
    def forward_decode(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        mamba_slots: torch.Tensor,
        kv_slots: torch.Tensor,
        kv_lens: torch.Tensor,
        buffers: LayerBuffers,
        rows: StateRows | None = None,
        padding_slot: int | None = None,
    ) -> torch.Tensor:
        """One new token for each of ``B`` sequences; returns logits ``[B, vocab]`` (float32).

        Row ``b``: token ``input_ids[b]`` at position ``positions[b]``, state in the slot
        ``mamba_slots[b]``; ``kv_slots[b, :kv_lens[b]]`` are the slots of its positions
        ``0 .. kv_lens[b] - 1`` including the new token's (at ``kv_lens[b] - 1``, which must equal
        ``positions[b]``). Entries beyond ``kv_lens[b]`` are padding and may hold any value. The
        new K/V and the updated recurrent state are written back. All work is batched (no loop
        over sequences) and row-wise, so a row's logits do not depend on the rest of the batch.
        ``rows``: ``StateRows.build(buffers.ssm, mamba_slots)``, which a caller that runs the same
        batch again keeps (built here when not given). ``padding_slot``: the mamba slot that a
        padded batch's padding rows share (their rows leave its temporal state as it was); every
        other slot is distinct.
        """
        if rows is None:
            rows = StateRows.build(buffers.ssm, mamba_slots)
        batch = DecodeBatch.build(
            input_ids, positions, mamba_slots, kv_slots, kv_lens, rows, self.device, padding_slot
        )
        h = self._embed(batch.ids)
        cos, sin = self._rope(batch.positions, h.dtype)
        for layer in self.layers:
            h = layer.decode(h, batch, buffers, cos, sin)
        return self._logits(h)


# The name the engine and the Bamba-era tests know the model by.
