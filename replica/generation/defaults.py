"""``GenerationDefaults``: the sampling defaults and EOS ids of a checkpoint.

Read from ``generation_config.json`` the way transformers' ``generate`` reads it: its
``eos_token_id`` (an int or a list) ends a turn, else ``config.json``'s (transformers builds the
generation config from the model config when the file is absent); ``temperature`` applies only
with ``do_sample`` (otherwise ``generate`` is greedy); ``top_p``, ``top_k``, ``max_new_tokens``
(else ``max_length``, which counts the whole context) apply when present. Keys the file does not
have leave the built-in defaults: 16 new tokens, greedy, top_p and top_k off, no EOS (the
built-in tiny models have no checkpoint directory, hence no EOS and no defaults).
Immutable; one per replica, read once at start.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from typing import Any

from replica.api import SamplingParams

BUILTIN_MAX_NEW_TOKENS = 16


@dataclass(frozen=True, slots=True)
class GenerationDefaults:
    eos_token_ids: tuple[int, ...] = ()
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int | None = None
    max_length: int | None = None  # prompt + generated, the whole session's context

    @classmethod
    def from_checkpoint(cls, model_path: str | None) -> GenerationDefaults:
        """The defaults of the checkpoint directory ``model_path`` (``None``: a built-in model).
        A file that is not valid JSON raises ``ValueError`` naming it."""
        if not model_path:
            return cls()
        gen = _read_json(os.path.join(model_path, "generation_config.json"))
        model = _read_json(os.path.join(model_path, "config.json"))
        eos = gen["eos_token_id"] if "eos_token_id" in gen else model.get("eos_token_id")
        return cls(
            eos_token_ids=_ids(eos),
            temperature=float(gen.get("temperature", 1.0)) if gen.get("do_sample") else 0.0,
            top_p=float(gen["top_p"]) if gen.get("top_p") is not None else 1.0,
            top_k=int(gen["top_k"]) if gen.get("top_k") is not None else 0,
            max_new_tokens=_int_or_none(gen.get("max_new_tokens")),
            max_length=_int_or_none(gen.get("max_length")),
        )

    def apply(
        self, sampling: SamplingParams, context_tokens: int, room: int | None = None
    ) -> SamplingParams:
        """``sampling`` with every unset field filled in and the model's EOS ids attached (none
        with ``ignore_eos``); ``context_tokens`` is the session's length once the turn's input is
        in (what ``max_length`` counts against). The checkpoint's ``max_new_tokens`` is capped at
        ``room`` (what the session's context has left), so leaving it unset never overflows the
        context; a value the request sets, and the built-in 16, are checked as sent."""
        new = sampling.max_new_tokens
        if new is None:
            if self.max_new_tokens is not None:
                new = self.max_new_tokens
            elif self.max_length is not None:
                new = max(0, self.max_length - context_tokens)
            if new is not None and room is not None:
                new = max(0, min(new, room))
            if new is None:
                new = BUILTIN_MAX_NEW_TOKENS
        pick = lambda value, default: default if value is None else value  # noqa: E731
        return dataclasses.replace(
            sampling,
            max_new_tokens=new,
            temperature=pick(sampling.temperature, self.temperature),
            top_p=pick(sampling.top_p, self.top_p),
            top_k=pick(sampling.top_k, self.top_k),
            eos_token_ids=() if sampling.ignore_eos else self.eos_token_ids,
        )


def _read_json(path: str) -> dict[str, Any]:
    if not os.path.exists(path):
        return {}
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path} is not a JSON object")
    return data


def _ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)
