"""``StreamThreads``: the threads a replica streams its gateways' outputs on.

A gateway's output stream is one call that lasts as long as the gateway streams. From a plain
generator on a thread of its own, an item costs the replica about a fifth less CPU than from an
async generator on the event loop (``bench.delivery``), but Ray runs the synchronous methods of an
async actor's concurrency group on that group's one thread, one call at a time: a second stream
in a group would wait for the first to end. So the replica has ``OUTPUT_STREAM_THREADS``
concurrency groups of one thread each (``concurrency_groups()``, declared with the actor class),
and hands a free one to each gateway just before it streams (``reserve``: the group its stream
call must name); the stream gives it back when it ends (``release``). When none is free the
gateway streams from the event loop (``reserve`` answers ""). A group is held by one gateway at
a time; one reserved by a gateway that never streamed on it within ``RESERVED_S`` (it died
between the two calls) is free again at the next ``reserve``, and a stream that starts on a
group no longer held for its gateway neither takes nor gives it back (it ends at its next empty
item, its caller being gone). Used from the event loop and the stream threads, under a lock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

OUTPUT_STREAM_THREADS = 8  # gateways streaming from one replica on threads (more: event loop)
GROUP_PREFIX = "outputs-"
RESERVED_S = 60.0  # a reservation whose stream has not started by then is given up
FIRST_GROUP = f"{GROUP_PREFIX}0"  # the stream method's own group (a caller names the one it holds)


def concurrency_groups(threads: int = OUTPUT_STREAM_THREADS) -> dict[str, int]:
    """The concurrency groups of the actor class: one thread each."""
    return {f"{GROUP_PREFIX}{i}": 1 for i in range(threads)}


class StreamThreads:
    def __init__(
        self,
        threads: int = OUTPUT_STREAM_THREADS,
        reserved_s: float = RESERVED_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._free = list(reversed(concurrency_groups(threads)))  # handed out from the end
        # group -> (the gateway it was handed to, when; None once that gateway's stream started)
        self._held: dict[str, tuple[str, float | None]] = {}
        self._reserved_s = reserved_s
        self._clock = clock
        self._lock = threading.Lock()

    def reserve(self, gateway_id: str) -> str:
        """A free group for ``gateway_id``'s next stream, held until that stream ends; "" when
        none is free (it streams from the event loop)."""
        with self._lock:
            now = self._clock()
            for group, (_, at) in list(self._held.items()):
                if at is not None and now - at > self._reserved_s:  # never streamed on
                    del self._held[group]
                    self._free.append(group)
            if not self._free:
                return ""
            group = self._free.pop()
            self._held[group] = (gateway_id, now)
            return group

    def started(self, group: str, gateway_id: str) -> None:
        """``gateway_id``'s stream runs on ``group`` now: its reservation no longer lapses."""
        with self._lock:
            if self._held.get(group, ("",))[0] == gateway_id:
                self._held[group] = (gateway_id, None)

    def release(self, group: str, gateway_id: str) -> None:
        """``gateway_id``'s stream on ``group`` ended: the group is free again, if it was still
        held for that gateway (idempotent)."""
        with self._lock:
            if self._held.get(group, ("",))[0] == gateway_id:
                del self._held[group]
                self._free.append(group)

    def held(self) -> dict[str, str]:
        """Group -> gateway, for the groups handed out now."""
        with self._lock:
            return {group: gateway for group, (gateway, _) in self._held.items()}
