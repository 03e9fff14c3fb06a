"""Frozen configuration of one replica: the hybrid model's state shapes and the pool sizes.

Everything here is validated in ``__post_init__``; sizes derived from other fields are properties,
so there is one source of truth for every number the pools and the model allocate by.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from replica.model.config import ModelConfig


@dataclass(frozen=True)
class PoolConfig:
    """Sizes of one replica's pools.

    ``max_sessions`` sizes the req rows (one per session or running request) and the mamba pool
    (``max_sessions * (1 + mamba_track_buffers)`` slots), so a replica can hold exactly
    ``max_sessions`` sessions with their state at once.
    """

    max_sessions: int = 8
    kv_tokens: int = 8192
    max_context: int = 2048
    page_size: int = 1
    mamba_track_buffers: int = 1
    state_dtype: torch.dtype = torch.float32
    kv_dtype: torch.dtype = torch.float32
    device: str = "cpu"

    def __post_init__(self) -> None:
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
        if not 0 <= self.mamba_track_buffers <= 8:
            raise ValueError(f"mamba_track_buffers must be in 0..8, got {self.mamba_track_buffers}")

    @property
    def mamba_slots_per_seq(self) -> int:
        """Mamba slots a request or an idle session holds: its state plus the track buffer."""
        return 1 + self.mamba_track_buffers

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


@dataclass(frozen=True)
class ReplicaConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    pools: PoolConfig = field(default_factory=PoolConfig)
    session_idle_timeout_s: float = 300.0
    max_prefill_chunk: int = 256
    max_batch_tokens: int = 2048
    strict: bool = False

    def __post_init__(self) -> None:
        if self.session_idle_timeout_s <= 0:
            raise ValueError("session_idle_timeout_s must be positive")
        if self.max_prefill_chunk <= 0 or self.max_batch_tokens <= 0:
            raise ValueError("max_prefill_chunk and max_batch_tokens must be positive")

    @property
    def state_bytes(self) -> int:
        """Bytes of one mamba slot across all mamba layers (conv + SSM state)."""
        m = self.model
        per_layer = math.prod(m.conv_state_shape) + math.prod(m.ssm_state_shape)
        return per_layer * m.num_mamba_layers * torch.finfo(self.pools.state_dtype).bits // 8
