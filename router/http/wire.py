"""Reading request bodies of the OpenAI API: fields checked as the API defines them, unset
sampling left to the model's defaults, and every field this server does not support refused by
name (a 400), never silently ignored. A field the API defines whose value is its default (``n``
1, ``presence_penalty`` 0, ``tools`` empty, ...) is accepted: clients send those unasked."""

from __future__ import annotations

import math
from typing import Any

from replica.api import InvalidRequestError, SamplingParams
from router.http.errors import invalid

# fields clients send with their default value; anything else in them is refused
DEFAULT_ONLY: dict[str, tuple[Any, ...]] = {
    "n": (1,),
    "presence_penalty": (0, 0.0),
    "frequency_penalty": (0, 0.0),
    "logprobs": (False,),
    "top_logprobs": (0,),
    "tools": ((),),
    "tool_choice": ("none", "auto"),
    "parallel_tool_calls": (True, False),
    "response_format": ({"type": "text"},),
    "text": ({"format": {"type": "text"}},),
    "logit_bias": ({},),
    "best_of": (1,),
    "echo": (False,),
    "suffix": ("",),
    "service_tier": ("auto", "default"),
    "truncation": ("disabled",),
    "reasoning": ({},),
    "include": ((),),
    "store": (False,),  # chat completions only: stored completions are not kept here
}
ROLES = ("system", "developer", "user", "assistant")
MAX_STOP = 16


def check_fields(body: dict[str, Any], supported: set[str], default_only: set[str]) -> None:
    for name, value in body.items():
        if name in supported or value is None:
            continue
        if name in default_only and _is_default(value, DEFAULT_ONLY[name]):
            continue
        raise invalid(f"'{name}' is not supported by this server", name, "unsupported_parameter")


def _is_default(value: Any, defaults: tuple[Any, ...]) -> bool:
    if isinstance(value, list):
        value = tuple(value)
    # a boolean is not a number here: True is not the default n=1
    return any(isinstance(value, bool) == isinstance(d, bool) and value == d for d in defaults)


def string(body: dict[str, Any], name: str, required: bool = False) -> str | None:
    value = body.get(name)
    if value is None:
        if required:
            raise invalid(f"'{name}' is required", name, "missing_required_parameter")
        return None
    if not isinstance(value, str):
        raise invalid(f"'{name}' must be a string", name)
    return value


def boolean(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid(f"'{name}' must be a boolean", name)
    return value


def number(body: dict[str, Any], name: str, low: float, high: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise invalid(f"'{name}' must be a number", name)
    if not low <= value <= high:
        raise invalid(f"'{name}' must be between {low:g} and {high:g}, got {value}", name)
    return float(value)


def integer(body: dict[str, Any], name: str, low: int, high: int = 2**63 - 1) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(f"'{name}' must be an integer", name)
    if not low <= value <= high:
        raise invalid(f"'{name}' must be between {low} and {high}, got {value}", name)
    return value


def stop_strings(body: dict[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise invalid("'stop' must be a non-empty string or a list of them", "stop")
    if len(stops) > MAX_STOP:
        raise invalid(f"'stop' takes at most {MAX_STOP} strings", "stop")
    return tuple(stops)


def sampling(body: dict[str, Any], max_tokens: int | None) -> SamplingParams:
    """The sampling of a request; what it leaves unset the model's generation defaults fill."""
    seed = integer(body, "seed", -(2**63))
    try:
        return SamplingParams(
            max_new_tokens=max_tokens,
            temperature=number(body, "temperature", 0.0, 2.0),
            top_p=number(body, "top_p", 0.0, 1.0),
            seed=(seed % 2**64) if seed is not None else 0,
            top_k=integer(body, "top_k", 0),  # an extension many servers take
            stop=stop_strings(body),
            ignore_eos=boolean(body, "ignore_eos", False),  # an extension too
        )
    except InvalidRequestError as exc:
        raise invalid(str(exc)) from None


def text_content(content: Any, where: str, part_types: tuple[str, ...]) -> str:
    """A message's content as text: a string, or a list of text parts (joined)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") not in part_types:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise invalid(
                    f"{where}: content parts of type {kind!r} are not supported (text only: "
                    f"{', '.join(part_types)})",
                    where,
                )
            if not isinstance(part.get("text"), str):
                raise invalid(f"{where}: a text part needs a 'text' string", where)
            texts.append(part["text"])
        return "".join(texts)
    raise invalid(f"{where}: content must be a string or a list of text parts", where)


def chat_message(message: Any, where: str, part_types: tuple[str, ...]) -> dict[str, str]:
    """One message as the chat template takes it: ``{"role", "content"}`` (developer is
    system, as the API defines it for models without a developer role)."""
    if not isinstance(message, dict):
        raise invalid(f"{where} must be an object", where)
    role = message.get("role")
    if role not in ROLES:
        raise invalid(
            f"{where}.role must be one of {', '.join(ROLES)} (tool messages are not supported)",
            f"{where}.role",
        )
    unknown = set(message) - {"role", "content", "name", "type", "id", "status"}
    if unknown:
        name = sorted(unknown)[0]
        raise invalid(f"{where}.{name} is not supported by this server", f"{where}.{name}")
    content = message.get("content")
    if content is None:
        raise invalid(f"{where}.content is required", f"{where}.content")
    text = text_content(content, f"{where}.content", part_types)
    return {"role": "system" if role == "developer" else role, "content": text}
