"""The items and objects of the Responses API as this server writes them: input items read
from a request, output messages, the Response object and its usage."""

from __future__ import annotations

import secrets
from typing import Any

from router.http import wire
from router.http.errors import invalid

INPUT_PARTS = ("input_text", "output_text", "text")


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


def input_items(value: Any) -> list[dict[str, Any]]:
    """The request's ``input`` as message items with ids: a string is one user message."""
    if isinstance(value, str):
        if not value:
            raise invalid("'input' must not be empty", "input")
        value = [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise invalid("'input' must be a string or a non-empty list of message items", "input")
    items = []
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if isinstance(item, dict) and item.get("type", "message") != "message":
            raise invalid(
                f"{where}: items of type {item.get('type')!r} are not supported (messages only)",
                where,
            )
        message = wire.chat_message(item, where, INPUT_PARTS)
        part = "output_text" if message["role"] == "assistant" else "input_text"
        items.append(
            {
                "id": new_id("msg"),
                "type": "message",
                "role": item["role"],
                "status": "completed",
                "content": [{"type": part, "text": message["content"]}],
                "_chat": message,
            }
        )
    return items


def chat_of(items: list[dict[str, Any]]) -> list[dict[str, str]]:
    return [item["_chat"] for item in items]


def public(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in item.items() if not k.startswith("_")} for item in items]


def output_message(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": [output_text(text)],
    }


def output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def usage(prompt_tokens: int, cached: int, output_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": prompt_tokens,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt_tokens + output_tokens,
    }


def response_object(
    response_id: str,
    created: int,
    model: str,
    request: dict[str, Any],
    status: str,
    output: list[dict[str, Any]],
    usage_: dict[str, Any] | None,
) -> dict[str, Any]:
    incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    return {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "status": status,
        "error": None,
        "incomplete_details": incomplete,
        "instructions": request.get("instructions"),
        "max_output_tokens": request.get("max_output_tokens"),
        "model": model,
        "output": output,
        "parallel_tool_calls": False,
        "previous_response_id": request.get("previous_response_id"),
        "store": request.get("store", True) is not False,
        "temperature": request.get("temperature"),
        "top_p": request.get("top_p"),
        "text": {"format": {"type": "text"}},
        "tool_choice": "none",
        "tools": [],
        "truncation": "disabled",
        "background": False,
        "metadata": request.get("metadata") or {},
        "user": request.get("user"),
        "usage": usage_,
    }
