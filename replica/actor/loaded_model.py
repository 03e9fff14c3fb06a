"""``LoadedModel``: what a replica loads at its start.

The network and tokenizer of ``--model`` (a built-in name, a local directory or a hub id,
resolved in this node's cache by ``replica.model.source``), on CUDA when present, else the CPU;
the generation defaults and the chat template of its checkpoint; and the replica's config with
the device filled in.

torch is imported here, in the replica's process only (the modules every process imports stay
torch-free).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from replica.config import ReplicaConfig

if TYPE_CHECKING:
    from replica.generation import GenerationDefaults
    from replica.generation.chat_prompts import ChatPrompts
    from replica.model import HybridModel, Tokenizer


@dataclass(frozen=True, slots=True)
class LoadedModel:
    config: ReplicaConfig  # the replica's, its pools on the device the model is on
    net: HybridModel
    tokenizer: Tokenizer
    generation: GenerationDefaults
    chat_prompts: ChatPrompts

    @classmethod
    def load(cls, config: ReplicaConfig) -> LoadedModel:
        import torch

        from replica.generation import GenerationDefaults
        from replica.generation.chat_prompts import ChatPrompts
        from replica.model import load
        from replica.model.factory import BUILTINS
        from replica.model.source import resolve

        if config.threads:
            torch.set_num_threads(config.threads)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        source = resolve(config.model_name, frozenset(BUILTINS), config.revision)
        _, net, tokenizer = load(
            source.path or source.builtin, device=device, dtype=config.weights_dtype
        )
        pools = dataclasses.replace(config.pools, device=device)
        return cls(
            dataclasses.replace(config, pools=pools),
            net,
            tokenizer,
            GenerationDefaults.from_checkpoint(source.path),
            ChatPrompts(source.path, tokenizer),
        )
