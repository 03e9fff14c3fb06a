"""One ``Generate`` call: a turn streamed to one client."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from protos import session_router_pb2 as pb
from replica.api import StatusCode
from router.control.table import Route
from router.gateway.convert import Refused
from router.gateway.delivery import Inbox, next_turn_event
from router.gateway.gateway import Gateway


class GenerateCall:
    """One turn streamed to one client. If the call ends before the turn's last chunk (client
    cancel, deadline), the turn is cancelled on the replica, which rolls the session back."""

    def __init__(self, gateway: Gateway, request: pb.GenerateRequest, context) -> None:
        self.gw, self.request, self.context = gateway, request, context
        self.route: Route | None = None
        self.inbox: Inbox | None = None
        self.turn_id: int | None = None
        self.finished = False

    async def run(self) -> AsyncIterator[pb.GenerateChunk]:
        started = time.perf_counter()
        route = self.route = await self.gw.route(
            self.request.session_id, self.gw.tenant(self.context)
        )
        self.inbox = self.gw.delivery.claim(route)
        if self.inbox is None:
            raise Refused(
                StatusCode.FAILED_PRECONDITION,
                f"session {route.session_id} already has a turn "
                "running; wait for its last chunk or interrupt it",
            )
        self.route, self.turn_id = await self.gw.submit(route, self.request)
        self.gw.delivery.move(self.inbox, self.route)
        first = True
        while not self.finished:
            event = await next_turn_event(self.inbox, self.turn_id)
            self.finished = event.finished
            yield self.gw.chunk(event, started, first)
            first = False

    def end(self, code: StatusCode) -> None:
        if self.inbox is None:
            return
        self.gw.delivery.release(self.inbox)
        if self.turn_id is not None and not self.finished and code != StatusCode.ABORTED:
            self.gw.background.spawn(
                self.route.handle.cancel.remote(
                    self.route.session_id, "the client cancelled the call", self.turn_id
                )
            )
