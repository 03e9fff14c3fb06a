"""The hybrid model's architecture: layer kinds and the shapes of the state it keeps per sequence.

Validated in ``__post_init__``; sizes derived from other fields are properties, so the pools and
the model allocate by one source of truth.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelConfig:
    """The Bamba architecture (HF ``BambaConfig`` names): Mamba2 mixers and attention layers."""

    vocab_size: int = 384
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    attn_layer_indices: tuple[int, ...] = (1, 3)
    mamba_n_heads: int = 8
    mamba_d_head: int = 16
    mamba_n_groups: int = 1
    mamba_d_state: int = 16
    mamba_d_conv: int = 4
    mamba_expand: int = 2
    mamba_chunk_size: int = 64
    mamba_conv_bias: bool = True
    mamba_proj_bias: bool = False
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    partial_rotary_factor: float = 0.5
    max_position_embeddings: int = 8192
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    time_step_limit: tuple[float, float] = (0.0, float("inf"))
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None

    def __post_init__(self) -> None:
        positive = (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "mamba_n_heads",
            "mamba_d_head",
            "mamba_n_groups",
            "mamba_d_state",
            "mamba_d_conv",
            "mamba_chunk_size",
        )
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"ModelConfig.{name} must be positive, got {getattr(self, name)}")
        object.__setattr__(self, "attn_layer_indices", tuple(sorted(set(self.attn_layer_indices))))
        bad = [i for i in self.attn_layer_indices if not 0 <= i < self.num_hidden_layers]
        if bad:
            raise ValueError(f"attn_layer_indices {bad} outside 0..{self.num_hidden_layers - 1}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError("hidden_size must be a multiple of num_attention_heads")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.mamba_n_heads % self.mamba_n_groups:
            raise ValueError("mamba_n_heads must be a multiple of mamba_n_groups")
        if self.mamba_d_conv < 2:
            raise ValueError(
                "mamba_d_conv must be at least 2 (the conv state keeps d_conv-1 steps)"
            )

    @property
    def mamba_layer_indices(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.num_hidden_layers) if i not in self.attn_layer_indices)

    @property
    def num_mamba_layers(self) -> int:
        return len(self.mamba_layer_indices)

    @property
    def num_attn_layers(self) -> int:
        return len(self.attn_layer_indices)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def mamba_intermediate_size(self) -> int:
        return self.mamba_n_heads * self.mamba_d_head

    @property
    def conv_dim(self) -> int:
        """Channels of the causal conv1d: x plus the B and C projections of every group."""
        return self.mamba_intermediate_size + 2 * self.mamba_n_groups * self.mamba_d_state

    @property
    def conv_state_shape(self) -> tuple[int, int]:
        return (self.conv_dim, self.mamba_d_conv - 1)

    @property
    def ssm_state_shape(self) -> tuple[int, int, int]:
        return (self.mamba_n_heads, self.mamba_d_head, self.mamba_d_state)
