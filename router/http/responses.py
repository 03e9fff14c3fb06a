"""``POST /v1/responses`` (streamed or not), ``GET`` / ``DELETE /v1/responses/{id}`` and
``GET /v1/responses/{id}/input_items``, on live conversation state.

A stored response keeps a session whose state is the conversation through its reply (the
prompt and the generated tokens, EOS included). A request with ``previous_response_id`` forks
that session — so two continuations of one response are independent and both exact — and feeds
only what the chat template renders past the text already in the state: its cost is its new
tokens, reported as ``cached_tokens``. If the state is gone (evicted, its session released) or
the rendering no longer begins with it (other ``instructions``), the stored conversation is
replayed into a new session instead: slower, never an error. An unfinished response (a failed
turn, a client that went away) is not stored and holds nothing.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from router.control.api import Route
from router.control.response_records import StoredResponse
from router.control.response_store import ResponseStoreClient
from router.http import wire
from router.http.chat import check_model, parse_stream
from router.http.errors import ApiError, invalid
from router.http.metrics import HttpMetrics
from router.http.response_items import (
    chat_of,
    input_items,
    new_id,
    output_message,
    output_text,
    public,
    response_object,
    usage,
)
from router.http.sse import EventStream, data, guarded
from router.http.turns import StartedTurn, Turns

FIELDS = {"model", "input", "instructions", "max_output_tokens", "temperature", "top_p",
          "store", "metadata", "previous_response_id", "stream", "user", "top_k", "seed",
          "ignore_eos", "stream_options"}  # fmt: skip
DEFAULT_ONLY = {"tools", "tool_choice", "parallel_tool_calls", "text", "truncation",
                "reasoning", "include", "service_tier", "top_logprobs"}  # fmt: skip
MAX_METADATA = 16


def not_found(response_id: str) -> ApiError:
    return ApiError(
        404, f"no response {response_id!r} (unknown, deleted, expired, or not yours)", "id",
        "not_found",
    )  # fmt: skip


class Responses:
    def __init__(
        self,
        turns: Turns,
        metrics: HttpMetrics,
        model_name: Callable[[], str],
        store: ResponseStoreClient | None,
        ttl_s: float,
    ) -> None:
        self.turns = turns
        self.metrics = metrics
        self.model_name = model_name
        self.store = store
        self.ttl_s = ttl_s

    def _store(self) -> ResponseStoreClient:
        if self.store is None:
            raise ApiError(503, "this cluster has no response store; restart its serve", code=None)
        return self.store

    # ----- create ---------------------------------------------------------------------------

    async def create(self, body: dict[str, Any], tenant: str):
        wire.check_fields(body, FIELDS, DEFAULT_ONLY)
        check_model(body, self.model_name())
        items = input_items(body.get("input"))
        instructions = wire.string(body, "instructions")
        store = wire.boolean(body, "store", True)
        metadata = body.get("metadata") or {}
        if (
            not isinstance(metadata, dict)
            or len(metadata) > MAX_METADATA
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())
        ):
            raise invalid(f"'metadata' must map at most {MAX_METADATA} strings to strings",
                          "metadata")  # fmt: skip
        stream, _ = parse_stream(body)
        sampling = wire.sampling(body, wire.integer(body, "max_output_tokens", 1))
        previous_id = wire.string(body, "previous_response_id")
        previous = None
        if previous_id is not None:
            previous = await self._store().get(response_id=previous_id, tenant=tenant)
            if previous is None:
                raise not_found(previous_id)
        elif store:
            self._store()
        history = previous.conversation if previous is not None else []
        conversation = [*history, *chat_of(items)]
        system = [{"role": "system", "content": instructions}] if instructions else []
        route, prompt = await self._state_for([*system, *conversation], previous, tenant, store)
        try:
            started = await self.turns.start(route, sampling, prompt.fed)
        except BaseException:
            self.turns.release(route.session_id, tenant)
            raise
        made = Made(new_id("resp"), int(time.time()), self.model_name(), body, new_id("msg"))
        run = self._run(made, route, started, prompt, previous, items, conversation, tenant)
        if stream:
            return await EventStream.start(guarded(run, named=True))
        async for _ in run:
            pass
        return made.response

    async def _state_for(
        self,
        messages: list[dict[str, str]],
        previous: StoredResponse | None,
        tenant: str,
        store: bool,
    ) -> tuple[Route, Prompt]:
        """The session this turn runs on and what it feeds: a fork of the previous response's
        state fed only the new part, else a new session holding the conversation's prompt but
        its last token (what the replicas' turn-boundary cache holds of it is not prefilled)."""
        if previous is not None and previous.session_id and previous.state_ids:
            prompt = await self.turns.chat_prompt(messages, previous.state_ids)
            if prompt.reused_tokens:
                route = await self.turns.fork(previous.session_id, tenant)
                if route is not None:
                    held = previous.state_ids
                    return route, Prompt(held, prompt.token_ids, len(held))
                await self._store().forget_state(response_id=previous.response_id)
        ids = (await self.turns.chat_prompt(messages)).token_ids
        route = await self.turns.open(tenant, self.ttl_s if store else 0.0, prefix_ids=ids[:-1])
        cached = self.turns.cached_tokens(route)
        return route, Prompt(ids[:-1], ids[-1:], cached)

    async def _run(
        self,
        made: Made,
        route,
        started: StartedTurn,
        prompt: Prompt,
        previous: StoredResponse | None,
        items: list[dict[str, Any]],
        conversation: list[dict[str, str]],
        tenant: str,
    ) -> AsyncIterator[bytes]:
        keep = False
        try:
            yield made.event("response.created", response=made.snapshot("in_progress"))
            yield made.event("response.in_progress", response=made.snapshot("in_progress"))
            item = output_message(made.item_id, "", "in_progress")
            yield made.event("response.output_item.added", output_index=0, item=item)
            yield made.event("response.content_part.added", item_id=made.item_id,
                             output_index=0, content_index=0, part=output_text(""))  # fmt: skip
            out, sent = started.out, 0
            async for out in started.outputs():
                if len(out.text) > sent:
                    yield made.event("response.output_text.delta", item_id=made.item_id,
                                     output_index=0, content_index=0,
                                     delta=out.text[sent:], logprobs=[])  # fmt: skip
                    sent = len(out.text)
            status = "completed" if out.finish == "stop" else "incomplete"
            prompt_tokens = len(prompt.held) + len(prompt.fed)
            made.finish(out.text, status, usage(prompt_tokens, prompt.cached,
                                                len(out.token_ids)))  # fmt: skip
            self.metrics.observe_prompt("responses", prompt_tokens, prompt.cached)
            yield made.event("response.output_text.done", item_id=made.item_id, output_index=0,
                             content_index=0, text=out.text, logprobs=[])  # fmt: skip
            yield made.event("response.content_part.done", item_id=made.item_id,
                             output_index=0, content_index=0,
                             part=output_text(out.text))  # fmt: skip
            yield made.event("response.output_item.done", output_index=0,
                             item=made.response["output"][0])  # fmt: skip
            if made.response["store"]:
                state = [*prompt.held, *prompt.fed, *out.token_ids]
                record = StoredResponse(
                    made.response_id,
                    tenant,
                    made.response,
                    items,
                    [*conversation, {"role": "assistant", "content": out.text}],
                    state if len(state) == out.committed_tokens else None,
                    route.session_id,
                    route.replica_id,
                )
                for session_id, owner in await self._store().put(record=record):
                    self.turns.release(session_id, owner)
                keep = True
            yield made.event(f"response.{status}", response=made.response)
        finally:
            started.cancel()  # a no-op once the turn has ended
            if not keep:
                self.turns.release(route.session_id, tenant)

    # ----- read, delete ---------------------------------------------------------------------

    async def get(self, response_id: str, tenant: str) -> dict[str, Any]:
        record = await self._store().get(response_id=response_id, tenant=tenant)
        if record is None:
            raise not_found(response_id)
        return record.body

    async def delete(self, response_id: str, tenant: str) -> dict[str, Any]:
        deleted, release = await self._store().delete(response_id=response_id, tenant=tenant)
        if not deleted:
            raise not_found(response_id)
        for session_id, owner in release:
            await self.turns.close(session_id, owner)
        return {"id": response_id, "object": "response.deleted", "deleted": True}

    async def input_items(
        self, response_id: str, tenant: str, query: dict[str, str]
    ) -> dict[str, Any]:
        record = await self._store().get(response_id=response_id, tenant=tenant)
        if record is None:
            raise not_found(response_id)
        order = query.get("order", "desc")
        if order not in ("asc", "desc"):
            raise invalid("'order' must be asc or desc", "order")
        limit = query.get("limit", "20")
        if not limit.isdigit() or not 1 <= int(limit) <= 100:
            raise invalid("'limit' must be an integer from 1 to 100", "limit")
        items = public(record.input_items)
        if order == "desc":
            items.reverse()
        after = query.get("after")
        if after is not None:
            ids = [item["id"] for item in items]
            items = items[ids.index(after) + 1 :] if after in ids else []
        page = items[: int(limit)]
        return {
            "object": "list",
            "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": len(items) > len(page),
        }


@dataclass(frozen=True, slots=True)
class Prompt:
    """What a turn's session holds before it (``held``: a forked state or a cache prefix) and
    what the turn feeds; ``cached``: the prompt tokens not prefilled for it."""

    held: list[int]
    fed: list[int]
    cached: int


class Made:
    """The response being made: its id, its events in order, its final object."""

    def __init__(
        self, response_id: str, created: int, model: str, request: dict[str, Any], item_id: str
    ) -> None:
        self.response_id, self.created, self.model = response_id, created, model
        self.request, self.item_id = request, item_id
        self.sequence = 0
        self.response: dict[str, Any] = self.snapshot("in_progress")

    def snapshot(self, status: str) -> dict[str, Any]:
        return response_object(
            self.response_id, self.created, self.model, self.request, status, [], None
        )

    def finish(self, text: str, status: str, usage_: dict[str, Any]) -> None:
        output = [output_message(self.item_id, text, status)]
        self.response = response_object(
            self.response_id, self.created, self.model, self.request, status, output, usage_
        )

    def event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return data(payload, kind)
