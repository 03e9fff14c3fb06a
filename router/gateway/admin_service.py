"""The gateway's ``AdminService`` over grpc.aio: ListReplicas, DrainReplica, ResumeReplica and
MigrateSession, each asked of the router. With API keys on, only admin keys are served."""

from __future__ import annotations

from protos import session_router_pb2 as pb
from protos import session_router_pb2_grpc as pb_grpc
from replica.api import StatusCode
from router.gateway.convert import Refused, check, replica_to_proto, session_to_proto
from router.gateway.gateway import Gateway
from router.gateway.rpc import run_rpc

ANSWER_MARGIN_S = 1.0  # time kept to answer before the caller's deadline


def answer_within(context) -> float | None:
    """How long a call may work before it must answer: its deadline less a margin (None
    without a deadline)."""
    left = context.time_remaining()
    return None if left is None else max(0.0, left - ANSWER_MARGIN_S)


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
