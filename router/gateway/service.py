"""The gRPC services of a gateway: ``SessionService`` and ``AdminService`` over grpc.aio, plus
health and reflection. Status codes and messages follow docs/api.md; every refusal says what to do.

A Generate turn is one actor call to submit; its chunks arrive through the replica's output
stream (``router.gateway.delivery``). If the client cancels or its deadline passes before the last
chunk, the turn is cancelled on the replica, which rolls the session back to its turn snapshot.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from protos import session_router_pb2 as pb
from protos import session_router_pb2_grpc as pb_grpc
from replica.api import StatusCode
from router.gateway.converse import Conversation
from router.gateway.convert import Refused, check, replica_to_proto, session_to_proto, status_code
from router.gateway.gateway import Gateway
from router.gateway.generate import GenerateCall

log = logging.getLogger(__name__)


def unexpected(method: str, exc: Exception) -> Refused:
    """An error no step mapped to a status (a bug): INTERNAL with a message, never UNKNOWN."""
    log.error("%s failed unexpectedly", method, exc_info=exc)
    return Refused(
        StatusCode.INTERNAL,
        f"internal error in {method} ({type(exc).__name__}); retry, and report it if it persists",
    )


async def run_rpc(gateway: Gateway, method: str, context, body):
    """Run a unary body, mapping ``Refused`` to its status and counting the call."""
    started, code = time.perf_counter(), StatusCode.OK
    try:
        return await body()
    except Refused as exc:
        code = exc.code
        await context.abort(status_code(exc.code), str(exc))
    except Exception as exc:  # noqa: BLE001 - mapped, logged
        refused = unexpected(method, exc)
        code = refused.code
        await context.abort(status_code(code), str(refused))
    finally:
        gateway.metrics.observe_rpc(method, code, time.perf_counter() - started)


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
        call = GenerateCall(self.gw, request, context)
        async for chunk in run_stream(self.gw, "Generate", context, call.run(), call.end):
            yield chunk

    async def Converse(self, request_iterator, context) -> AsyncIterator[pb.ConverseResponse]:
        conversation = Conversation(self.gw, request_iterator, context)
        async for response in run_stream(
            self.gw, "Converse", context, conversation.run(), lambda code: conversation.end()
        ):
            yield response


async def run_stream(
    gateway: Gateway,
    method: str,
    context,
    stream: AsyncIterator,
    on_end: Callable[[StatusCode], None],
) -> AsyncIterator:
    """Relay a streaming body, mapping ``Refused`` to its status; ``on_end(code)`` runs however
    the call ends (also when the client cancels), then the call is counted."""
    started, code = time.perf_counter(), StatusCode.OK
    try:
        async for item in stream:
            yield item
    except Refused as exc:
        code = exc.code
        await context.abort(status_code(exc.code), str(exc))
    except asyncio.CancelledError:
        code = StatusCode.CANCELLED
        raise
    except Exception as exc:  # noqa: BLE001 - mapped, logged
        refused = unexpected(method, exc)
        code = refused.code
        await context.abort(status_code(code), str(refused))
    finally:
        on_end(code)
        gateway.metrics.observe_rpc(method, code, time.perf_counter() - started)


class AdminService(pb_grpc.AdminServiceServicer):
    """Admin calls. With API keys on, only admin keys are served (others: PERMISSION_DENIED,
    no key: UNAUTHENTICATED)."""

    def __init__(self, gateway: Gateway) -> None:
        self.gw = gateway

    async def ListReplicas(self, request, context):
        async def body():
            self.gw.admin(context)
            views = check(await self.gw.router.views())
            return pb.ListReplicasResponse(replicas=[replica_to_proto(v) for v in views])

        return await run_rpc(self.gw, "ListReplicas", context, body)

    async def DrainReplica(self, request, context):
        """With ``migrate``, answers once the replica holds no session, or before the call's
        deadline (else ``--drain-timeout-s``) with how many are left."""

        async def body():
            self.gw.admin(context)
            drained = check(
                await self.gw.router.drain(
                    replica_id=request.replica_id,
                    migrate=request.migrate,
                    timeout_s=answer_within(context),
                )
            )
            await self.gw.cluster.refresh()  # this gateway places by the change at once
            return pb.DrainReplicaResponse(
                replica=replica_to_proto(drained.replica),
                sessions_migrated=drained.sessions_migrated,
                sessions_left=drained.sessions_left,
            )

        return await run_rpc(self.gw, "DrainReplica", context, body)

    async def ResumeReplica(self, request, context):
        async def body():
            self.gw.admin(context)
            view = check(await self.gw.router.resume(replica_id=request.replica_id))
            await self.gw.cluster.refresh()
            return pb.ResumeReplicaResponse(replica=replica_to_proto(view))

        return await run_rpc(self.gw, "ResumeReplica", context, body)

    async def MigrateSession(self, request, context):
        async def body():
            self.gw.admin(context)
            if not request.session_id:
                raise Refused(StatusCode.INVALID_ARGUMENT, "session_id is required")
            route = check(
                await self.gw.router.migrate_session(
                    session_id=request.session_id,
                    target_replica_id=request.target_replica_id,
                    wait_s=answer_within(context),
                )
            )
            self.gw.routes.drop(route.session_id)
            return session_to_proto(route.session_id, route.replica_id, route.info)

        return await run_rpc(self.gw, "MigrateSession", context, body)


ANSWER_MARGIN_S = 1.0  # time kept to answer before the caller's deadline


def answer_within(context) -> float | None:
    """How long a call may work before it must answer: its deadline less a margin (None
    without a deadline)."""
    left = context.time_remaining()
    return None if left is None else max(0.0, left - ANSWER_MARGIN_S)


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
