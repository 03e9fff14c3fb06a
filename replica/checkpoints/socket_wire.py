"""The wire format of a checkpoint store's socket to its replica (``replica.actor.
checkpoint_socket`` on the replica, ``replica.checkpoints.socket_reader`` in the store).

The store opens the connection and presents the secret it got through Ray (``TOKEN_BYTES``
raw bytes, read by the replica without unpickling anything). From then on the replica sends
``READY``, then one ``ITEM`` at a time: a list of checkpoint entries pickled with their arrays
out of band (a checkpoint is mostly raw state bytes: they go on the wire as they are, with no
copy into the pickle, which takes half as long as 64 small records pickled in band); the store
answers each with ``TAKEN`` once it has the whole item, and the replica sends the next only
then (a backpressure of one item, as the Ray stream's). The replica ends with ``END`` (the
store was replaced or disconnected, or the replica shuts down); a connection that closes
without it means the replica's process is gone.

Every frame starts with ``HEADER``: its kind, the pickle's length, and how many out-of-band
buffers follow; an item then carries the buffers' lengths, the pickle, and the buffers.
"""

from __future__ import annotations

import pickle
import struct
from collections.abc import Sequence

TOKEN_BYTES = 32
HEADER = struct.Struct("<BQI")  # kind, pickle length, number of buffers
READY, ITEM, TAKEN, END = 0, 1, 2, 3


def signal(kind: int) -> bytes:
    """A frame with nothing after its header: ``READY``, ``TAKEN`` or ``END``."""
    return HEADER.pack(kind, 0, 0)


def item(entries: Sequence[object]) -> list[bytes | memoryview]:
    """The parts of one ``ITEM`` frame, to be sent in order (the buffers are views of the
    entries' arrays: keep the entries until they are sent)."""
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(list(entries), protocol=5, buffer_callback=buffers.append)
    views = [buffer.raw() for buffer in buffers]
    lengths = struct.pack(f"<{len(views)}Q", *(view.nbytes for view in views))
    return [HEADER.pack(ITEM, len(data), len(views)) + lengths + data, *views]


def lengths(raw: bytes) -> tuple[int, ...]:
    """The buffers' lengths of an item, from the ``8 * count`` bytes after its header."""
    return struct.unpack(f"<{len(raw) // 8}Q", raw)
