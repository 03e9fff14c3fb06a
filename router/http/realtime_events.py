"""The Realtime protocol's events (GA names, text only): client events read and checked, server
events built in the shapes of the ``openai`` SDK's ``types.realtime``.

Every refusal is an ``ApiError`` naming the field (``param``); the connection answers it with
an ``error`` event carrying the client event's ``event_id`` and stays open.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, replace
from typing import Any, NoReturn

from router.http.errors import ApiError, invalid

SESSION_FIELDS = {"type", "model", "instructions", "output_modalities", "max_output_tokens"}
RESPONSE_FIELDS = {"output_modalities", "max_output_tokens", "conversation", "metadata"}
ITEM_FIELDS = {"id", "type", "role", "content", "object", "status"}
PART_TYPES = {"user": "input_text", "system": "input_text", "assistant": "output_text"}
MAX_ID_CHARS = 64
MAX_OUTPUT_TOKENS = 1 << 20


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(10)}"


def server_event(kind: str, **fields: Any) -> dict[str, Any]:
    return {"type": kind, "event_id": new_id("event"), **fields}


def error_event(exc: ApiError, client_event_id: str | None) -> dict[str, Any]:
    error = {"type": exc.type, "code": exc.code, "message": exc.message, "param": exc.param,
             "event_id": client_event_id}  # fmt: skip
    return server_event("error", error=error)


def unsupported(name: str) -> ApiError:
    return invalid(f"'{name}' is not supported by this server (text only, no tools)", name,
                   "unsupported_parameter")  # fmt: skip


@dataclass(frozen=True, slots=True)
class SessionConfig:
    """What ``session.update`` sets: the system message and the responses' length cap
    (None: "inf", up to the context)."""

    instructions: str = ""
    max_output_tokens: int | None = None

    def public(self, session_id: str, model: str) -> dict[str, Any]:
        limit = self.max_output_tokens
        return {"type": "realtime", "object": "realtime.session", "id": session_id,
                "model": model, "output_modalities": ["text"],
                "instructions": self.instructions,
                "max_output_tokens": "inf" if limit is None else limit,
                "tools": [], "tool_choice": "auto"}  # fmt: skip


def modalities(value: Any, name: str) -> None:
    if value != ["text"]:
        raise invalid(f"'{name}' must be [\"text\"] (audio is not supported)", name,
                      "unsupported_parameter")  # fmt: skip


def output_limit(value: Any, name: str) -> int | None:
    if value == "inf":
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_OUTPUT_TOKENS:
        raise invalid(f"'{name}' must be an integer from 1 to {MAX_OUTPUT_TOKENS} or \"inf\"", name)
    return value


def session_update(event: dict[str, Any], config: SessionConfig, model: str) -> SessionConfig:
    """The session after ``event`` (all of it or nothing: a refused update changes nothing)."""
    session = event.get("session")
    if not isinstance(session, dict):
        raise invalid("'session' must be an object", "session")
    for name, value in session.items():
        if name not in SESSION_FIELDS and value is not None:
            raise unsupported(f"session.{name}")
    if session.get("type", "realtime") != "realtime":
        raise invalid("'session.type' must be \"realtime\" (no transcription sessions)",
                      "session.type", "unsupported_parameter")  # fmt: skip
    if session.get("model") not in (None, model):
        raise invalid(f"this connection serves {model!r}", "session.model", "model_not_found")
    if session.get("output_modalities") is not None:
        modalities(session["output_modalities"], "session.output_modalities")
    if session.get("instructions") is not None:
        if not isinstance(session["instructions"], str):
            raise invalid("'session.instructions' must be a string", "session.instructions")
        config = replace(config, instructions=session["instructions"])
    if "max_output_tokens" in session and session["max_output_tokens"] is not None:
        limit = output_limit(session["max_output_tokens"], "session.max_output_tokens")
        config = replace(config, max_output_tokens=limit)
    return config


def response_limit(event: dict[str, Any], config: SessionConfig) -> tuple[int | None, dict]:
    """``response.create``'s length cap and metadata (its other parameters are refused)."""
    response = event.get("response") or {}
    if not isinstance(response, dict):
        raise invalid("'response' must be an object", "response")
    for name, value in response.items():
        if name not in RESPONSE_FIELDS and value is not None:
            raise unsupported(f"response.{name}")
    if response.get("conversation") not in (None, "auto"):
        raise invalid("'response.conversation' must be \"auto\" (out-of-band responses are not "
                      "supported)", "response.conversation", "unsupported_parameter")  # fmt: skip
    if response.get("output_modalities") is not None:
        modalities(response["output_modalities"], "response.output_modalities")
    metadata = response.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise invalid("'response.metadata' must be an object", "response.metadata")
    limit = config.max_output_tokens
    if response.get("max_output_tokens") is not None:
        limit = output_limit(response["max_output_tokens"], "response.max_output_tokens")
    return limit, metadata


