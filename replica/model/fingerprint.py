"""``model_fingerprint``: what two replicas compare before one imports a session the other
exported. Session state is only meaningful to the model that computed it: the same architecture
(every field of its ``ModelConfig``) with the same weights.

The weights are fingerprinted by sampling, not by hashing every byte (a real checkpoint is
gigabytes): each tensor's name, shape and dtype, and 64 of its values spread over its length.
Two checkpoints that differ only in values the sample misses would collide; models trained or
initialised differently do not.
"""

from __future__ import annotations

import hashlib

import torch
from torch import nn

from replica.model.config import ModelConfig

SAMPLES_PER_TENSOR = 64


def model_fingerprint(cfg: ModelConfig, model: nn.Module) -> str:
    """A short hex digest of ``cfg`` and a sample of ``model``'s weights and buffers."""
    digest = hashlib.sha256(repr(cfg).encode())
    with torch.no_grad():
        for name, tensor in sorted(model.state_dict().items()):
            flat = tensor.detach().reshape(-1)
            step = max(1, flat.numel() // SAMPLES_PER_TENSOR)
            sample = flat[::step][:SAMPLES_PER_TENSOR].to("cpu", torch.float64)
            digest.update(f"{name}{tuple(tensor.shape)}{tensor.dtype}".encode())
            digest.update(sample.numpy().tobytes())
    return digest.hexdigest()[:24]
