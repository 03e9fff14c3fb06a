"""``ResponseRun``: one Realtime response, from ``response.created`` to ``response.done``.

The reply is an assistant item added to the conversation when the response starts; its turn
runs on the connection's live session. ``interrupt`` (``response.cancel``, or a new
``response.create`` while this one runs) ends the turn on the replica at once: the tokens
generated so far stay in the state, and ``response.done`` (status ``cancelled``) reports
exactly those as ``usage.output_tokens``. A response whose turn fails ends ``failed`` and its
state is replayed by the next one.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from replica.api import ChatPrompt, SamplingParams
from router.gateway.convert import Refused
from router.gateway.stream_leases import LEASE_S
from router.gateway.turn_streams import NotContinued
from router.http.errors import ApiError
from router.http.realtime_conversation import Checkpoint, LiveConversation
from router.http.realtime_events import message_item, new_id, server_event, usage
from router.http.realtime_metrics import RealtimeMetrics
from router.http.realtime_outbox import Outbox
from router.http.turns import StartedTurn, Turns

log = logging.getLogger(__name__)

STATUS = {"stop": "completed", "length": "incomplete", "interrupted": "cancelled"}
REASON = {"incomplete": "max_output_tokens", "cancelled": "client_cancelled"}


class ResponseRun:
    def __init__(
        self,
        turns: Turns,
        conversation: LiveConversation,
        outbox: Outbox,
        metrics: RealtimeMetrics,
        limit: int | None,
        metadata: dict[str, Any],
    ) -> None:
        self.turns, self.conv, self.outbox, self.metrics = turns, conversation, outbox, metrics
        self.limit, self.metadata = limit, metadata
        self.id, self.item_id = new_id("resp"), new_id("item")
        self.stream = None
        self.cancelled = False
        self.task: asyncio.Task | None = None

    def start(self, instructions: str) -> None:
        """Add the reply's item to the conversation (now: items created later follow it) and
        run the response."""
        items = self.conv.items
        self.previous = items[-1]["id"] if items else None
        self.index = len(items)
        items.append(message_item(self.item_id, "assistant", "", "in_progress"))
        self.task = asyncio.get_running_loop().create_task(self._run(instructions))

    async def interrupt(self) -> None:
        """End the response now, its tokens so far kept (idempotent); returns once it is done."""
        if not self.cancelled and not self.task.done():
            self.cancelled = True
            self.metrics.cancels.inc()
            if self.stream is not None:
                await self._interrupt_turn()
            # else: not submitted yet; ``_run`` interrupts it once it is
        await asyncio.shield(self.task)

    async def _interrupt_turn(self) -> None:
        try:
            await self.turns.gw.on_session(
                self.stream.route,
                "interrupt",
                lambda r: r.replica.interrupt(session_id=r.session_id),
            )
        except Refused:
            pass  # the session is gone: its turn ends with the session's error

    def _response(self, status: str, output: list[dict], usage_: dict | None) -> dict[str, Any]:
        reason = REASON.get(status)
        return {"id": self.id, "object": "realtime.response", "status": status,
                "status_details": {"type": status, "reason": reason} if reason else None,
                "output": output, "conversation_id": None, "output_modalities": ["text"],
                "max_output_tokens": "inf" if self.limit is None else self.limit,
                "metadata": self.metadata or None, "usage": usage_}  # fmt: skip

    async def _run(self, instructions: str) -> None:
        put, item_id = self.outbox.put, self.item_id
        put(server_event("response.created", response=self._response("in_progress", [], None)))
        status, output, text, usage_, error = "failed", [], "", None, None
        items, index, previous = self.conv.items, self.index, self.previous
        try:
            prompt = await self._submit(instructions, index)
            if self.cancelled:  # cancelled while it was being submitted
                await self._interrupt_turn()
            item = message_item(item_id, "assistant", "", "in_progress")
            put(server_event("response.output_item.added", response_id=self.id,
                             output_index=0, item=item))  # fmt: skip
            put(server_event("conversation.item.added", previous_item_id=previous, item=item))
            put(server_event("response.content_part.added", response_id=self.id,
                             item_id=item_id, output_index=0, content_index=0,
                             part={"type": "text", "text": ""}))  # fmt: skip
            out, sent, committed = self.stream.out, 0, 0
            try:
                async for out in self.stream.outputs():
                    if len(out.text) > sent:
                        put(server_event("response.output_text.delta", response_id=self.id,
                                         item_id=item_id, output_index=0, content_index=0,
                                         delta=out.text[sent:]))  # fmt: skip
                        sent = len(out.text)
                committed = out.committed_tokens
            finally:
                self.conv.ended(prompt, out.token_ids, committed, index)
            text = out.text
            status = STATUS[out.finish or "stop"]
            reused = prompt.reused_tokens
            usage_ = usage(reused + len(prompt.token_ids), reused, len(out.token_ids))
            # deletes wait for the response's end and creates append: the item is still there
            done = message_item(item_id, "assistant", text,
                                "completed" if status == "completed" else "incomplete")  # fmt: skip
            items[index] = done
            put(server_event("response.output_text.done", response_id=self.id, item_id=item_id,
                             output_index=0, content_index=0, text=text))  # fmt: skip
            put(server_event("response.content_part.done", response_id=self.id,
                             item_id=item_id, output_index=0, content_index=0,
                             part={"type": "text", "text": text}))  # fmt: skip
            put(server_event("response.output_item.done", response_id=self.id,
                             output_index=0, item=done))  # fmt: skip
            put(server_event("conversation.item.done", previous_item_id=previous, item=done))
            output = [done]
        except Cancelled:
            status = "cancelled"
            self._forget(item_id)
        except ApiError as exc:
            error = exc
            self._forget(item_id)
            if exc.status in (404, 503):  # the session is gone: the next response replays
                self.conv.stale = True
        except Exception:  # noqa: BLE001 - a bug: logged, the response fails without details
            log.exception("realtime response failed")
            error = ApiError(500, "internal error; retry, and report it if it persists")
            self._forget(item_id)
            self.conv.stale = True
        finally:
            if self.stream is not None:
                self.stream.cancel()  # a no-op once the turn has ended
        response = self._response(status, output, usage_)
        if error is not None:
            details = {"type": error.type, "code": error.code, "message": error.message}
            response["status_details"] = {"type": "failed", "error": details}
        self.metrics.responses.labels(status).inc()
        put(server_event("response.done", response=response))

    async def _submit(self, instructions: str, index: int) -> ChatPrompt:
        """Submit the turn (``self.stream``) with the conversation, which the replica renders
        in the same call; its prompt. The new rollback point is forked by the replica in the
        submit's own command, which releases the previous one first (its room is the new
        one's): no round trip, and no step boundary, of their own before the prefill. It waits
        for the connection's background releases first (a rolled-back session's room is the
        fork's too). A rendering that does not continue the state held (the template rewrote
        the past) is submitted again into a fresh session, with the whole conversation."""
        conv = self.conv
        await conv.settled()
        previous, conv.checkpoint = conv.checkpoint, None
        replaced = False
        try:
            if conv.stale:
                await conv.replay()
            try:
                self.stream = await self._start(instructions, index, previous)
            except NotContinued:
                await conv.replay()
                self.stream = await self._start(instructions, index, previous)
            replaced = self.stream.replaced
        finally:
            if previous is not None:
                conv.retire(previous.route, replaced)
        conv.started(self.stream.fork, self.stream.route)
        return self.stream.prompt

    async def _start(
        self, instructions: str, index: int, previous: Checkpoint | None
    ) -> StartedTurn:
        """The turn of the conversation's ``items[:index]`` on its session, forked first in
        the same command, ``previous`` (a rollback point on that replica) released first."""
        if self.cancelled:  # cancelled before its turn was submitted
            raise Cancelled()
        conv = self.conv
        here = previous is not None and previous.route.replica_id == conv.route.replica_id
        return await self.turns.start(
            conv.route,
            SamplingParams(max_new_tokens=self.limit),
            text=conv.chat_input(instructions, index),
            fork_lease_s=LEASE_S,
            replaces=previous.route.session_id if here else None,
        )

    def _forget(self, item_id: str) -> None:
        """A response that produced nothing leaves no item behind."""
        self.conv.items[:] = [i for i in self.conv.items if i["id"] != item_id]


class Cancelled(Exception):
    """The response was cancelled before its turn started."""
