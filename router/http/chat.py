"""``POST /v1/chat/completions`` and ``POST /v1/completions``: stateless turns on a fresh
session each, streamed as server-sent events or answered whole.

A chat request's messages are rendered with the model's chat template on a replica; a
completion's prompt is text (tokenized by the replica) or token ids. The session is closed
when the answer is complete, or when the client goes away (its turn is cancelled first).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from replica.api import SamplingParams
from router.http import wire
from router.http.errors import ApiError, invalid
from router.http.metrics import HttpMetrics
from router.http.sse import DONE, EventStream, data, guarded
from router.http.turns import StartedTurn, TurnOutput, Turns

CHAT_FIELDS = {"model", "messages", "max_tokens", "max_completion_tokens", "temperature",
               "top_p", "seed", "stop", "stream", "stream_options", "user", "top_k",
               "ignore_eos", "metadata"}  # fmt: skip
COMPLETION_FIELDS = {"model", "prompt", "max_tokens", "temperature", "top_p", "seed", "stop",
                     "stream", "stream_options", "user", "top_k", "ignore_eos"}  # fmt: skip
CHAT_DEFAULT_ONLY = {"n", "presence_penalty", "frequency_penalty", "logprobs", "top_logprobs",
                     "tools", "tool_choice", "parallel_tool_calls", "response_format",
                     "logit_bias", "service_tier", "store"}  # fmt: skip
COMPLETION_DEFAULT_ONLY = {"n", "presence_penalty", "frequency_penalty", "logprobs", "best_of",
                           "echo", "suffix", "logit_bias"}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Turn:
    """A parsed request: what to feed, how to sample, how to answer."""

    sampling: SamplingParams
    stream: bool
    include_usage: bool
    token_ids: list[int] | None = None
    text: str | None = None
    prefix: list[int] | None = None  # tokens the session starts holding (from the cache)


def parse_stream(body: dict[str, Any]) -> tuple[bool, bool]:
    stream = wire.boolean(body, "stream", False)
    options = body.get("stream_options")
    if options is None:
        return stream, False
    if not isinstance(options, dict) or set(options) - {"include_usage", "include_obfuscation"}:
        raise invalid("'stream_options' takes only include_usage", "stream_options")
    if not stream:
        raise invalid("'stream_options' is only allowed with stream: true", "stream_options")
    return stream, wire.boolean(options, "include_usage", False)


def check_model(body: dict[str, Any], served: str) -> None:
    model = wire.string(body, "model", required=True)
    if model != served:
        raise ApiError(
            404,
            f"the model {model!r} is not served here; this server serves {served!r} "
            "(GET /v1/models)",
            "model",
            "model_not_found",
        )


class Completions:
    def __init__(self, turns: Turns, metrics: HttpMetrics, model_name: Callable[[], str]) -> None:
        self.turns = turns
        self.metrics = metrics
        self.model_name = model_name

    async def chat(self, body: dict[str, Any], tenant: str):
        """The answer to a chat completion request: a JSON body or an SSE stream."""
        wire.check_fields(body, CHAT_FIELDS, CHAT_DEFAULT_ONLY)
        check_model(body, self.model_name())
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise invalid("'messages' must be a non-empty list", "messages")
        chat = [wire.chat_message(m, f"messages[{i}]", ("text",)) for i, m in enumerate(messages)]
        if not isinstance(body.get("metadata", {}), dict):
            raise invalid("'metadata' must be an object", "metadata")
        new = wire.integer(body, "max_completion_tokens", 1)
        if new is None:
            new = wire.integer(body, "max_tokens", 1)
        stream, usage = parse_stream(body)
        sampling = wire.sampling(body, new)
        prompt = await self.turns.chat_prompt(chat)
        # the whole prompt but its last token is the session's prefix: what the replicas' cache
        # holds of it is not prefilled again (a resent history, a shared system prompt)
        turn = Turn(sampling, stream, usage, token_ids=prompt.token_ids[-1:],
                    prefix=prompt.token_ids[:-1])  # fmt: skip
        return await self._answer(turn, tenant, ChatShape, "chat_completions")

    async def complete(self, body: dict[str, Any], tenant: str):
        wire.check_fields(body, COMPLETION_FIELDS, COMPLETION_DEFAULT_ONLY)
        check_model(body, self.model_name())
        text, ids = completion_prompt(body.get("prompt"))
        stream, usage = parse_stream(body)
        sampling = wire.sampling(body, wire.integer(body, "max_tokens", 1))
        turn = Turn(sampling, stream, usage, token_ids=ids, text=text)
        return await self._answer(turn, tenant, TextShape, "completions")

    async def _answer(self, turn: Turn, tenant: str, shape: type[Shape], route_name: str):
        route = await self.turns.open(tenant, prefix_ids=turn.prefix)
        cached = self.turns.cached_tokens(route)
        try:
            started = await self.turns.start(route, turn.sampling, turn.token_ids, turn.text)
        except BaseException:
            self.turns.release(route.session_id, tenant)
            raise
        answer_id = f"{shape.prefix}-{secrets.token_hex(12)}"
        answer = shape(answer_id, int(time.time()), self.model_name())
        events = self._run(route.session_id, started, turn, tenant, answer, route_name, cached)
        if turn.stream:
            return await EventStream.start(guarded(events))
        async for _ in events:  # the whole turn
            pass
        return answer.whole()

    async def _run(
        self,
        session_id: str,
        started: StartedTurn,
        turn: Turn,
        tenant: str,
        answer: Shape,
        route_name: str,
        cached: int,
    ) -> AsyncIterator[bytes]:
        try:
            if turn.stream and isinstance(answer, ChatShape):
                yield data(answer.chunk(role=True))
            out, sent = started.out, 0
            async for out in started.outputs():
                if turn.stream and (len(out.text) > sent or out.finish):
                    yield data(answer.chunk(out.text[sent:], out.finish))
                    sent = len(out.text)
            prompt_tokens = out.committed_tokens - len(out.token_ids)
            answer.finish(out, prompt_tokens, cached)
            self.metrics.observe_prompt(route_name, prompt_tokens, cached)
            if turn.stream:
                if turn.include_usage:
                    yield data(answer.usage_chunk())
                yield DONE
        finally:
            started.cancel()  # a no-op once the turn has ended
            self.turns.release(session_id, tenant)


def completion_prompt(prompt: Any) -> tuple[str | None, list[int] | None]:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        if not prompt:
            raise invalid("'prompt' must not be empty", "prompt")
        return prompt, None
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        return None, prompt
    raise invalid("'prompt' must be a string or a list of token ids (one prompt per request)",
                  "prompt")  # fmt: skip


class Shape:
    """The JSON of one answer, whole or as chunks."""

    prefix = ""

    def __init__(self, answer_id: str, created: int, model: str) -> None:
        self.id, self.created, self.model = answer_id, created, model
        self.out = TurnOutput()
        self.usage: dict[str, Any] = {}

    def finish(self, out: TurnOutput, prompt_tokens: int, cached: int) -> None:
        self.out = out
        self.usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": len(out.token_ids),
            "total_tokens": prompt_tokens + len(out.token_ids),
            "prompt_tokens_details": {"cached_tokens": cached},
        }

    def head(self, kind: str) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def usage_chunk(self) -> dict[str, Any]:
        return {**self.head(self.chunk_kind), "choices": [], "usage": self.usage}

    chunk_kind = ""


class ChatShape(Shape):
    prefix, chunk_kind = "chatcmpl", "chat.completion.chunk"

    def chunk(self, text: str = "", finish: str | None = None, role: bool = False):
        delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
        if text:
            delta["content"] = text
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        return {**self.head(self.chunk_kind), "choices": [choice]}

    def whole(self) -> dict[str, Any]:
        message = {"role": "assistant", "content": self.out.text, "refusal": None}
        choice = {"index": 0, "message": message, "finish_reason": self.out.finish,
                  "logprobs": None}  # fmt: skip
        return {**self.head("chat.completion"), "choices": [choice], "usage": self.usage}


class TextShape(Shape):
    prefix, chunk_kind = "cmpl", "text_completion"

    def chunk(self, text: str = "", finish: str | None = None, role: bool = False):
        choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
        return {**self.head(self.chunk_kind), "choices": [choice]}

    def whole(self) -> dict[str, Any]:
        choice = {"index": 0, "text": self.out.text, "finish_reason": self.out.finish,
                  "logprobs": None}  # fmt: skip
        return {**self.head("text_completion"), "choices": [choice], "usage": self.usage}
