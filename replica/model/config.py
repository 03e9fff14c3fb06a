"""The hybrid model's architecture: layer kinds and the shapes of the state it keeps per sequence.

Validated in ``__post_init__``; sizes derived from other fields are properties, so the pools and
the model allocate by one source of truth. The defaults are ``tiny-bamba``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from replica.model.config_parts import DeltaNetConfig, MoEConfig, Multipliers

# A layer's token mixer: "mamba2+attention" runs both side by side (Falcon-H1); "none" has none
# (a Nemotron-H MLP or MoE layer).
MIXERS = ("mamba2", "deltanet", "attention", "mamba2+attention", "none")
RECURRENT = {"mamba2": "mamba2", "deltanet": "deltanet", "mamba2+attention": "mamba2"}
FFNS = ("mlp", "moe", "none")
MAMBA_NORMS = ("gate_then_norm", "norm_then_gate", "gate")
ACTIVATIONS = ("silu", "relu2")


@dataclass(frozen=True)
class ModelConfig:
    """A hybrid decoder: per layer a mixer (``layer_mixers``) and a feed-forward (``layer_ffns``).

    Field names follow HF ``BambaConfig``. Empty ``layer_mixers`` means Bamba's layout: attention
    at ``attn_layer_indices``, Mamba2 elsewhere; empty ``layer_ffns`` means an MLP in every layer.
    Both are normalised to full tuples, and ``attn_layer_indices`` to the layers with attention.
    All recurrent layers are of one kind (Mamba2 or DeltaNet), so every mamba-pool slot has one
    shape. ``head_dim`` None is ``hidden_size / num_attention_heads``; ``attention_scale`` None is
    ``head_dim ** -0.5``; ``partial_rotary_factor`` 0 means no rotary embedding.
    ``mamba_norm``: how the Mamba2 output meets its gate (``gate_then_norm``: Bamba, Granite,
    Nemotron-H; ``norm_then_gate`` / ``gate``: Falcon-H1 with / without its RMSNorm).
    """

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
    model_type: str = "bamba"
    layer_mixers: tuple[str, ...] = ()
    layer_ffns: tuple[str, ...] = ()
    head_dim: int | None = None
    attention_scale: float | None = None
    attention_output_gate: bool = False
    attention_qk_norm: bool = False
    mamba_out_proj_bias: bool | None = None
    mamba_norm: str = "gate_then_norm"
    hidden_act: str = "silu"
    mlp_gated: bool = True
    norm_unit_offset: bool = False
    deltanet: DeltaNetConfig | None = None
    moe: MoEConfig | None = None
    multipliers: Multipliers = field(default_factory=Multipliers)

    def __post_init__(self) -> None:
        positive = (
            "vocab_size",
            "hidden_size",
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
        n = self.num_hidden_layers
        if not self.layer_mixers:
            bad = [i for i in self.attn_layer_indices if not 0 <= i < n]
            if bad:
                raise ValueError(f"attn_layer_indices {bad} outside 0..{n - 1}")
        mixers = tuple(self.layer_mixers) or tuple(
            "attention" if i in self.attn_layer_indices else "mamba2" for i in range(n)
        )
        ffns = tuple(self.layer_ffns) or ("mlp",) * n
        if len(mixers) != n or len(ffns) != n:
            raise ValueError(f"layer_mixers and layer_ffns need one entry per layer ({n})")
        self._check_choice("layer_mixers", mixers, MIXERS)
        self._check_choice("layer_ffns", ffns, FFNS)
        object.__setattr__(self, "layer_mixers", mixers)
        object.__setattr__(self, "layer_ffns", ffns)
        attn = tuple(i for i, m in enumerate(mixers) if "attention" in m)
        object.__setattr__(self, "attn_layer_indices", attn)
        if self.head_dim is None:
            if self.hidden_size % self.num_attention_heads:
                raise ValueError("hidden_size must be a multiple of num_attention_heads")
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if self.mamba_out_proj_bias is None:
            object.__setattr__(self, "mamba_out_proj_bias", self.mamba_proj_bias)
        object.__setattr__(self, "time_step_limit", tuple(float(t) for t in self.time_step_limit))
        self._check_choice("mamba_norm", (self.mamba_norm,), MAMBA_NORMS)
        self._check_choice("hidden_act", (self.hidden_act,), ACTIVATIONS)
        if self.head_dim <= 0 or self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("head_dim must be positive and num_key_value_heads divide the heads")
        if self.mamba_n_heads % self.mamba_n_groups:
            raise ValueError("mamba_n_heads must be a multiple of mamba_n_groups")
        if self.mamba_d_conv < 2:
            raise ValueError(
                "mamba_d_conv must be at least 2 (the conv state keeps d_conv-1 steps)"
            )
        kinds = {RECURRENT[m] for m in mixers if m in RECURRENT}
        if len(kinds) > 1:
            raise ValueError("a model's recurrent layers must all be Mamba2 or all DeltaNet")
        if ("deltanet" in kinds) != (self.deltanet is not None):
            raise ValueError("deltanet (DeltaNetConfig) is needed exactly when a layer is deltanet")
        if ("moe" in ffns) != (self.moe is not None):
            raise ValueError("moe (MoEConfig) is needed exactly when a layer's ffn is moe")
        if "mlp" in ffns and self.intermediate_size <= 0:
            raise ValueError(f"intermediate_size must be positive, got {self.intermediate_size}")

    @staticmethod
    def _check_choice(name: str, values: tuple[str, ...], allowed: tuple[str, ...]) -> None:
        unknown = sorted(set(values) - set(allowed))
        if unknown:
            raise ValueError(f"{name}: unknown {unknown}; use {', '.join(allowed)}")

    @property
    def recurrent_kind(self) -> str | None:
        """``"mamba2"``, ``"deltanet"`` or None: what every mamba-pool slot holds."""
        kinds = [RECURRENT[m] for m in self.layer_mixers if m in RECURRENT]
        return kinds[0] if kinds else None

    @property
    def mamba_layer_indices(self) -> tuple[int, ...]:
        """Layers with a recurrent mixer (Mamba2 or DeltaNet), whose state the mamba pool holds."""
        return tuple(i for i, m in enumerate(self.layer_mixers) if m in RECURRENT)

    @property
    def num_mamba_layers(self) -> int:
        return len(self.mamba_layer_indices)

    @property
    def num_attn_layers(self) -> int:
        return len(self.attn_layer_indices)

    @property
    def mamba_intermediate_size(self) -> int:
        return self.mamba_n_heads * self.mamba_d_head

    @property
    def conv_dim(self) -> int:
        """Mamba2's conv1d channels: x plus the B and C projections of every group."""
        return self.mamba_intermediate_size + 2 * self.mamba_n_groups * self.mamba_d_state

    @property
    def conv_state_shape(self) -> tuple[int, int]:
        if self.recurrent_kind == "deltanet":
            return self.deltanet.conv_state_shape
        return (self.conv_dim, self.mamba_d_conv - 1)

    @property
    def ssm_state_shape(self) -> tuple[int, int, int]:
        """The temporal state: Mamba2 ``[heads, head_dim, d_state]``, DeltaNet ``[heads, k, v]``."""
        if self.recurrent_kind == "deltanet":
            return self.deltanet.state_shape
        return (self.mamba_n_heads, self.mamba_d_head, self.mamba_d_state)
