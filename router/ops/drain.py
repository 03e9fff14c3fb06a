"""``session-router drain`` and ``session-router resume``: the operator's AdminService calls.

    session-router drain --grpc ADDR (--replica ID | --this-node) [--migrate] [--timeout-s S]
    session-router resume --grpc ADDR --replica ID

``--this-node`` drains every replica on the Ray node this command runs on (a Kubernetes preStop
hook of a Ray worker pod): it joins the cluster (``--address``, default auto) only to learn
its own node id, and compares it with each replica's ``ReplicaInfo.node_id``. The admin key comes
from ``--api-key`` or ``SESSION_ROUTER_API_KEY``. Exit status: 0 when every drained replica holds
no session (or ``--migrate`` was not asked for), 1 when sessions are left, 2 on a refusal.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TextIO

import grpc

from protos import session_router_pb2 as pb
from router.client import SessionClient, tls_credentials

API_KEY_ENV = "SESSION_ROUTER_API_KEY"
DEADLINE_SLACK_S = 2.0  # the server answers a little before the call's deadline


def this_node_id(address: str) -> str:
    """The Ray node id of the machine this runs on (joins the cluster at ``address`` to learn
    it)."""
    from router.ops import ray_join

    ray_join.connect(address, None, logging_level="ERROR", log_to_driver=False)
    import ray

    try:
        return ray.get_runtime_context().get_node_id()
    finally:
        ray.shutdown()


def replicas_to_drain(client: SessionClient, replica: str | None, node_id: str | None) -> list[str]:
    if replica:
        return [replica]
    return [
        info.replica_id
        for info in client.replicas()
        if info.node_id == node_id and info.state != pb.REPLICA_STATE_DEAD
    ]


def run_drain(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout  # read at the call: a default bound at import would outlive a redirect
    with _client(args) as client:
        try:
            node = None if args.replica else this_node_id(args.address)
            ids = replicas_to_drain(client, args.replica, node)
            if not ids:
                print(f"no live replica on this node ({node})", file=out)
                return 0
            left = 0
            for replica_id in ids:
                deadline = None if args.timeout_s is None else args.timeout_s + DEADLINE_SLACK_S
                reply = client.drain(replica_id, args.migrate, deadline)
                left += reply.sessions_left if args.migrate else 0
                print(
                    f"{replica_id}: draining; {reply.sessions_migrated} sessions migrated, "
                    f"{reply.sessions_left} left",
                    file=out,
                )
        except grpc.RpcError as exc:
            print(f"drain failed: {exc.code().name}: {exc.details()}", file=out)
            return 2
    return 1 if left else 0


def run_resume(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    with _client(args) as client:
        try:
            info = client.resume(args.replica)
        except grpc.RpcError as exc:
            print(f"resume failed: {exc.code().name}: {exc.details()}", file=out)
            return 2
    print(f"{info.replica_id}: {pb.ReplicaState.Name(info.state)}", file=out)
    return 0


def _client(args: argparse.Namespace) -> SessionClient:
    if bool(args.tls_cert) != bool(args.tls_key):
        raise SystemExit("--tls-cert and --tls-key go together (the client certificate)")
    tls = args.tls_ca or args.tls_cert
    credentials = tls_credentials(args.tls_ca, args.tls_cert, args.tls_key) if tls else None
    key = args.api_key or os.environ.get(API_KEY_ENV)
    return SessionClient(args.grpc, key, credentials)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--grpc", required=True, help="the gateway's gRPC address, HOST:PORT")
    parser.add_argument("--api-key", help=f"an admin API key (default: ${API_KEY_ENV})")
    parser.add_argument("--tls-ca", help="PEM CA bundle: connect over TLS, trusting it")
    parser.add_argument(
        "--tls-cert",
        help="PEM client certificate, for a gateway that requires one (serve --tls-client-ca)",
    )
    parser.add_argument("--tls-key", help="PEM key of --tls-cert")


def add_drain_arguments(parser: argparse.ArgumentParser) -> None:
    _common(parser)
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--replica", help="the replica to drain (see ListReplicas)")
    which.add_argument(
        "--this-node", action="store_true", help="drain the replicas on this Ray node"
    )
    parser.add_argument(
        "--address",
        default="auto",
        help="with --this-node: the Ray cluster to learn this node's id from (default: auto)",
    )
    parser.add_argument(
        "--migrate", action="store_true", help="move their sessions to the other replicas"
    )
    parser.add_argument(
        "--timeout-s",
        type=float,
        default=None,
        help="with --migrate: answer by then with how many sessions are left "
        "(default: the server's --drain-timeout-s)",
    )


def add_resume_arguments(parser: argparse.ArgumentParser) -> None:
    _common(parser)
    parser.add_argument("--replica", required=True, help="the drained replica to take back")
