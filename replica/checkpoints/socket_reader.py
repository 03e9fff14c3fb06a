"""``CheckpointSocketReader``: a checkpoint store's end of its socket to the replica
(``replica.actor.checkpoint_socket``; format in ``replica.checkpoints.socket_wire``).

``connect`` presents the secret and waits for ``READY``: anything short of it is
``SocketNotTaken`` (nothing was read; the store reads the Ray stream instead). ``items`` then
yields each item's entries, answering ``TAKEN`` as soon as the whole item is in (the replica
counts it stored from then on, and sends the next), and returns at ``END`` or when the
connection closes (the replica's process is gone: every item taken so far is in hand).
Torch-free: the entries' arrays are numpy arrays over the bytes read.
"""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import AsyncIterator
from typing import Any

from replica.actor.output_reader import SocketNotTaken
from replica.actor.output_wire import tune
from replica.api import OutputAddress
from replica.checkpoints import socket_wire as wire

CONNECT_TIMEOUT_S = 5.0
READ_LIMIT = 1 << 20  # the reader's buffer: large items arrive in large reads


class CheckpointSocketReader:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def connect(cls, address: OutputAddress) -> CheckpointSocketReader:
        """Connected and taken by the replica; ``SocketNotTaken`` otherwise."""
        writer = None
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                reader, writer = await asyncio.open_connection(
                    address.host, address.port, limit=READ_LIMIT
                )
                tune(writer.get_extra_info("socket"))
                writer.write(address.token)
                kind, _, _ = wire.HEADER.unpack(await reader.readexactly(wire.HEADER.size))
            if kind != wire.READY:
                raise ConnectionError(f"frame {kind} before READY")
        except (OSError, asyncio.IncompleteReadError) as exc:  # TimeoutError included
            if writer is not None:
                writer.close()
            raise SocketNotTaken(f"{address.host}:{address.port}: {exc!r}") from exc
        return cls(reader, writer)

    async def items(self) -> AsyncIterator[list[Any]]:
        """Each item's entries, until ``END`` or the connection's close; the connection is
        closed when this ends."""
        reader, writer = self.reader, self.writer
        try:
            while True:
                try:
                    head = await reader.readexactly(wire.HEADER.size)
                    kind, size, count = wire.HEADER.unpack(head)
                    if kind != wire.ITEM:
                        return  # END (or nonsense: the stream is over either way)
                    lengths = wire.lengths(await reader.readexactly(8 * count))
                    data = await reader.readexactly(size)
                    buffers = [await reader.readexactly(n) for n in lengths]
                except (OSError, asyncio.IncompleteReadError):
                    return  # the replica's process is gone
                writer.write(wire.signal(wire.TAKEN))
                yield pickle.loads(data, buffers=buffers)
        finally:
            writer.close()
