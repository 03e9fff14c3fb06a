"""The hybrid SSM/attention model (Bamba, Granite-4.0-H, Nemotron-H, Falcon-H1, Qwen3-Next) over
externally owned state buffers."""

from replica.model.buffers import LayerBuffers
from replica.model.factory import (
    BUILTINS,
    TINY_BAMBA,
    build_tiny,
    build_tiny_bamba,
    init_weights,
    load,
    tiny_config,
)
from replica.model.hybrid import HybridModel
from replica.model.loader import (
    config_from_hf,
    hf_config,
    load_model,
    load_weights,
    save_checkpoint,
)
from replica.model.tokenizer import ByteTokenizer, HFTokenizer, TextStream, Tokenizer

__all__ = [
    "BUILTINS",
    "TINY_BAMBA",
    "ByteTokenizer",
    "HFTokenizer",
    "HybridModel",
    "LayerBuffers",
    "TextStream",
    "Tokenizer",
    "build_tiny",
    "build_tiny_bamba",
    "config_from_hf",
    "hf_config",
    "init_weights",
    "load",
    "load_model",
    "load_weights",
    "save_checkpoint",
    "tiny_config",
]
