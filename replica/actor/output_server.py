"""``OutputServer``: the replica's end of its gateways' output sockets.

A Ray streaming item of a gateway's token outputs costs about 0.6 ms of CPU in the replica and
1 ms in the gateway, more than a decode step of a small batch on a CPU; the same item as a frame
on a TCP connection costs a seventh to a tenth of that on each side (``bench.delivery`` 3b puts
the gateway's CPU per token at a quarter of the Ray stream's). So each gateway may
read its outputs from a connection of its own to the replica (``replica.actor.output_wire``),
the Ray stream staying as the fallback (``--no-output-socket``, or no connection).

The server listens on the node's address, port chosen by the system. A connection that does not
open with the replica's secret (``OutputAddress.token``, given only through Ray) within
``HELLO_TIMEOUT_S`` is closed unread, as is one beyond ``MAX_CONNECTIONS`` (its gateway reads the
Ray stream instead). Each accepted gateway is served on a thread of its own:
it takes what ``stream(gateway_id)`` yields (``GatewayOutputs.stream``: what waits, merged,
or a heartbeat every second) and sends it; a send that fails (the gateway is gone) closes that
stream, which tells the outputs the gateway left, as the end of a Ray stream does. When the
stream ends the thread sends ``END``, or ``FAILED`` when the engine died. ``close`` stops
accepting; the streams end with the outputs' ``close``.
"""

from __future__ import annotations

import hmac
import logging
import secrets
import socket
import threading
from collections.abc import Callable, Generator

from replica.actor import output_wire as wire
from replica.actor.gateway_outputs import ReplicaFailedError
from replica.api import DeliveryEntry, OutputAddress

log = logging.getLogger(__name__)

HELLO_TIMEOUT_S = 5.0
MAX_CONNECTIONS = 256


class OutputServer:
    def __init__(
        self, stream: Callable[[str], Generator[list[DeliveryEntry], None, None]], host: str
    ) -> None:
        """``stream(gateway_id)``: that gateway's items, a generator run on the connection's
        thread (closed when the gateway is gone)."""
        self._stream = stream
        self._listener = wire.listen(host, backlog=64)
        port = self._listener.getsockname()[1]
        self.address = OutputAddress(host, port, secrets.token_bytes(wire.TOKEN_BYTES))
        self._lock = threading.Lock()
        self._connections = 0
        threading.Thread(target=self._accept, name="output-accept", daemon=True).start()

    def close(self) -> None:
        """Accept no more connections (idempotent)."""
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                full = self._connections >= MAX_CONNECTIONS
                self._connections += not full
            if full:
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn,), name="output", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            with conn:
                gateway_id = self._hello(conn)
                if gateway_id is not None:
                    wire.tune(conn)
                    self._send(conn, gateway_id)
        finally:
            with self._lock:
                self._connections -= 1

    def _hello(self, conn: socket.socket) -> str | None:
        """The gateway id of a hello with the right secret; None (logged) for anything else."""
        conn.settimeout(HELLO_TIMEOUT_S)
        try:
            token, size = wire.HELLO.unpack(_read(conn, wire.HELLO.size))
            if not hmac.compare_digest(token, self.address.token) or size > wire.MAX_GATEWAY_ID:
                raise ValueError("wrong secret")
            gateway_id = _read(conn, size).decode()
        except (OSError, ValueError) as exc:  # UnicodeDecodeError and struct.error included
            log.warning("output socket: refused a connection: %s", exc)
            return None
        conn.settimeout(None)  # a slow gateway holds its sends back, as Ray's stream would
        return gateway_id

    def _send(self, conn: socket.socket, gateway_id: str) -> None:
        try:
            conn.sendall(wire.ready())
        except OSError:
            return  # gone before its stream began
        stream = self._stream(gateway_id)
        try:
            for entries in stream:
                conn.sendall(wire.item(entries))
            conn.sendall(wire.end())
        except ReplicaFailedError as exc:
            _send_quietly(conn, wire.failed(str(exc)))
        except OSError:
            pass  # the gateway is gone: closing its stream (below) tells the outputs
        finally:
            stream.close()


def _read(conn: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise ConnectionError("closed during the hello")
        data += chunk
    return bytes(data)


def _send_quietly(conn: socket.socket, frame: bytes) -> None:
    try:
        conn.sendall(frame)
    except OSError:
        pass
