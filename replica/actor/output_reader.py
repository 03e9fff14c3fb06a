"""``read_socket_outputs``: a gateway's end of its output socket to one replica
(``replica.actor.output_server``, format in ``replica.actor.output_wire``).

The connection counts as taken once the replica's ``READY`` came (before that, any failure is
``SocketNotTaken``). Frames are handed out as they arrive, in the event loop's read callback:
each item's entries go to ``on_entries`` with no task, future or coroutine per item. The read
returns when the replica
ends the stream (``END``: it shuts down) and raises when it cannot go on: ``ReplicaStreamError``
with the replica's reason when its engine died (``FAILED``), or when the connection closed
without a word (its process is gone). TCP keepalive finds a replica whose host vanished
(``output_wire.tune``, both ends' socket options).
"""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import Callable

from replica.actor import output_wire as wire
from replica.api import DeliveryEntry, OutputAddress

CONNECT_TIMEOUT_S = 5.0


class ReplicaStreamError(ConnectionError):
    """The replica's output stream broke: its engine died, or its process did."""


class SocketNotTaken(ConnectionError):
    """No connection was made, or the replica did not take it: nothing was read."""


class _Reader(asyncio.Protocol):
    def __init__(self, greeting: bytes, on_entries: Callable[[list[DeliveryEntry]], None]) -> None:
        self.greeting = greeting
        self.on_entries = on_entries
        loop = asyncio.get_running_loop()
        self.ready: asyncio.Future = loop.create_future()  # the replica took the connection
        self.ended: asyncio.Future = loop.create_future()
        self.transport: asyncio.Transport | None = None
        self._buffer = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            wire.tune(sock)
        self.transport.write(self.greeting)

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        at = 0
        try:
            while len(buffer) - at >= wire.HEADER.size:
                kind, size = wire.HEADER.unpack_from(buffer, at)
                start = at + wire.HEADER.size
                if len(buffer) - start < size:
                    break
                at = start + size
                if kind == wire.ITEM:
                    self.on_entries(pickle.loads(buffer[start:at]))
                elif kind == wire.READY:
                    _settle(self.ready)
                else:
                    self._finish(kind, bytes(buffer[start:at]))
                    return
        except Exception as exc:  # noqa: BLE001 - a bad frame or a failing hand-out ends the read
            self._fail(exc)
        finally:
            del buffer[:at]

    def connection_lost(self, exc: Exception | None) -> None:
        why = f": {exc}" if exc else ""
        _settle(self.ready, ConnectionRefusedError(f"the replica did not take the socket{why}"))
        self._fail(ReplicaStreamError(f"the replica's output socket closed{why}"))

    def _finish(self, kind: int, payload: bytes) -> None:
        if kind == wire.END:
            _settle(self.ended)
            self.transport.close()
        else:
            self._fail(ReplicaStreamError(payload.decode(errors="replace") or f"frame {kind}"))

    def _fail(self, exc: BaseException) -> None:
        _settle(self.ended, exc)
        if self.transport is not None:
            self.transport.close()


def _settle(future: asyncio.Future, error: BaseException | None = None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)


async def read_socket_outputs(
    address: OutputAddress, gateway_id: str, on_entries: Callable[[list[DeliveryEntry]], None]
) -> None:
    """Read ``gateway_id``'s outputs from ``address``, each item to ``on_entries``, until the
    replica ends the stream. ``SocketNotTaken`` when the replica does not take the connection
    (nothing was read: the caller may read the Ray stream instead)."""
    loop = asyncio.get_running_loop()
    greeting = wire.hello(address.token, gateway_id)
    transport = None
    try:
        transport, reader = await asyncio.wait_for(
            loop.create_connection(
                lambda: _Reader(greeting, on_entries), address.host, address.port
            ),
            CONNECT_TIMEOUT_S,
        )
        await asyncio.wait_for(reader.ready, CONNECT_TIMEOUT_S)  # cancelled when it times out
    except OSError as exc:  # refused, timed out, or closed before READY
        if transport is not None:
            transport.close()
        raise SocketNotTaken(f"{address.host}:{address.port}: {exc}") from exc
    try:
        await reader.ended
    finally:
        transport.close()
