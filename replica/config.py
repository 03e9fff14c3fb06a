"""The settings of one replica: its pool sizes and its engine. Frozen and validated on construction.

Each setting is declared once, with its default and its help text (``replica.settings.setting``);
the command line (``router.flags``) is generated from these fields, and the demo, the benchmarks
and the tests build their configs from the same classes. The model's architecture is not a
setting: it comes from the checkpoint (``replica.model.config.ModelConfig``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from replica import failpoints
from replica.settings import nested, setting

if TYPE_CHECKING:
    import torch

DEFAULT_IDLE_TIMEOUT_S = 300.0
# The dtypes a replica keeps weights, recurrent state and KV in (``--dtype`` and its peers).
DTYPES = ("bfloat16", "float16", "float32")
AUTO = "auto"


def torch_dtype(name: str) -> torch.dtype | None:
    """The torch dtype ``name`` (one of ``DTYPES``); None for any other name. Torch is imported
    here, not with this module: the router, the checkpoint stores and the CLI read these
    settings without loading the model's stack."""
    if name not in DTYPES:
        return None
    import torch

    return getattr(torch, name)


@dataclass(frozen=True)
class PoolConfig:
    """Sizes of one replica's pools.

    ``max_sessions`` sizes the req rows (one per session or running request) and the mamba pool
    (``max_sessions * (1 + mamba_track_buffers)`` slots), so a replica can hold exactly
    ``max_sessions`` sessions with their state on the GPU at once. ``max_parked_sessions`` sizes
    the host tier (``host_mamba``: one slot per parked session; ``host_kv_tokens``: their KV),
    where idle sessions wait without holding GPU slots; 0 turns parking off.
    """

    max_sessions: int = setting(
        64, "sessions one replica holds at once (sizes the req rows and the mamba pool)"
    )
    kv_tokens: int = setting(65536, "KV token slots per replica")
    max_context: int = setting(4096, "tokens one session may hold")
    page_size: int = setting(16, "KV page size in tokens")
    mamba_track_buffers: int = setting(
        1, "extra mamba slots per session; 1 or more makes turns atomic", choices=(0, 1, 2)
    )
    max_parked_sessions: int = setting(
        0, "idle sessions one replica keeps in host memory beyond --max-sessions (0: no parking)"
    )
    host_kv_tokens: int = setting(
        0,
        "KV token slots in host memory for parked sessions "
        "(0: --max-parked-sessions times the KV share of one GPU session)",
    )
    max_cached_states: int = setting(
        -1,
        "states at turn boundaries one replica keeps for new sessions whose prefix begins with "
        "them, in free pool room, evicted least recently used whenever room is needed "
        "(-1: --max-sessions; 0: no cache)",
    )
    state_dtype: str = setting(
        "float32",
        "dtype of the recurrent (conv and SSM) state in the pools, parked, moved and "
        "checkpointed (float32: the SSM recurrence accumulates over the whole session)",
        choices=tuple(DTYPES),
    )
    kv_dtype: str = setting(
        AUTO, "dtype of the KV cache (auto: the weights' dtype)", choices=(AUTO, *DTYPES)
    )
    device: str = setting("cpu", cli=False)  # chosen by the replica: cuda when it has a GPU

    def __post_init__(self) -> None:
        for name in ("state_dtype", "kv_dtype"):
            value = getattr(self, name)
            if value not in DTYPES and not (name == "kv_dtype" and value == AUTO):
                raise ValueError(f"{name} must be one of {', '.join(DTYPES)}, got {value!r}")
        if self.max_sessions <= 0:
            raise ValueError(f"max_sessions must be positive, got {self.max_sessions}")
        if self.page_size <= 0:
            raise ValueError(f"page_size must be positive, got {self.page_size}")
        if self.kv_tokens < self.page_size:
            raise ValueError(
                f"kv_tokens ({self.kv_tokens}) must hold at least one page of {self.page_size}"
            )
        if self.max_context <= 0:
            raise ValueError(f"max_context must be positive, got {self.max_context}")
        if not 0 <= self.mamba_track_buffers <= 2:
            raise ValueError(
                f"mamba_track_buffers must be 0, 1 or 2, got {self.mamba_track_buffers}"
            )
        if self.max_parked_sessions < 0:
            raise ValueError(f"max_parked_sessions must be >= 0, got {self.max_parked_sessions}")
        if self.max_cached_states < -1:
            raise ValueError(f"max_cached_states must be >= -1, got {self.max_cached_states}")
        if self.host_kv_tokens < 0:
            raise ValueError(f"host_kv_tokens must be >= 0, got {self.host_kv_tokens}")
        if self.max_parked_sessions and 0 < self.host_kv_tokens < self.page_size:
            raise ValueError(
                f"host_kv_tokens ({self.host_kv_tokens}) must hold at least one page of "
                f"{self.page_size}"
            )

    @property
    def state_torch_dtype(self) -> torch.dtype:
        dtype = torch_dtype(self.state_dtype)
        assert dtype is not None  # validated on construction
        return dtype

    @property
    def kv_torch_dtype(self) -> torch.dtype:
        """``kv_dtype``; ``auto`` before a model resolved it (``with_weights_dtype``) is
        float32, the dtype of weights on the CPU."""
        return torch_dtype(self.kv_dtype) or torch_dtype("float32")

    def with_weights_dtype(self, weights: torch.dtype) -> PoolConfig:
        """These pools for a model whose weights are ``weights``: ``kv_dtype`` auto resolved."""
        if self.kv_dtype != AUTO:
            return self
        return dataclasses.replace(self, kv_dtype=str(weights).removeprefix("torch."))

    @property
    def mamba_slots_per_seq(self) -> int:
        """Mamba slots a request or an idle session holds: its state plus the track buffer."""
        return 1 + self.mamba_track_buffers

    @property
    def cached_states(self) -> int:
        """How many turn-boundary states the replica may cache (``max_cached_states``)."""
        return self.max_sessions if self.max_cached_states < 0 else self.max_cached_states

    @property
    def mamba_slots(self) -> int:
        return self.max_sessions * self.mamba_slots_per_seq

    @property
    def kv_pages(self) -> int:
        return self.kv_tokens // self.page_size

    @property
    def kv_token_slots(self) -> int:
        """Token slots the KV pool really has (``kv_tokens`` rounded down to whole pages)."""
        return self.kv_pages * self.page_size

    @property
    def kv_tokens_per_session(self) -> int:
        """The KV budget placement expects one more session to need (a fair share, >= a page)."""
        return max(self.page_size, self.kv_token_slots // self.max_sessions)

    @property
    def parking(self) -> bool:
        return self.max_parked_sessions > 0

    @property
    def max_open_sessions(self) -> int:
        """Sessions the replica can hold at once, on the GPU and parked (one checkpoint each)."""
        return self.max_sessions + self.max_parked_sessions

    @property
    def host_kv_pages(self) -> int:
        """Pages of the host KV pool: ``host_kv_tokens``, or by default a GPU session's KV share
        for every parked session (0 without parking)."""
        if not self.parking:
            return 0
        tokens = self.host_kv_tokens or self.max_parked_sessions * self.kv_tokens_per_session
        return max(1, tokens // self.page_size)


@dataclass(frozen=True)
class ReplicaConfig:
    """One replica: which model it serves, its pools and its engine."""

    pools: PoolConfig = nested(PoolConfig)
    model: str = setting(
        "tiny-bamba",
        "the model: a built-in (fixed-seed random weights, byte tokenizer: tiny-bamba, "
        "tiny-granitemoehybrid, tiny-nemotron-h, tiny-falcon-h1 or tiny-qwen3-next), an "
        "HF-format checkpoint directory (config.json, *.safetensors, tokenizer.json) or a "
        "Hugging Face hub id ORG/NAME (resolved by each replica in its node's HF_HOME; "
        "HF_HUB_OFFLINE and HF_TOKEN honoured) of a bamba, granitemoehybrid, nemotron_h, "
        "falcon_h1 or qwen3_next model",
    )
    model_path: str | None = setting(None, "the same as --model (kept for old command lines)")
    revision: str | None = setting(
        None, "the hub revision (branch, tag or commit) of a hub id --model (default: main)"
    )
    dtype: str = setting(
        AUTO,
        "dtype of the weights (auto: the checkpoint's torch_dtype on CUDA, float32 on the CPU)",
        choices=(AUTO, *DTYPES),
    )
    session_idle_timeout_s: float = setting(
        DEFAULT_IDLE_TIMEOUT_S, "idle sessions are released after this long (and no later)"
    )
    park_after_idle_s: float = setting(
        0.0,
        "park a session in host memory once it has been idle this long "
        "(0: only when GPU room is needed; needs --max-parked-sessions)",
    )
    max_prefill_chunk: int = setting(256, "input tokens of one turn folded in per engine step")
    max_batch_tokens: int = setting(2048, "tokens one engine step runs at most")
    threads: int = setting(0, "torch threads per replica (0: the cores shared among replicas)")
    session_checkpoints: bool = setting(
        True,
        "after each turn, checkpoint the session's state (off the token path) to storage that "
        "outlives this replica, so that its sessions survive its death",
    )
    output_socket: bool = setting(
        True,
        "each gateway reads its token outputs, and the checkpoint store its checkpoints, from a "
        "TCP connection of its own to the replica (the node's address, a port the system picks, "
        "a secret handed out through Ray; a gateway's CPU per token a quarter of the Ray "
        "stream's); off: Ray's streaming calls only, e.g. where all traffic between pods must "
        "be Ray's (TLS)",
    )
    cuda_graphs: bool = setting(
        True,
        "on CUDA, run each decode step as a CUDA graph captured for its padded batch size and KV "
        "width (checked against the eager step when captured; a model with MoE layers only where "
        "its experts run as one grouped GEMM, e.g. bfloat16 on recent GPUs)",
    )
    pad_decode: bool = setting(False, cli=False)  # pad decode batches without graphs too (tests)
    strict: bool = setting(False, "raise on any pool accounting violation")
    failpoints: frozenset[str] = setting(frozenset(), cli=False)  # see replica.failpoints

    @property
    def model_name(self) -> str:
        """What ``--model`` (or its alias ``--model-path``) names."""
        return self.model_path or self.model

    @property
    def weights_dtype(self) -> torch.dtype | None:
        """``dtype`` as a torch dtype; None for auto (the loader decides, see ``dtype``)."""
        return torch_dtype(self.dtype)

    def __post_init__(self) -> None:
        if self.dtype != AUTO and self.dtype not in DTYPES:
            raise ValueError(
                f"dtype must be auto or one of {', '.join(DTYPES)}, got {self.dtype!r}"
            )
        object.__setattr__(self, "failpoints", failpoints.check(frozenset(self.failpoints)))
        if self.session_idle_timeout_s <= 0:
            raise ValueError("session_idle_timeout_s must be positive")
        if self.park_after_idle_s < 0:
            raise ValueError(f"park_after_idle_s must be >= 0, got {self.park_after_idle_s}")
        if self.park_after_idle_s and not self.pools.parking:
            raise ValueError("--park-after-idle-s needs --max-parked-sessions > 0")
        if self.max_prefill_chunk <= 0 or self.max_batch_tokens <= 0:
            raise ValueError("max_prefill_chunk and max_batch_tokens must be positive")
        if self.threads < 0:
            raise ValueError(f"threads must be >= 0, got {self.threads}")
