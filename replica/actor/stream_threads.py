"""``StreamThreads``: the threads a replica streams its gateways' outputs on.

A gateway's output stream is one call that lasts as long as the gateway streams. From a plain
generator on a thread of its own, an item costs the replica about a fifth less CPU than from an
async generator on the event loop (``bench.delivery``), but Ray runs the synchronous methods of an
async actor's concurrency group on that group's one thread, one call at a time: a second stream
in a group would wait for the first to end. So the replica has ``OUTPUT_STREAM_THREADS``
concurrency groups of one thread each (``concurrency_groups()``, declared with the actor class),
and hands a free one to each gateway just before it streams (``reserve``: the group its stream
call must name); the stream gives it back when it ends (``release``). When none is free the
gateway streams from the event loop (``reserve`` answers ""). A group is never handed out twice
while held: a gateway that dies between its ``reserve`` and its stream call keeps its group
reserved for good (one thread fewer, never a stream that waits). Used from the event loop and the
stream threads, under a lock.
"""

from __future__ import annotations

import threading

OUTPUT_STREAM_THREADS = 8  # gateways streaming from one replica on threads (more: event loop)
GROUP_PREFIX = "outputs-"
FIRST_GROUP = f"{GROUP_PREFIX}0"  # the stream method's own group (a caller names the one it holds)


def concurrency_groups(threads: int = OUTPUT_STREAM_THREADS) -> dict[str, int]:
    """The concurrency groups of the actor class: one thread each."""
    return {f"{GROUP_PREFIX}{i}": 1 for i in range(threads)}


class StreamThreads:
    def __init__(self, threads: int = OUTPUT_STREAM_THREADS) -> None:
        self._free = list(reversed(concurrency_groups(threads)))  # handed out from the end
        self._held: dict[str, str] = {}  # group -> the gateway it was handed to
        self._lock = threading.Lock()

    def reserve(self, gateway_id: str) -> str:
        """A free group for ``gateway_id``'s next stream, held until that stream ends; "" when
        none is free (it streams from the event loop)."""
        with self._lock:
            if not self._free:
                return ""
            group = self._free.pop()
            self._held[group] = gateway_id
            return group

    def release(self, group: str) -> None:
        """The stream on ``group`` ended: the group is free again (idempotent)."""
        with self._lock:
            if self._held.pop(group, None) is not None:
                self._free.append(group)

    def held(self) -> dict[str, str]:
        """Group -> gateway, for the groups handed out now."""
        with self._lock:
            return dict(self._held)
