"""``BoundedWebSocketProtocol``: uvicorn's WebSocket protocol (websockets' sans-I/O one) with the
memory one connection can hold on the server bounded, and a peer past a bound dropped with close
code 1008 (policy violation).

uvicorn hands every complete message of a socket read to the app through an unbounded queue (its
``ws_max_queue`` is not used by this implementation) and pauses reading only after the read, so
one read of small frames can queue thousands. Here:

- incoming: a message over ``MAX_MESSAGE_BYTES`` is refused by the parser before it is buffered
  (1009, uvicorn's ``ws_max_size``); at most ``MAX_UNREAD_MESSAGES`` messages
  (``MAX_UNREAD_BYTES``) may wait for the app to take them: one more and the connection is failed
  with 1008;
- outgoing: the socket's kernel send buffer is fixed at ``SEND_BUFFER_BYTES`` (not autotuned up to
  megabytes for a peer that does not read), and a close sent to a peer that does not read (the
  transport is not writable) is not waited on: the close frame is queued behind what the peer has
  not read and the connection is aborted if it is still not gone ``CLOSE_TIMEOUT_S`` later.

The app's own queues (``router.http.realtime_connection``, ``router.http.realtime_outbox``) bound
the rest; together they are the per-connection limits docs/realtime.md states.
"""

from __future__ import annotations

import socket
from collections import deque
from typing import Any

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

MAX_MESSAGE_BYTES = 1 << 20
MAX_UNREAD_MESSAGES = 1024
MAX_UNREAD_BYTES = 4 << 20
SEND_BUFFER_BYTES = 256 << 10
CLOSE_TIMEOUT_S = 10.0
POLICY_VIOLATION = 1008


class BoundedWebSocketProtocol(WebSocketsSansIOProtocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.unread: deque[int] = deque()  # the size of each message the app has not taken
        self.unread_bytes = 0

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)

    def send_receive_event_to_app(self) -> None:
        if self.close_sent:
            return super().send_receive_event_to_app()  # discarded there
        size = sum(len(frame) for frame in self.frames)
        if len(self.unread) >= MAX_UNREAD_MESSAGES or self.unread_bytes + size > MAX_UNREAD_BYTES:
            self.frames = []
            return self.fail(POLICY_VIOLATION, "too many events not taken yet")
        queued = self.queue.qsize()
        super().send_receive_event_to_app()
        if self.queue.qsize() > queued:  # queued (not refused as invalid UTF-8)
            self.unread.append(size)
            self.unread_bytes += size

    async def receive(self) -> Any:
        message = await super().receive()
        if message["type"] == "websocket.receive" and self.unread:
            self.unread_bytes -= self.unread.popleft()
        return message

    async def send(self, message: Any) -> None:
        stalled = self.handshake_complete and not self.writable.is_set()
        if message["type"] == "websocket.close" and stalled and not self.close_sent:
            return self.fail(message.get("code", 1000), message.get("reason") or "")
        await super().send(message)

    def fail(self, code: int, reason: str) -> None:
        """Close now, without waiting for the peer: the close frame goes behind what is queued,
        the events not taken yet are dropped and the app is told the socket ended next, and
        the connection is aborted unless it is gone within ``CLOSE_TIMEOUT_S``."""
        if self.close_sent or self.transport.is_closing():
            return
        self.conn.fail(code, reason)
        self.transport.write(b"".join(self.conn.data_to_send()))
        self.close_sent = True
        while not self.queue.empty():
            self.queue.get_nowait()
        self.unread.clear()
        self.unread_bytes = 0
        self.queue.put_nowait({"type": "websocket.disconnect", "code": code, "reason": reason})
        if self.read_paused:  # read (and discard) what the peer still sends, so no reset
            self.read_paused = False
            self.transport.resume_reading()
        self.close_timer = self.loop.call_later(CLOSE_TIMEOUT_S, self.transport.abort)
