"""The per-sequence state tensors the model reads and writes, owned by the pools.

The model never allocates state: every forward call receives a :class:`LayerBuffers` and the slot
indices of the sequences it runs, gathers their state by index and scatters the update back.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from replica.model.config import ModelConfig


class LayerBuffers(NamedTuple):
    """State tensors of every layer, in layer order within each kind.

    * ``conv[i]``: ``[mamba_slots, *conv_state_shape]``, the last ``k - 1`` inputs of the causal
      conv1d of the ``i``-th layer with a recurrent mixer (Mamba2 or gated DeltaNet; ``i`` counts
      those layers only, so it is the ordinal in ``ModelConfig.mamba_layer_indices``).
    * ``ssm[i]``: ``[mamba_slots, *ssm_state_shape]``, its temporal state (Mamba2's SSM state
      ``[heads, head_dim, d_state]`` or DeltaNet's recurrent matrix ``[heads, k_dim, v_dim]``).
    * ``k[j]``, ``v[j]``: ``[kv_token_slots, num_key_value_heads, head_dim]``, the rotated keys
      and the values of the ``j``-th layer with attention, one row per token slot.

    The model casts on the way in and out, so the state dtypes may differ from the model's dtype
    (float32 SSM state with a bfloat16 model is the intended use).
    """

    conv: list[torch.Tensor]
    ssm: list[torch.Tensor]
    k: list[torch.Tensor]
    v: list[torch.Tensor]

    @classmethod
    def allocate(
        cls,
        cfg: ModelConfig,
        mamba_slots: int,
        kv_token_slots: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        state_dtype: torch.dtype = torch.float32,
    ) -> LayerBuffers:
        """Zeroed buffers (for tests and tools; the replica's pools own their own).

        ``dtype`` is the K/V dtype, ``state_dtype`` the conv and SSM state dtype.
        """
        conv = [
            torch.zeros((mamba_slots, *cfg.conv_state_shape), dtype=state_dtype, device=device)
            for _ in range(cfg.num_mamba_layers)
        ]
        ssm = [
            torch.zeros((mamba_slots, *cfg.ssm_state_shape), dtype=state_dtype, device=device)
            for _ in range(cfg.num_mamba_layers)
        ]
        kv_shape = (kv_token_slots, cfg.num_key_value_heads, cfg.head_dim)
        k = [torch.zeros(kv_shape, dtype=dtype, device=device) for _ in range(cfg.num_attn_layers)]
        v = [torch.zeros(kv_shape, dtype=dtype, device=device) for _ in range(cfg.num_attn_layers)]
        return cls(conv=conv, ssm=ssm, k=k, v=v)

    def check(self, cfg: ModelConfig) -> None:
        """Raise ``ValueError`` unless the layer counts and shapes are the ones ``cfg`` needs."""
        if len(self.conv) != cfg.num_mamba_layers or len(self.ssm) != cfg.num_mamba_layers:
            raise ValueError(
                f"LayerBuffers has {len(self.conv)} conv / {len(self.ssm)} ssm tensors, "
                f"the model has {cfg.num_mamba_layers} mamba layers"
            )
        if len(self.k) != cfg.num_attn_layers or len(self.v) != cfg.num_attn_layers:
            raise ValueError(
                f"LayerBuffers has {len(self.k)} k / {len(self.v)} v tensors, "
                f"the model has {cfg.num_attn_layers} attention layers"
            )
        kv_shape = (cfg.num_key_value_heads, cfg.head_dim)
        for name, tensors, shape in (
            ("conv", self.conv, cfg.conv_state_shape),
            ("ssm", self.ssm, cfg.ssm_state_shape),
            ("k", self.k, kv_shape),
            ("v", self.v, kv_shape),
        ):
            for i, t in enumerate(tensors):
                if t.dim() != len(shape) + 1 or tuple(t.shape[1:]) != tuple(shape):
                    raise ValueError(
                        f"LayerBuffers.{name}[{i}] has shape {tuple(t.shape)}, "
                        f"expected [slots, {', '.join(map(str, shape))}]"
                    )
