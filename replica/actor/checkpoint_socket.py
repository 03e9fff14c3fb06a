"""``CheckpointSocket``: the replica's end of its checkpoint store's socket.

A turn's last event waits until its checkpoint is in the store (``CheckpointOutbox``). Over the
Ray stream that is a Ray item and its backpressure report: about 1.6 ms of CPU on the two ends
and several ms of waiting for each turn's end. So a store first asks for a socket (``open``,
through Ray, which hands it the address and a secret of its own) and reads the same items from
it (format in ``replica.checkpoints.socket_wire``); the Ray stream stays the fallback (no socket
host, ``--no-output-socket``, or no connection).

Each ``open`` listens on the node's address, port chosen by the system, for one connection that
presents the secret within ``ACCEPT_TIMEOUT_S`` (others are closed unread; an ``open`` before it
came closes the one before); the listener closes then. The accepted store reads what
``items()`` yields (``CheckpointCalls.stream``: the outbox's stream, which replaces any store
before), one item at a time: the next is asked for only once the store said ``TAKEN``, which is
when the outbox counts the item stored. When the stream ends the store gets ``END``; when the
store's connection breaks (it died), the stream is closed, which the outbox reads as its store
leaving. Used on the actor's event loop only; the replica never unpickles what a store sends.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import secrets
import socket
from collections.abc import AsyncIterator, Callable

from replica.actor import output_wire
from replica.actor.tasks import BackgroundTasks
from replica.api import OutputAddress
from replica.checkpoints import socket_wire as wire
from replica.checkpoints.entries import CheckpointEntry

log = logging.getLogger(__name__)

ACCEPT_TIMEOUT_S = 5.0

Items = Callable[[], AsyncIterator[list[CheckpointEntry]]]


class CheckpointSocket:
    def __init__(self, host: str, tasks: BackgroundTasks) -> None:
        """``host``: the node's address, where the store connects."""
        self.host = host
        self.tasks = tasks
        self._accepting: asyncio.Task | None = None  # the latest ``open``'s, until accepted

    def open(self, items: Items) -> OutputAddress:
        """Listen for one store's connection, which then reads ``items()``."""
        self.close()
        listener = output_wire.listen(self.host, backlog=4)
        listener.setblocking(False)
        token = secrets.token_bytes(wire.TOKEN_BYTES)
        accept = self._accepting = self.tasks.spawn(_accept(listener, token))
        self.tasks.spawn(self._serve(listener, accept, items))
        return OutputAddress(self.host, listener.getsockname()[1], token)

    def close(self) -> None:
        """Stop waiting for a store not connected yet (idempotent); a connected one reads on
        until its stream ends. The wait is cancelled, never its socket closed under it: the
        loop would keep watching that socket's number, which the next socket may get."""
        if self._accepting is not None:
            self._accepting.cancel()
            self._accepting = None

    async def _serve(self, listener: socket.socket, accept: asyncio.Task, items: Items) -> None:
        try:
            conn = await accept
        except asyncio.CancelledError:
            if not accept.cancelled():
                raise
            conn = None  # ``close``d, or another ``open`` came
        finally:
            listener.close()
            if self._accepting is accept:
                self._accepting = None
        if conn is not None:
            with conn:
                await _pump(conn, items())


async def _accept(listener: socket.socket, token: bytes) -> socket.socket | None:
    """The first connection that presents ``token`` within ``ACCEPT_TIMEOUT_S``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + ACCEPT_TIMEOUT_S
    while True:
        conn = None
        try:
            async with asyncio.timeout_at(deadline):
                conn, _ = await loop.sock_accept(listener)
                conn.setblocking(False)
                presented = await _read(loop, conn, wire.TOKEN_BYTES)
            if presented is not None and hmac.compare_digest(presented, token):
                output_wire.tune(conn)
                conn, taken = None, conn
                return taken
            log.warning("checkpoint socket: refused a connection without the secret")
        except TimeoutError:  # no store came
            return None
        except OSError as exc:  # that connection failed, not the listener
            log.warning("checkpoint socket: a connection failed: %s", exc)
        finally:  # one not taken (refused, failed, or the wait cancelled) is closed
            if conn is not None:
                conn.close()


async def _pump(conn: socket.socket, items: AsyncIterator[list[CheckpointEntry]]) -> None:
    """Send ``items`` one at a time, each once the one before was ``TAKEN``; ``END`` at the end.
    The stream is closed whatever happens (a store gone: the outbox's stream ends with it)."""
    loop = asyncio.get_running_loop()
    try:
        await loop.sock_sendall(conn, wire.signal(wire.READY))
        async for entries in items:
            for part in wire.item(entries):
                await loop.sock_sendall(conn, part)
            answer = await _read(loop, conn, wire.HEADER.size)
            if answer is None or wire.HEADER.unpack(answer)[0] != wire.TAKEN:
                log.warning("checkpoint socket: the store left during an item")
                return
        await loop.sock_sendall(conn, wire.signal(wire.END))
    except OSError as exc:
        log.warning("checkpoint socket: the store's connection broke: %s", exc)
    finally:
        with contextlib.suppress(Exception):
            await items.aclose()


async def _read(loop: asyncio.AbstractEventLoop, conn: socket.socket, size: int) -> bytes | None:
    """Exactly ``size`` bytes, or None when the peer closed first."""
    data = bytearray()
    while len(data) < size:
        chunk = await loop.sock_recv(conn, size - len(data))
        if not chunk:
            return None
        data += chunk
    return bytes(data)
