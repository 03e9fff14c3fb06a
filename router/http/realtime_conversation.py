"""``LiveConversation``: one Realtime connection's conversation and the live session that holds
its state.

The items are kept as the client sees them; the session holds the token ids of the chat
template's rendering of the items folded so far (``folded``), replies exactly as generated
(a cut reply: exactly the tokens its ``response.done`` reported). A response's prompt is the
rendering of the whole conversation past the text of those tokens (``chat_input``: rendered by
the replica in the submit's own call, with ``prior_ids``): only the new part is fed, and a cut
assistant message is closed the way the template closes it. Before each response the session
is forked (``checkpoint``): deleting that response's items switches to the fork, an exact
rollback (an assistant item the client then creates, the part of a cut reply the user heard,
is fed like any item: only that part enters the state). Anything else that makes the state
disagree with the rendering (deleting further back, new instructions, a lost state) is
``stale``: the next response replays the whole rendering into a fresh session.

The connection owns every session here: ``close`` releases them all (idempotent). A session
it lets go of is released in the background; a response waits for those releases (``settled``)
before it is submitted, since the room they free is its fork's.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from protos import session_router_pb2 as pb
from replica.api import ChatInput, ChatPrompt, ReleaseReason
from router.control.api import Route
from router.gateway.convert import Refused
from router.gateway.stream_leases import LEASE_S
from router.http.errors import ApiError
from router.http.realtime_events import item_text
from router.http.turns import Turns

SETTLE_WAIT_S = 5.0  # the longest a response waits for its connection's releases to land


@dataclass(slots=True)
class Checkpoint:
    """A fork of the session taken before a response: its state covers ``folded`` items."""

    route: Route
    held: list[int]
    folded: int


class LiveConversation:
    def __init__(self, turns: Turns, tenant: str, route: Route) -> None:
        self.turns, self.gw, self.tenant = turns, turns.gw, tenant
        self.route = route
        self.items: list[dict] = []
        self.held: list[int] = []  # the token ids the session holds
        self.folded = 0  # items[:folded] are what those tokens render
        self.stale = False
        self.checkpoint: Checkpoint | None = None
        self.releasing: set[asyncio.Task] = set()  # background releases not yet landed
        self.gw.leases.hold(route)

    @classmethod
    async def open(cls, turns: Turns, tenant: str) -> LiveConversation:
        return cls(turns, tenant, await open_leased(turns, tenant))

    def messages(self, instructions: str, upto: int) -> list[dict[str, str]]:
        system = [{"role": "system", "content": instructions}] if instructions else []
        chat = ({"role": i["role"], "content": item_text(i)} for i in self.items[:upto])
        return [*system, *chat]

    def chat_input(self, instructions: str, upto: int) -> ChatInput:
        """The input of a response to ``items[:upto]``: the conversation, continuing the tokens
        the session holds (the replica feeds only what follows their text, or nothing when the
        rendering does not begin with it: then ``replay`` and submit again)."""
        return ChatInput(self.messages(instructions, upto), list(self.held) or None)

    async def replay(self) -> None:
        """Start over in a fresh session (holding nothing) when the state held is not the
        rendering's beginning (``stale``, or a chat input that did not continue it)."""
        if self.held or self.stale:
            await self._replace(await open_leased(self.turns, self.tenant))
            self.held, self.folded, self.stale = [], 0, False

    def started(self, fork: Route | None, route: Route) -> None:
        """A response was submitted on ``route`` (the session may have moved there), with
        ``fork`` taken by the replica just before it, in the same command (None: it had no room
        for one, the response has no rollback point; it never waits for room): the fork becomes
        the checkpoint, the previous one is released. The fork's replica-side lease was taken
        in that command too, so should this gateway die, its replica releases the fork with
        the connection's session, not at its idle timeout."""
        if route.replica_id != self.route.replica_id:
            self.route = route
            self.gw.leases.hold(route)
        self.drop_checkpoint()
        if fork is not None:
            self.gw.leases.hold(fork)
            self.checkpoint = Checkpoint(fork, list(self.held), self.folded)

    def ended(self, prompt: ChatPrompt, output: list[int], committed: int, item_index: int):
        """The response's turn ended with ``output`` generated and ``committed`` tokens held
        (0: unknown, the turn failed): the state now covers the items up to its reply."""
        held = [*self.held[: prompt.reused_tokens], *prompt.token_ids, *output]
        if committed and len(held) == committed:
            self.held, self.folded = held, item_index + 1
        else:
            self.stale = True

    def delete(self, index: int) -> None:
        """Forget ``items[index]`` (the last one) and roll the state back to match."""
        del self.items[index]
        if index >= self.folded:
            return  # never fed
        point = self.checkpoint
        if point is not None and index >= point.folded:
            self.checkpoint = None
            self.release_soon(self.route)
            self.route, self.held, self.folded = point.route, point.held, point.folded
        else:
            self.stale = True

    async def _replace(self, route: Route) -> None:
        old, self.route = self.route, route
        self.gw.leases.hold(route)
        self.drop_checkpoint()
        await self.release(old)

    def drop_checkpoint(self) -> None:
        """Release the rollback point (idempotent). A new response releases its predecessor's
        before its own is taken (``retire``), so a connection never holds more than two
        sessions."""
        if self.checkpoint is not None:
            self.release_soon(self.checkpoint.route)
            self.checkpoint = None

    def retire(self, route: Route, released: bool) -> None:
        """A rollback point that a new response replaces: ``released`` on its replica by the
        command that submitted that response (forgotten here and at the router), else released
        now."""
        if released:
            self.gw.leases.drop(route.session_id)
            self.gw.released_there(route)
        else:
            self.release_soon(route)

    def release_soon(self, route: Route) -> None:
        """Release one of this connection's sessions in the background (``settled`` waits)."""
        task = self.gw.background.spawn(self.release(route))
        self.releasing.add(task)
        task.add_done_callback(self.releasing.discard)

    async def settled(self) -> None:
        """Wait until the sessions let go of are released on their replicas (at most
        ``SETTLE_WAIT_S``: a replica that does not answer holds no response up): a fork taken
        earlier would find a full replica still holding one, and the response would go without
        its rollback point."""
        if self.releasing:
            await asyncio.wait(set(self.releasing), timeout=SETTLE_WAIT_S)

    async def release(self, route: Route) -> None:
        """Release one of this connection's sessions (no longer held by its lease)."""
        self.gw.leases.drop(route.session_id)
        await self.gw.release(route, ReleaseReason.STREAM_ENDED)

    def close(self) -> None:
        """Release the session and its checkpoint in the background (survives cancellation)."""
        self.drop_checkpoint()
        if self.route is not None:
            self.release_soon(self.route)
            self.route = None


async def open_leased(turns: Turns, tenant: str) -> Route:
    """A new session held open by this connection's lease (its idle timeout does not apply)."""
    try:
        return await turns.gw.open(pb.OpenSessionRequest(), tenant, turns.open_wait_s, LEASE_S)
    except Refused as exc:
        raise ApiError.of(exc.code, str(exc)) from None
