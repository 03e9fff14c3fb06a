"""One pre-norm residual block of the hybrid decoder: a token mixer, then a feed-forward.

Either part may be absent (a Nemotron-H layer has one or the other). The mixer is Mamba2,
gated DeltaNet, attention, or Mamba2 and attention side by side on the same normed input
(Falcon-H1, their outputs summed). Each block's output is scaled by the residual multiplier
before it joins the residual stream.
"""

from __future__ import annotations

import torch
from torch import nn

from replica.model.attention import Attention
from replica.model.batch import DecodeBatch, ExtendBatch
from replica.model.buffers import LayerBuffers
from replica.model.config import ModelConfig
from replica.model.deltanet import GatedDeltaNet
from replica.model.layers import RMSNorm
from replica.model.mamba2 import Mamba2Mixer
from replica.model.mlp import MLP
from replica.model.moe import MoE


class DecoderLayer(nn.Module):
    """Layer ``layer_idx`` of ``cfg``. ``mamba_ordinal`` / ``attn_ordinal``: its index among the
    layers with a recurrent mixer / with attention, i.e. into ``LayerBuffers.conv``/``ssm`` and
    ``LayerBuffers.k``/``v`` (None where it has none)."""

    def __init__(
        self, cfg: ModelConfig, layer_idx: int, mamba_ordinal: int | None, attn_ordinal: int | None
    ) -> None:
        super().__init__()
        mixer, ffn = cfg.layer_mixers[layer_idx], cfg.layer_ffns[layer_idx]
        self.mamba_ordinal, self.attn_ordinal = mamba_ordinal, attn_ordinal
        m = cfg.multipliers
        self.residual_scale = m.residual
        self.ssm_in, self.ssm_out = m.ssm_in, m.ssm_out
        self.attn_in, self.attn_out = m.attention_in, m.attention_out

        def norm() -> RMSNorm:
            return RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, unit_offset=cfg.norm_unit_offset)

        # the feed-forward is built before the mixers so that seeded inits draw in Bamba's order
        self.input_norm = norm() if mixer != "none" else None
        self.ffn_norm = norm() if ffn != "none" else None
        self.mlp = self.moe = None
        if ffn == "mlp":
            self.mlp = MLP(
                cfg.hidden_size,
                cfg.intermediate_size,
                cfg.hidden_act,
                cfg.mlp_gated,
                cfg.mlp_bias,
                m.mlp_gate,
                m.mlp_down,
            )
        elif ffn == "moe":
            self.moe = MoE(cfg.hidden_size, cfg.moe, cfg.hidden_act, cfg.mlp_gated, cfg.mlp_bias)
        self.mamba = Mamba2Mixer(cfg) if mixer.startswith("mamba2") else None
        self.deltanet = GatedDeltaNet(cfg) if mixer == "deltanet" else None
        self.attn = Attention(cfg) if mixer.endswith("attention") else None

    def _residual(self, h: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        return h + (out * self.residual_scale if self.residual_scale != 1.0 else out)

    def _ffn(self, h: torch.Tensor) -> torch.Tensor:
        if self.ffn_norm is None:
            return h
        x = self.ffn_norm(h)
        return self._residual(h, self.mlp(x) if self.mlp is not None else self.moe(x))

    @staticmethod
    def _scaled(x: torch.Tensor, scale: float) -> torch.Tensor:
        return x * scale if scale != 1.0 else x

    def extend(
        self,
        h: torch.Tensor,
        batch: ExtendBatch,
        buffers: LayerBuffers,
        cos: torch.Tensor | None,
        sin: torch.Tensor | None,
    ) -> torch.Tensor:
        """The layer over right-padded chunks ``h [B, L, hidden]`` (see ``ExtendBatch``)."""
        if self.input_norm is not None:
            x = self.input_norm(h)
            out = None
            o = self.mamba_ordinal
            if self.mamba is not None:
                out = self.mamba.extend(
                    self._scaled(x, self.ssm_in),
                    buffers.conv[o],
                    buffers.ssm[o],
                    batch.lengths,
                    batch.mamba_slots,
                    batch.fresh,
                )
                out = self._scaled(out, self.ssm_out)
            if self.deltanet is not None:
                out = self.deltanet.extend(
                    x,
                    buffers.conv[o],
                    buffers.ssm[o],
                    batch.lengths,
                    batch.mamba_slots,
                    batch.fresh,
                )
            if self.attn is not None:
                j = self.attn_ordinal
                a = self.attn.extend(
                    self._scaled(x, self.attn_in),
                    cos,
                    sin,
                    buffers.k[j],
                    buffers.v[j],
                    batch.kv,
                    batch.real,
                    batch.new_slots,
                    None if batch.causal else batch.valid,
                )
                a = self._scaled(a, self.attn_out)
                out = a if out is None else out + a
            h = self._residual(h, out)
        return self._ffn(h)

    def decode(
        self,
        h: torch.Tensor,
        batch: DecodeBatch,
        buffers: LayerBuffers,
        cos: torch.Tensor | None,
        sin: torch.Tensor | None,
    ) -> torch.Tensor:
        """The layer for one token per row, ``h [B, hidden]`` (see ``DecodeBatch``)."""
        if self.input_norm is not None:
            x = self.input_norm(h)
            out = None
            o = self.mamba_ordinal
            rows = None if batch.rows is None or o is None else batch.rows.ssm[o]
            if self.mamba is not None:
                out = self.mamba.decode(
                    self._scaled(x, self.ssm_in),
                    buffers.conv[o],
                    buffers.ssm[o],
                    batch.mamba_slots,
                    rows,
                    batch.inert,
                )
                out = self._scaled(out, self.ssm_out)
            if self.deltanet is not None:
                out = self.deltanet.decode(
                    x, buffers.conv[o], buffers.ssm[o], batch.mamba_slots, rows, batch.inert
                )
            if self.attn is not None:
                j = self.attn_ordinal
                a = self.attn.decode(
                    self._scaled(x, self.attn_in),
                    cos,
                    sin,
                    buffers.k[j],
                    buffers.v[j],
                    batch.kv,
                    batch.new_slots,
                    batch.valid,
                )
                a = self._scaled(a, self.attn_out)
                out = a if out is None else out + a
            h = self._residual(h, out)
        return self._ffn(h)