def message_item(item_id: str, role: str, text: str, status: str = "completed") -> dict:
    part = "output_text" if role == "assistant" else "input_text"
    return {"id": item_id, "object": "realtime.item", "type": "message", "role": role,
            "status": status, "content": [{"type": part, "text": text}]}  # fmt: skip


def created_item(event: dict[str, Any], taken: set[str]) -> dict[str, Any]:
    """The item of ``conversation.item.create``: a message of text parts, ``input_text`` for a
    user or system message, ``output_text`` for an assistant one (what the user heard of a
    reply: it enters the state only when a response renders it)."""
    item = event.get("item")
    if not isinstance(item, dict):
        raise invalid("'item' must be an object", "item")
    for name in item:
        if name not in ITEM_FIELDS:
            raise unsupported(f"item.{name}")
    if item.get("type") != "message":
        raise invalid("only 'message' items are supported (no function calls)", "item.type",
                      "unsupported_parameter")  # fmt: skip
    role = item.get("role")
    part_type = PART_TYPES.get(role) if isinstance(role, str) else None  # a list is unhashable
    if part_type is None:
        raise invalid("'item.role' must be user, system or assistant", "item.role",
                      "unsupported_parameter")  # fmt: skip
    content = item.get("content")
    if not isinstance(content, list) or not content:
        raise invalid(f"'item.content' must be a non-empty list of {part_type} parts",
                      "item.content")  # fmt: skip
    texts = []
    for i, part in enumerate(content):
        where = f"item.content[{i}]"
        if not isinstance(part, dict) or part.get("type") != part_type:
            raise invalid(f"'{where}' must be an {part_type} part (text only)", where,
                          "unsupported_parameter")  # fmt: skip
        if not isinstance(part.get("text"), str) or set(part) - {"type", "text"}:
            raise invalid(f"'{where}' takes only a 'text' string", where)
        texts.append(part["text"])
    item_id = item.get("id") or new_id("item")
    if not isinstance(item_id, str) or len(item_id) > MAX_ID_CHARS or item_id in taken:
        raise invalid(f"'item.id' must be a new string of at most {MAX_ID_CHARS} characters",
                      "item.id")  # fmt: skip
    return message_item(item_id, role, "".join(texts))


def refuse_truncate(event: dict[str, Any], items: list[dict[str, Any]]) -> NoReturn:
    """Refuse ``conversation.item.truncate`` (an ``ApiError``, always): it cuts a reply's
    *audio* at ``audio_end_ms`` and drops the transcript past it, and this server's replies are
    text, with no audio to cut. The API answers a truncate of a message without audio with
    ``unsupported_content_type`` ("Only model output audio messages can be truncated"); the
    message says how a text client keeps only what was heard instead. A malformed event is
    refused on its first bad field, as any event."""
    item_id = client_string(event, "item_id")
    item = next((i for i in items if i["id"] == item_id), None)
    if item is None:
        raise invalid(f"no item {item_id!r} in the conversation", "item_id", "item_not_found")
    if item["role"] != "assistant":
        raise invalid("only assistant messages can be truncated", "item_id",
                      "unsupported_content_type")  # fmt: skip
    index = event.get("content_index")
    if not is_count(index) or index >= len(item["content"]):
        raise invalid("'content_index' must name a content part of the item (0)",
                      "content_index")  # fmt: skip
    if not is_count(event.get("audio_end_ms")):
        raise invalid("'audio_end_ms' must be a non-negative integer", "audio_end_ms")
    raise invalid(
        "only model output audio messages can be truncated: this item is text, with no audio "
        "to cut at audio_end_ms. To keep only the text the user heard, delete the item "
        "(conversation.item.delete: the last response's reply rolls the state back exactly) "
        "and create an assistant message of that text (conversation.item.create, an "
        "output_text part)",
        "audio_end_ms", "unsupported_content_type",
    )  # fmt: skip


def is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def item_text(item: dict[str, Any]) -> str:
    return "".join(part["text"] for part in item["content"])


def client_string(event: dict[str, Any], name: str, required: bool = True) -> str | None:
    value = event.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value:
        raise invalid(f"'{name}' must be a non-empty string", name)
    return value


def usage(input_tokens: int, cached: int, output_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "total_tokens": input_tokens + output_tokens,
        "input_token_details": {
            "cached_tokens": cached,
            "text_tokens": input_tokens,
            "audio_tokens": 0,
            "image_tokens": 0,
        },  # fmt: skip
        "output_token_details": {"text_tokens": output_tokens, "audio_tokens": 0},
    }
