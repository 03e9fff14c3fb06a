"""What a Converse stream's client sent and the stream has not acted on yet.

The reader task turns each client message into a typed item (``ClientInput``,
``ClientInterrupt``, ``ClientHalfClosed``, ``ClientFailed``) and puts it in ``PendingInputs``.
Inputs that arrive faster than turns can start are merged, in order, into one input for the next
turn (text to text, tokens to tokens; the last input's sampling parameters win), so nothing the
client sent is dropped and a barge-in storm costs one turn, not thousands. Memory is bounded: a
merged input stops growing at ``MAX_MERGED_TEXT_BYTES`` / ``MAX_MERGED_TOKENS`` and at most
``MAX_PENDING`` items wait; beyond that the reader waits, and gRPC flow control slows the client.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from protos import session_router_pb2 as pb

MAX_MERGED_TEXT_BYTES = 64 * 1024
MAX_MERGED_TOKENS = 16 * 1024
MAX_PENDING = 8


@dataclass(frozen=True, slots=True)
class ClientInput:
    request: pb.GenerateRequest


@dataclass(frozen=True, slots=True)
class ClientInterrupt:
    pass


@dataclass(frozen=True, slots=True)
class ClientHalfClosed:
    pass


@dataclass(frozen=True, slots=True)
class ClientFailed:
    error: Exception


def merge(first: pb.GenerateRequest, then: pb.GenerateRequest) -> pb.GenerateRequest | None:
    """One input meaning ``first`` followed by ``then`` (with ``then``'s sampling), or None when
    they cannot be one (different kinds of input, or the result would pass the bounds)."""
    kind = first.WhichOneof("input")
    if kind is None or kind != then.WhichOneof("input"):
        return None
    merged = pb.GenerateRequest()
    merged.CopyFrom(then)
    if kind == "text":
        text = first.text + then.text
        if len(text.encode("utf-8", "surrogatepass")) > MAX_MERGED_TEXT_BYTES:
            return None
        merged.text = text
    else:
        if len(first.tokens.ids) + len(then.tokens.ids) > MAX_MERGED_TOKENS:
            return None
        merged.tokens.ids[:] = [*first.tokens.ids, *then.tokens.ids]
    return merged


class PendingInputs:
    def __init__(self, on_ready: Callable[[], None]) -> None:
        """``on_ready()`` is called when an item arrives while none was pending."""
        self.on_ready = on_ready
        self._items: list = []
        self._room = asyncio.Event()
        self._room.set()

    async def put(self, item) -> None:
        """Append ``item`` (merged into the last input when it is one too); waits while
        ``MAX_PENDING`` items are pending."""
        await self._room.wait()
        last = self._items[-1] if self._items else None
        if isinstance(item, ClientInput) and isinstance(last, ClientInput):
            merged = merge(last.request, item.request)
            if merged is not None:
                self._items[-1] = ClientInput(merged)
                return
        self._items.append(item)
        if len(self._items) == 1:
            self.on_ready()
        if len(self._items) >= MAX_PENDING:
            self._room.clear()

    def take(self) -> list:
        """Everything pending, in order; makes room for the reader."""
        items, self._items = self._items, []
        self._room.set()
        return items
