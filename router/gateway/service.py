"""The gRPC services of a gateway: ``SessionService`` (here) and ``AdminService``
(``router.gateway.admin_service``) over grpc.aio, plus health and reflection. Status codes and
messages follow docs/api.md; every refusal says what to do.

A Generate turn is one actor call to submit; its chunks arrive through the replica's output
stream (``router.gateway.delivery``). If the client cancels or its deadline passes before the last
chunk, the turn is cancelled on the replica, which rolls the session back to its turn snapshot.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from protos import session_router_pb2 as pb
from protos import session_router_pb2_grpc as pb_grpc
from replica.api import StatusCode
from router.gateway.admin_service import AdminService
from router.gateway.converse import Conversation
from router.gateway.convert import Refused, session_to_proto, turn_of
from router.gateway.gateway import Gateway
from router.gateway.rpc import run_rpc, run_stream


class SessionService(pb_grpc.SessionServiceServicer):
    def __init__(self, gateway: Gateway) -> None:
        self.gw = gateway

    async def OpenSession(self, request, context):
        async def body():
            tenant = self.gw.tenant(context)
            route = await self.gw.open(request, tenant, context.time_remaining())
            return session_to_proto(route.session_id, route.replica_id, route.info)

        return await run_rpc(self.gw, "OpenSession", context, body)

    async def GetSession(self, request, context):
        async def body():
            route = await self.gw.route(request.session_id, self.gw.tenant(context))
            route, info = await self.gw.on_session(
                route, "get_session", lambda r: r.replica.get_session(session_id=r.session_id)
            )
            return session_to_proto(route.session_id, route.replica_id, info)

        return await run_rpc(self.gw, "GetSession", context, body)

    async def ForkSession(self, request, context):
        async def body():
            tenant = self.gw.tenant(context)
            route = await self.gw.fork(request.session_id, tenant, context.time_remaining())
            return session_to_proto(route.session_id, route.replica_id, route.info)

        return await run_rpc(self.gw, "ForkSession", context, body)

    async def CloseSession(self, request, context):
        async def body():
            tenant = self.gw.tenant(context)
            if not request.session_id:
                raise Refused(StatusCode.INVALID_ARGUMENT, "session_id is required")
            was_open = await self.gw.close(request.session_id, tenant)
            return pb.CloseSessionResponse(was_open=was_open)

        return await run_rpc(self.gw, "CloseSession", context, body)

    # grpc.aio serves a streaming method only when it is an async generator function itself.
    async def Generate(self, request, context) -> AsyncIterator[pb.GenerateChunk]:
        async for chunk in run_stream(self.gw, "Generate", context, self._turn(request, context)):
            yield chunk

    async def _turn(self, request: pb.GenerateRequest, context) -> AsyncIterator[pb.GenerateChunk]:
        """One turn streamed to one client, a message per take of its inbox (everything the
        turn produced since the last message); cancelled on the replica, which rolls the
        session back, when the call ends before its last chunk (client cancel, deadline)."""
        route = await self.gw.route(request.session_id, self.gw.tenant(context))
        async with self.gw.turns.stream_turn(route, *turn_of(request)) as turn:
            async for chunk in turn.chunks():
                yield chunk

    async def Converse(self, request_iterator, context) -> AsyncIterator[pb.ConverseResponse]:
        conversation = Conversation(self.gw, request_iterator, context)
        async for response in run_stream(
            self.gw, "Converse", context, conversation.run(), lambda code: conversation.end()
        ):
            yield response


def server_options(keepalive_s: float) -> list[tuple[str, int]]:
    """HTTP/2 keepalive: the server pings an idle connection every ``keepalive_s`` and drops it
    when the ping goes unanswered, so a dead peer's streams (a Converse, and its session) end
    instead of living forever; clients may ping as often as every 10 s."""
    ms = int(keepalive_s * 1000)
    return [
        ("grpc.keepalive_time_ms", ms),
        ("grpc.keepalive_timeout_ms", ms),
        ("grpc.http2.ping_timeout_ms", ms),  # what bounds the wait for a ping's ack nowadays
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ]


async def start_grpc_server(
    gateway: Gateway,
    port: int,
    host: str = "127.0.0.1",
    credentials: grpc.ServerCredentials | None = None,
    keepalive_s: float = 30.0,
) -> grpc.aio.Server:
    """Start the gRPC server with both services, health and reflection; returns it running.
    With ``credentials`` it serves TLS only (a plaintext client cannot connect)."""
    server = grpc.aio.server(options=server_options(keepalive_s))
    pb_grpc.add_SessionServiceServicer_to_server(SessionService(gateway), server)
    pb_grpc.add_AdminServiceServicer_to_server(AdminService(gateway), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = [
        pb.DESCRIPTOR.services_by_name[n].full_name for n in ("SessionService", "AdminService")
    ]
    for name in ["", *names]:
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    reflection.enable_server_reflection(
        [*names, health.SERVICE_NAME, reflection.SERVICE_NAME], server
    )
    address = f"{host}:{port}"
    if credentials is None:
        bound = server.add_insecure_port(address)
    else:
        bound = server.add_secure_port(address, credentials)
    if bound == 0:
        raise OSError(f"cannot listen on {address}")
    server.bound_port = bound
    await server.start()
    return server
