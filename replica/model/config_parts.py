"""Parts of :class:`~replica.model.config.ModelConfig` that only some families have: the gated
DeltaNet mixer (Qwen3-Next), a mixture of experts, and the muP multipliers (Granite, Falcon-H1).

Each is a frozen dataclass validated in ``__post_init__``, with derived sizes as properties.
"""

from __future__ import annotations

from dataclasses import dataclass

ROUTERS = ("softmax", "sigmoid")


@dataclass(frozen=True)
class DeltaNetConfig:
    """Gated DeltaNet shapes (HF ``qwen3_next``'s ``linear_*`` fields without the prefix).

    Value head ``h`` reads key head ``h // (num_value_heads / num_key_heads)``. The chunk size of
    the prefill algorithm is 64, as in transformers and flash-linear-attention.
    """

    num_key_heads: int = 2
    num_value_heads: int = 4
    key_head_dim: int = 16
    value_head_dim: int = 16
    conv_kernel: int = 4
    chunk_size: int = 64

    def __post_init__(self) -> None:
        for name in ("num_key_heads", "num_value_heads", "key_head_dim", "value_head_dim"):
            if getattr(self, name) <= 0:
                raise ValueError(
                    f"DeltaNetConfig.{name} must be positive, got {getattr(self, name)}"
                )
        if self.num_value_heads % self.num_key_heads:
            raise ValueError("linear_num_value_heads must be a multiple of linear_num_key_heads")
        if self.conv_kernel < 2:
            raise ValueError(
                "linear_conv_kernel_dim must be at least 2 (the state keeps k-1 steps)"
            )
        if self.chunk_size <= 0:
            raise ValueError(f"DeltaNetConfig.chunk_size must be positive, got {self.chunk_size}")

    @property
    def key_dim(self) -> int:
        return self.num_key_heads * self.key_head_dim

    @property
    def value_dim(self) -> int:
        return self.num_value_heads * self.value_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the causal conv1d: queries, keys and values of every head."""
        return 2 * self.key_dim + self.value_dim

    @property
    def conv_state_shape(self) -> tuple[int, int]:
        return (self.conv_dim, self.conv_kernel - 1)

    @property
    def state_shape(self) -> tuple[int, int, int]:
        """The recurrent matrix of each value head: ``[heads, key_head_dim, value_head_dim]``."""
        return (self.num_value_heads, self.key_head_dim, self.value_head_dim)


@dataclass(frozen=True)
class MoEConfig:
    """A routed mixture of experts, optionally with a shared expert beside it.

    ``router``: ``"softmax"`` takes the top-k of the softmax over all experts (Granite, Qwen3-Next);
    ``"sigmoid"`` scores experts with a sigmoid plus a correction bias, chooses among the best
    ``topk_group`` of ``n_group`` groups, and weights by the uncorrected scores (Nemotron-H).
    With ``norm_topk_prob`` the chosen weights are renormalised to sum to one; they are then
    multiplied by ``routed_scaling_factor``. ``shared_intermediate_size`` 0 means no shared expert;
    ``shared_expert_gate`` scales it by ``sigmoid(gate(x))`` (Qwen3-Next). Experts use the model's
    MLP activation and gating (``ModelConfig.hidden_act``, ``mlp_gated``).
    """

    num_experts: int = 4
    top_k: int = 2
    intermediate_size: int = 32
    shared_intermediate_size: int = 0
    shared_expert_gate: bool = False
    router: str = "softmax"
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.0
    n_group: int = 1
    topk_group: int = 1

    def __post_init__(self) -> None:
        if self.num_experts <= 0 or self.intermediate_size <= 0:
            raise ValueError("MoEConfig needs positive num_experts and intermediate_size")
        if not 0 < self.top_k <= self.num_experts:
            raise ValueError(f"top_k {self.top_k} must be in 1..num_experts ({self.num_experts})")
        if self.shared_intermediate_size < 0:
            raise ValueError("shared_intermediate_size must be >= 0 (0: no shared expert)")
        if self.router not in ROUTERS:
            raise ValueError(f"unknown router {self.router!r}; use one of {ROUTERS}")
        if self.num_experts % self.n_group or not 0 < self.topk_group <= self.n_group:
            raise ValueError("n_group must divide num_experts and topk_group be in 1..n_group")
        if self.shared_expert_gate and not self.shared_intermediate_size:
            raise ValueError("shared_expert_gate needs a shared expert")


@dataclass(frozen=True)
class Multipliers:
    """Constant scales of the muP-trained families; all 1.0 means none.

    ``embedding`` scales the embeddings, ``residual`` each block's output before it is added to
    the residual stream, ``logits`` the LM head's output. Falcon-H1 also scales the attention
    input, output and keys, the Mamba2 input and output, the five sections of the Mamba2 input
    projection (gate, x, B, C, dt: ``ssm_projection``) and the MLP's gate and down projections.
    """

    embedding: float = 1.0
    residual: float = 1.0
    logits: float = 1.0
    attention_in: float = 1.0
    attention_out: float = 1.0
    key: float = 1.0
    ssm_in: float = 1.0
    ssm_out: float = 1.0
    ssm_projection: tuple[float, float, float, float, float] = (1.0, 1.0, 1.0, 1.0, 1.0)
    mlp_gate: float = 1.0
    mlp_down: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "ssm_projection", tuple(float(m) for m in self.ssm_projection))
        if len(self.ssm_projection) != 5:
            raise ValueError("ssm_projection needs five multipliers (gate, x, B, C, dt)")
