"""The Bamba hybrid model (Mamba2 + attention) over externally owned state buffers."""

from replica.model.bamba import BambaModel
from replica.model.buffers import LayerBuffers
from replica.model.factory import TINY_BAMBA, build_tiny_bamba, init_weights, load
from replica.model.loader import (
    config_from_hf,
    hf_config,
    load_model,
    load_weights,
    save_checkpoint,
)
from replica.model.tokenizer import ByteTokenizer, HFTokenizer, IncrementalDetokenizer, Tokenizer

__all__ = [
    "TINY_BAMBA",
    "BambaModel",
    "ByteTokenizer",
    "HFTokenizer",
    "IncrementalDetokenizer",
    "LayerBuffers",
    "Tokenizer",
    "build_tiny_bamba",
    "config_from_hf",
    "hf_config",
    "init_weights",
    "load",
    "load_model",
    "load_weights",
    "save_checkpoint",
]
