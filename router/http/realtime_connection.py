"""``RealtimeConnection``: one accepted Realtime WebSocket = one live session.

Client events are read as they arrive into a bounded queue (``MAX_QUEUED_EVENTS``; past it the
socket is not read, so a fast client waits on TCP) and acted on strictly in order. A response
runs beside them: items created meanwhile follow its reply, ``response.cancel`` or a new
``response.create`` interrupt it and wait for its ``response.done`` before the next event, and
deletes wait for it too. A refused event is answered with an ``error`` event (its ``event_id``)
and changes nothing. The session and its checkpoint are released however the socket ends.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from router.http.errors import ApiError, invalid
from router.http.realtime_conversation import LiveConversation
from router.http.realtime_events import (
    SessionConfig,
    client_string,
    created_item,
    error_event,
    new_id,
    refuse_truncate,
    response_limit,
    server_event,
    session_update,
)
from router.http.realtime_metrics import RealtimeMetrics
from router.http.realtime_outbox import Outbox
from router.http.realtime_response import ResponseRun
from router.http.turns import Turns
from router.http.websocket_protocol import MAX_MESSAGE_BYTES, POLICY_VIOLATION

MAX_QUEUED_EVENTS = 64
MAX_EVENT_BYTES = MAX_MESSAGE_BYTES  # the protocol refuses bigger ones first (1009)
CLOSED = object()  # the client closed the socket


class RealtimeConnection:
    def __init__(
        self,
        websocket: WebSocket,
        turns: Turns,
        metrics: RealtimeMetrics,
        model: str,
        conversation: LiveConversation,
    ) -> None:
        self.ws, self.turns, self.metrics, self.model = websocket, turns, metrics, model
        self.conv = conversation
        self.outbox = Outbox(websocket)
        self.config = SessionConfig()
        self.session_id = new_id("sess")
        self.inputs: asyncio.Queue[Any] = asyncio.Queue(MAX_QUEUED_EVENTS)
        self.response: ResponseRun | None = None

    async def serve(self) -> int | None:
        """Run until the client closes (None) or must be dropped (the close code to send)."""
        self.outbox.put(server_event("session.created", session=self._session()))
        loop = asyncio.get_running_loop()
        reader, writer = loop.create_task(self._read()), loop.create_task(self.outbox.drain())
        overflow = loop.create_task(self.outbox.overflowed.wait())
        try:
            while True:
                taken = loop.create_task(self.inputs.get())
                await asyncio.wait({taken, overflow, writer}, return_when=asyncio.FIRST_COMPLETED)
                if overflow.done() or writer.done():  # first: a flood keeps ``taken`` ready
                    taken.cancel()
                    if overflow.done():
                        return 1008  # a stalled reader
                    return await self._reader_end(reader)  # a dead socket: why, if the reader knows
                event = taken.result()
                if event is CLOSED:
                    return None
                if isinstance(event, int):
                    return event
                await self._act(event)
        finally:
            for task in (reader, overflow):
                task.cancel()
            if self.response is not None:
                self.response.task.cancel()
                await asyncio.gather(self.response.task, return_exceptions=True)
            self.conv.close()
            if not writer.done():
                await self.outbox.flush(1.0)
            writer.cancel()

    async def _read(self) -> int | None:
        """Take client events into ``inputs`` until the socket ends, then CLOSED (the client
        closed) or the close code to send; returns that code (None: closed)."""
        code = None
        try:
            while True:
                text = await self.ws.receive_text()
                if len(text) > MAX_EVENT_BYTES:
                    code = 1009
                    break
                await self.inputs.put(text)
        except WebSocketDisconnect as exc:  # the protocol drops a flood with 1008
            code = POLICY_VIOLATION if exc.code == POLICY_VIOLATION else None
        except RuntimeError:
            pass
        except KeyError:  # a binary frame: the protocol is JSON text
            code = 1003
        await self.inputs.put(CLOSED if code is None else code)
        return code

    async def _reader_end(self, reader: asyncio.Task) -> int | None:
        """The close code the reader ends with, once the socket is dead (at most 1 s): the
        events it still holds are dropped, so it is not kept waiting on a full queue."""
        deadline = asyncio.get_running_loop().time() + 1.0
        while not reader.done() and asyncio.get_running_loop().time() < deadline:
            while not self.inputs.empty():
                self.inputs.get_nowait()
            await asyncio.wait({reader}, timeout=0.05)
        if not reader.done() or reader.cancelled() or reader.exception() is not None:
            return None
        return reader.result()

    async def _act(self, text: str) -> None:
        event_id = None
        try:
            try:
                event = json.loads(text)
            except ValueError:
                raise invalid("the event is not valid JSON", code="invalid_json") from None
            if not isinstance(event, dict):
                raise invalid("an event must be a JSON object")
            event_id = event.get("event_id") if isinstance(event.get("event_id"), str) else None
            kind = event.get("type")
            handler = HANDLERS.get(kind) if isinstance(kind, str) else None
            if handler is None:
                raise invalid(f"event type {kind!r} is not supported by this server (text only)",
                              "type", "unsupported_event")  # fmt: skip
            await handler(self, event)
        except ApiError as exc:
            self.outbox.put(error_event(exc, event_id))

    def _session(self) -> dict[str, Any]:
        return self.config.public(self.session_id, self.model)

    def _running(self) -> bool:
        return self.response is not None and not self.response.task.done()

    async def _session_update(self, event: dict[str, Any]) -> None:
        updated = session_update(event, self.config, self.model)
        if updated.instructions != self.config.instructions:
            self.conv.stale = True  # the system message changed: the state is replayed
        self.config = updated
        self.outbox.put(server_event("session.updated", session=self._session()))

    async def _item_create(self, event: dict[str, Any]) -> None:
        items = self.conv.items
        previous = client_string(event, "previous_item_id", required=False)
        last = items[-1]["id"] if items else None
        if previous is not None and previous != last:
            raise invalid("items can only be added at the end (previous_item_id: the last item)",
                          "previous_item_id", "unsupported_parameter")  # fmt: skip
        item = created_item(event, {i["id"] for i in items})
        items.append(item)
        self.outbox.put(server_event("conversation.item.added", previous_item_id=last, item=item))
        self.outbox.put(server_event("conversation.item.done", previous_item_id=last, item=item))

    async def _item_delete(self, event: dict[str, Any]) -> None:
        item_id = client_string(event, "item_id")
        items = self.conv.items
        ids = [i["id"] for i in items]
        if item_id not in ids:
            raise invalid(f"no item {item_id!r} in the conversation", "item_id", "item_not_found")
        if self._running():
            raise invalid("an item cannot be deleted while a response runs: cancel it first",
                          "item_id", "response_in_progress")  # fmt: skip
        if item_id != ids[-1]:
            raise invalid("only the last item can be deleted (delete from the end)", "item_id",
                          "unsupported_parameter")  # fmt: skip
        self.conv.delete(len(items) - 1)
        self.outbox.put(server_event("conversation.item.deleted", item_id=item_id))

    async def _item_truncate(self, event: dict[str, Any]) -> None:
        refuse_truncate(event, self.conv.items)  # text only: delete + create keeps what was heard

    async def _item_retrieve(self, event: dict[str, Any]) -> None:
        item_id = client_string(event, "item_id")
        for item in self.conv.items:
            if item["id"] == item_id:
                self.outbox.put(server_event("conversation.item.retrieved", item=item))
                return
        raise invalid(f"no item {item_id!r} in the conversation", "item_id", "item_not_found")

    async def _response_create(self, event: dict[str, Any]) -> None:
        limit, metadata = response_limit(event, self.config)
        if self._running():
            await self.response.interrupt()  # barge-in: the running one ends cancelled first
        self.response = ResponseRun(self.turns, self.conv, self.outbox, self.metrics, limit,
                                    metadata)  # fmt: skip
        self.response.start(self.config.instructions)

    async def _response_cancel(self, event: dict[str, Any]) -> None:
        wanted = client_string(event, "response_id", required=False)
        if not self._running() or wanted not in (None, self.response.id):
            raise invalid("no response in progress to cancel", "response_id",
                          "response_cancel_not_active")  # fmt: skip
        await self.response.interrupt()


HANDLERS = {
    "session.update": RealtimeConnection._session_update,
    "conversation.item.create": RealtimeConnection._item_create,
    "conversation.item.delete": RealtimeConnection._item_delete,
    "conversation.item.retrieve": RealtimeConnection._item_retrieve,
    "conversation.item.truncate": RealtimeConnection._item_truncate,
    "response.create": RealtimeConnection._response_create,
    "response.cancel": RealtimeConnection._response_cancel,
}
