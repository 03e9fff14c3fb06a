"""The wire format of a gateway's output socket (``OutputServer`` on the replica,
``read_socket_outputs`` on the gateway): frames of a kind byte and a length, one way, after a hello.

The gateway opens the connection and says who it is: ``HELLO`` (the replica's secret, the
``OutputAddress.token`` it got through Ray, then the gateway id). The replica reads that hello
without unpickling anything, so a peer without the secret never reaches the pickle path; it
closes a connection whose hello is wrong or late, or that it has no room for. From then on
only the replica sends: ``READY`` first (the gateway reads the Ray stream instead when the
connection closes before it), then ``ITEM`` (a pickled list of ``replica.api.DeliveryEntry``,
everything produced for the gateway since the last one; empty: a heartbeat while nothing comes),
then ``END`` (the replica shuts down: its stream ended quietly) or ``FAILED`` (its engine died:
the UTF-8 reason). A connection that closes without either is a broken stream: the replica's
process is gone.
"""

from __future__ import annotations

import pickle
import socket
import struct

from replica.api import DeliveryEntry

TOKEN_BYTES = 32
HELLO = struct.Struct("<32sH")  # token, length of the UTF-8 gateway id that follows
HEADER = struct.Struct("<BI")  # kind, payload length
READY, ITEM, END, FAILED = 0, 1, 2, 3
MAX_GATEWAY_ID = 1024
# a peer whose host vanished is found by keepalive when idle, by the user timeout when data waits
KEEPALIVE = {"TCP_KEEPIDLE": 10, "TCP_KEEPINTVL": 5, "TCP_KEEPCNT": 3}
USER_TIMEOUT_MS = 30_000


def tune(sock: socket.socket) -> None:
    """Both ends' options: a step's tokens go out at once, a vanished peer is found."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    options = {**KEEPALIVE, "TCP_USER_TIMEOUT": USER_TIMEOUT_MS}
    for name, value in options.items():
        if hasattr(socket, name):  # Linux; elsewhere the system's defaults
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


def listen(host: str, backlog: int) -> socket.socket:
    """A listening socket on ``host`` (Ray's node address, IPv4 or IPv6), a port the system
    picks: the replica's end of its sockets."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, 0), family=family, backlog=backlog)


def hello(token: bytes, gateway_id: str) -> bytes:
    name = gateway_id.encode()
    if len(name) > MAX_GATEWAY_ID:
        raise ValueError(f"gateway id longer than {MAX_GATEWAY_ID} bytes")
    return HELLO.pack(token, len(name)) + name


def ready() -> bytes:
    return HEADER.pack(READY, 0)


def item(entries: list[DeliveryEntry]) -> bytes:
    payload = pickle.dumps(entries, protocol=5)
    return HEADER.pack(ITEM, len(payload)) + payload


def end() -> bytes:
    return HEADER.pack(END, 0)


def failed(why: str) -> bytes:
    payload = why.encode()
    return HEADER.pack(FAILED, len(payload)) + payload
