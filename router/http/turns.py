"""``Turns``: what the HTTP endpoints do with sessions, in the gateway's own steps: render a
chat prompt on a replica, open or fork a session, stream one turn, close.

Each endpoint owns the sessions it opens: it closes them when it is done (a stateless request)
or hands them to the response store (a stored response keeps its state). A turn whose client
goes away before its end is cancelled on the replica, which rolls the session back.
"""

from __future__ import annotations

import random
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from protos import session_router_pb2 as pb
from replica.actor.client import ReplicaClient
from replica.api import (
    ActorError,
    ChatInput,
    ChatPrompt,
    FinishReason,
    ModelCard,
    SamplingParams,
    SessionInfo,
    StatusCode,
)
from router.control.api import Route
from router.gateway.convert import Refused
from router.gateway.gateway import Gateway
from router.gateway.turn_streams import NotContinued, TurnStream
from router.http.errors import ApiError

FINISH = {FinishReason.STOP: "stop", FinishReason.LENGTH: "length",
          FinishReason.INTERRUPTED: "interrupted"}  # fmt: skip


@dataclass(slots=True)
class TurnOutput:
    """What a turn produced so far; ``finish`` is set at its end ("stop" or "length")."""

    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish: str | None = None
    committed_tokens: int = 0


class Turns:
    def __init__(self, gateway: Gateway, open_wait_s: float) -> None:
        self.gw = gateway
        self.open_wait_s = open_wait_s
        self._card: ModelCard | None = None

    def _any_replica(self) -> ReplicaClient:
        handles = list(self.gw.cluster.handles.values())
        if not handles:
            raise ApiError(503, "no replica is up yet; retry shortly", code="no_replica")
        return ReplicaClient(random.choice(handles))

    async def model_card(self) -> ModelCard:
        """The served model, asked of a replica once (every replica serves the same one)."""
        if self._card is None:
            self._card = await self._any_replica().model_card()
        return self._card

    async def chat_prompt(
        self, messages: list[dict[str, str]], prior_ids: list[int] | None = None
    ) -> ChatPrompt:
        replica = self._any_replica()
        return checked(await replica.chat_prompt(messages=messages, prior_ids=prior_ids))

    async def open(
        self, tenant: str, idle_timeout_s: float = 0.0, prefix_ids: list[int] | None = None
    ) -> Route:
        """A new session; with ``prefix_ids`` it starts holding them, from the longest state
        the replicas' turn-boundary cache holds of them (``route.info.cached_tokens``: how many
        of them were taken from it, never prefilled)."""
        request = pb.OpenSessionRequest(idle_timeout_s=idle_timeout_s)
        if prefix_ids:
            request.prefix_tokens.ids.extend(prefix_ids)
        try:
            return await self.gw.open(request, tenant, self.open_wait_s)
        except Refused as exc:
            raise ApiError.of(exc.code, str(exc)) from None

    async def fork(self, session_id: str, tenant: str, wait_s: float | None = None) -> Route | None:
        """A fork of ``session_id``, waiting for room at most ``wait_s`` (None: as an open
        does); None when that session is gone (released, lost)."""
        try:
            wait = self.open_wait_s if wait_s is None else wait_s
            return await self.gw.fork(session_id, tenant, wait)
        except Refused as exc:
            if exc.code in (StatusCode.NOT_FOUND, StatusCode.ABORTED):
                return None
            raise ApiError.of(exc.code, str(exc)) from None

    async def close(self, session_id: str, tenant: str) -> None:
        try:
            await self.gw.close(session_id, tenant)
        except Refused:
            pass  # gone already: nothing is held

    @staticmethod
    def cached_tokens(route: Route) -> int:
        """Of a session opened with a prefix: the prefix tokens the cache held (not prefilled)."""
        return route.info.cached_tokens if route.info is not None else 0

    def release(self, session_id: str, tenant: str) -> None:
        """Close the session in the background: it runs to its end even when the request that
        calls this is being cancelled (its client went away)."""
        self.gw.background.spawn(self.close(session_id, tenant))

    async def start(
        self,
        route: Route,
        sampling: SamplingParams,
        token_ids: list[int] | None = None,
        text: str | ChatInput | None = None,
        fork_lease_s: float | None = None,
        replaces: str | None = None,
    ) -> StartedTurn:
        """Submit one turn on ``route``'s session (``Gateway.turns``); raises ``ApiError`` when
        it is refused (bad input, context overflow), before anything is streamed. With
        ``fork_lease_s`` (the fork's stream lease; 0: none) the replica forks the session in the
        same command, just before the turn, having released ``replaces`` first (a session of
        the caller's on that replica: the fork takes its room): ``StartedTurn.fork`` is that
        fork (the state before the turn, on the replica that answered), or None when it had no
        room for one, and ``StartedTurn.replaced`` whether ``replaces`` was released there. A
        ``ChatInput`` text is rendered by the replica in the submit's call
        (``StartedTurn.prompt``); ``NotContinued`` (not an ``ApiError``) when it does not
        continue the state it names."""
        fork = None
        if fork_lease_s is not None:
            fork = (secrets.token_hex(16), fork_lease_s, replaces)
        try:
            turn = await self.gw.turns.start(route, text, token_ids, sampling, fork)
        except NotContinued:
            raise
        except Refused as exc:
            raise ApiError.of(exc.code, str(exc)) from None
        forked, replaced = None, False
        if turn.forked is not None:
            replaced = turn.forked.replaced
            if isinstance(turn.forked.fork, SessionInfo):
                forked = self.gw.adopt_fork(turn.route, turn.forked.fork)
        return StartedTurn(turn, forked, replaced)


class StartedTurn:
    """A submitted turn; ``outputs`` must be iterated (or ``cancel`` called) to release it.
    ``fork``: the fork asked for with it, when one was made (its caller owns it); ``replaced``:
    the session that fork replaces was released by the same command; ``prompt``: what a chat
    turn was rendered to."""

    def __init__(self, turn: TurnStream, fork: Route | None = None, replaced: bool = False) -> None:
        self.turn = turn
        self.prompt = turn.prompt
        self.fork = fork
        self.replaced = replaced
        self.out = TurnOutput()

    @property
    def route(self) -> Route:
        """Where the session answered the turn (it may have moved there)."""
        return self.turn.route

    async def outputs(self) -> AsyncIterator[TurnOutput]:
        """The output so far after each chunk (the last one has ``finish``); raises
        ``ApiError`` when the turn fails. A stream left before its end cancels the turn."""
        out, code = self.out, StatusCode.CANCELLED
        try:
            async for chunk in self.turn.chunks():
                out.token_ids += chunk.token_ids
                out.text += chunk.text
                if chunk.finish_reason:
                    out.finish = FINISH.get(FinishReason(chunk.finish_reason), "stop")
                    out.committed_tokens = chunk.committed_tokens
                    code = StatusCode.OK
                yield out
        except Refused as exc:
            code = exc.code
            raise ApiError.of(exc.code, str(exc)) from None
        finally:
            self.turn.end(code)

    def cancel(self) -> None:
        """Release the turn; cancel it unless it ended (idempotent)."""
        self.turn.end(StatusCode.CANCELLED)


def checked(result):
    if isinstance(result, ActorError):
        raise ApiError.of(result.code, result.message)
    return result
