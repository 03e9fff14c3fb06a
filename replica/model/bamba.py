"""The Bamba hybrid decoder: embedding, Mamba2 / attention decoder layers, final norm, LM head.

The model holds weights only. Per-sequence state lives in a :class:`LayerBuffers` passed to every
call; the engine addresses a sequence's state by mamba slot (conv + SSM state) and by the token
slots of its positions (K/V). Module names mirror transformers' ``BambaForCausalLM`` without the
leading ``model.`` (see :mod:`replica.model.loader`).
"""

from __future__ import annotations

import torch
from torch import nn

from replica.model.attention import Attention
from replica.model.buffers import LayerBuffers
from replica.model.config import ModelConfig
from replica.model.layers import GatedMLP, RMSNorm, RotaryEmbedding
from replica.model.mamba2 import Mamba2Mixer


class DecoderLayer(nn.Module):
    """Pre-norm residual block: mixer (Mamba2 or attention), then gated MLP.

    ``ordinal`` is the layer's index among the layers of its kind, i.e. its index into
    ``LayerBuffers.conv``/``ssm`` (mamba) or ``LayerBuffers.k``/``v`` (attention).
    """

    def __init__(self, cfg: ModelConfig, layer_idx: int, ordinal: int) -> None:
        super().__init__()
        self.is_attention = layer_idx in cfg.attn_layer_indices
        self.ordinal = ordinal
        self.input_layernorm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.pre_ff_layernorm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.feed_forward = GatedMLP(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        if self.is_attention:
            self.self_attn = Attention(cfg)
        else:
            self.mamba = Mamba2Mixer(cfg)

    def finish(self, residual: torch.Tensor, mixed: torch.Tensor) -> torch.Tensor:
        h = residual + mixed
        return h + self.feed_forward(self.pre_ff_layernorm(h))


class BambaModel(nn.Module):
    """Bamba causal LM over externally owned state (see the two ``forward_*`` methods)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        ordinals = {True: 0, False: 0}
        layers = []
        for i in range(cfg.num_hidden_layers):
            attn = i in cfg.attn_layer_indices
            layers.append(DecoderLayer(cfg, i, ordinals[attn]))
            ordinals[attn] += 1
        self.layers = nn.ModuleList(layers)
        self.final_layernorm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.partial_rotary_factor, cfg.rope_theta)

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

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
        continues from the conv/SSM state in ``mamba_slot`` and from the K/V at
        ``kv_slots[:start_pos]``; it writes its own K/V into ``kv_slots[start_pos:]`` and the
        updated conv/SSM state back into ``mamba_slot``. ``kv_slots`` has ``start_pos + L``
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
        out of attention and made inert in the Mamba2 mixers (see :meth:`Mamba2Mixer.extend`),
        so each row equals its own :meth:`forward_extend` up to float rounding.
        """
        batch = len(input_ids)
        if batch == 0 or len(start_pos) != batch or len(kv_slots) != batch:
            raise ValueError("forward_extend_batch needs one start_pos and kv_slots per sequence")
        if int(mamba_slots.shape[0]) != batch:
            raise ValueError(f"mamba_slots has {mamba_slots.shape[0]} entries, expected {batch}")
        for ids, start, slots in zip(input_ids, start_pos, kv_slots, strict=True):
            if ids.shape[0] == 0:
                raise ValueError("forward_extend_batch needs at least one token per sequence")
            if slots.shape[0] != start + ids.shape[0]:
                raise ValueError(
                    f"kv_slots has {slots.shape[0]} entries, expected start_pos + L = "
                    f"{start + ids.shape[0]}"
                )
        device = self.device
        pad = torch.nn.utils.rnn.pad_sequence
        ids = pad([t.to(device=device, dtype=torch.long) for t in input_ids], batch_first=True)
        slots = [t.to(device=device, dtype=torch.long) for t in kv_slots]
        kv = pad(slots, batch_first=True)  # padding: slot 0, masked below
        new_slots = torch.cat([t[s:] for t, s in zip(slots, start_pos, strict=True)])
        lengths = torch.tensor([t.shape[0] for t in input_ids], device=device)
        starts = torch.tensor(start_pos, dtype=torch.long, device=device)
        mamba_slots = mamba_slots.to(device=device, dtype=torch.long)
        offsets = torch.arange(ids.shape[1], device=device)
        real = offsets[None, :] < lengths[:, None]  # [B, L]
        positions = starts[:, None] + offsets[None, :]  # [B, L]
        keys = torch.arange(kv.shape[1], device=device)[None, None, :]
        valid = (keys <= positions[..., None]) & (keys < (starts + lengths)[:, None, None])
        fresh = starts == 0
        h = self.embed_tokens(ids)
        cos, sin = self.rotary(positions, h.dtype)
        for layer in self.layers:
            x = layer.input_layernorm(h)
            o = layer.ordinal
            if layer.is_attention:
                x = layer.self_attn.extend(
                    x, cos, sin, buffers.k[o], buffers.v[o], kv, real, new_slots, valid
                )
            else:
                x = layer.mamba.extend(
                    x, lengths, buffers.conv[o], buffers.ssm[o], mamba_slots, fresh
                )
            h = layer.finish(h, x)
        if not all_logits:
            h = h[torch.arange(batch, device=device), lengths - 1]
        return self.lm_head(self.final_layernorm(h)).float()

    @torch.inference_mode()
    def forward_decode(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        mamba_slots: torch.Tensor,
        kv_slots: torch.Tensor,
        kv_lens: torch.Tensor,
        buffers: LayerBuffers,
    ) -> torch.Tensor:
        """One new token for each of ``B`` sequences; returns logits ``[B, vocab]`` (float32).

        Row ``b``: token ``input_ids[b]`` at position ``positions[b]``, state in the distinct
        slot ``mamba_slots[b]``; ``kv_slots[b, :kv_lens[b]]`` are the slots of its positions
        ``0 .. kv_lens[b] - 1`` including the new token's (at ``kv_lens[b] - 1``, which must equal
        ``positions[b]``). Entries beyond ``kv_lens[b]`` are padding and may hold any value. The
        new K/V and the updated conv/SSM state are written back. All work is batched (no loop
        over sequences) and row-wise, so a row's logits do not depend on the rest of the batch.
        """
        device = self.device
        input_ids = input_ids.to(device)
        positions = positions.to(device)
        mamba_slots = mamba_slots.to(device=device, dtype=torch.long)
        kv_slots = kv_slots.to(device=device, dtype=torch.long)
        kv_lens = kv_lens.to(device=device, dtype=torch.long)
        valid = torch.arange(kv_slots.shape[1], device=device)[None, :] < kv_lens[:, None]
        new_slots = kv_slots.gather(1, (kv_lens - 1)[:, None])[:, 0]
        kv_slots = kv_slots.masked_fill(~valid, 0)
        h = self.embed_tokens(input_ids)
        cos, sin = self.rotary(positions, h.dtype)
        for layer in self.layers:
            x = layer.input_layernorm(h)
            o = layer.ordinal
            if layer.is_attention:
                x = layer.self_attn.decode(
                    x, cos, sin, buffers.k[o], buffers.v[o], kv_slots, new_slots, valid
                )
            else:
                x = layer.mamba.decode(x, buffers.conv[o], buffers.ssm[o], mamba_slots)
            h = layer.finish(h, x)
        return self.lm_head(self.final_layernorm(h)).float()
