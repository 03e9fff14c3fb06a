"""``session-router sessions`` and ``session-router restart``: the runbooks' per-replica steps.

    session-router sessions --replica ID [--namespace NS] [--address ADDR]
    session-router restart --replica ID [--force] [--namespace NS] [--address ADDR]

Both run on a node of the cluster (``kubectl exec`` into the head pod): they join Ray
(``--address``, default auto, unless this process is already in it) and call the named
actors of serve's Ray namespace. ``sessions`` lists what the replica holds beside what the router
pins to it, marking an orphan (held, not pinned: it holds slots nobody can reach) and a lost session
(pinned, not held). ``restart`` kills the replica actor; serve's supervisor replaces it with a new,
empty one. It refuses while the replica holds sessions (drain it first with ``session-router drain
--replica ID --migrate``) unless ``--force``, which hands them to failover (restored from their
checkpoints). Exit status: 0 done, 1 refused, 2 no such replica.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Coroutine
from typing import Any, TextIO, TypeVar

from router.config import NAMESPACE
from router.ops import ray_join

# Ray and what imports it are imported in the calls: Ray's settings are settled first (cli.py).

T = TypeVar("T")

CALL_TIMEOUT_S = 60.0


def answer(call: Coroutine[Any, Any, T]) -> T:
    """What a typed actor call answers, awaited here for at most ``CALL_TIMEOUT_S``."""
    return asyncio.run(asyncio.wait_for(call, CALL_TIMEOUT_S))


def join_cluster(address: str, namespace: str) -> None:
    import ray

    if not ray.is_initialized():
        ray_join.connect(address, namespace, logging_level="ERROR", log_to_driver=False)


def replica_actor(args: argparse.Namespace, out: TextIO):
    """The replica's actor handle (joining the cluster first), or None, said on ``out``, when
    the cluster has no such replica."""
    import ray

    join_cluster(args.address, args.namespace)
    try:
        return ray.get_actor(args.replica, namespace=args.namespace)
    except ValueError:
        print(f"no replica {args.replica} in namespace {args.namespace}", file=out)
        return None


def run_sessions(args: argparse.Namespace, out: TextIO | None = None) -> int:
    import ray

    from replica.actor.client import ReplicaClient
    from replica.api import ActorError
    from router.control.api import ROUTER_NAME
    from router.control.client import RouterClient

    out = out or sys.stdout
    replica = replica_actor(args, out)
    if replica is None:
        return 2
    router = ray.get_actor(ROUTER_NAME, namespace=args.namespace)
    held = answer(ReplicaClient(replica).list_sessions())
    listed = answer(RouterClient(router).pinned_sessions(replica_id=args.replica, retry=False))
    if isinstance(held, ActorError):
        print(f"{args.replica} cannot list its sessions: {held}", file=out)
        return 1
    if isinstance(listed, ActorError):
        print(f"the router cannot list the sessions of {args.replica}: {listed}", file=out)
        return 1
    pinned = set(listed)
    print(f"{'session':32}  {'tenant':16}  state", file=out)
    for session_id in sorted(set(held) | pinned):
        state = "ok"
        if session_id not in pinned:
            state = "ORPHAN (held, not pinned)"
        elif session_id not in held:
            state = "LOST (pinned, not held)"
        print(f"{session_id:32}  {held.get(session_id, '-'):16}  {state}", file=out)
    print(f"{len(held)} held, {len(pinned)} pinned", file=out)
    return 0


def run_restart(args: argparse.Namespace, out: TextIO | None = None) -> int:
    import ray

    from replica.actor.client import ReplicaClient
    from replica.api import ActorError

    out = out or sys.stdout
    replica = replica_actor(args, out)
    if replica is None:
        return 2
    if not args.force:
        held = answer(ReplicaClient(replica).list_sessions())
        if isinstance(held, ActorError) or held:
            what = held if isinstance(held, ActorError) else f"holds {len(held)} sessions"
            print(
                f"{args.replica} {what}: move them first (session-router drain --replica "
                f"{args.replica} --migrate), or --force to hand them to failover",
                file=out,
            )
            return 1
    ray.kill(replica, no_restart=True)
    print(f"{args.replica}: stopped; serve replaces it with a new, empty replica", file=out)
    return 0


def add_arguments(parser: argparse.ArgumentParser, restart: bool = False) -> None:
    parser.add_argument("--replica", required=True, help="the replica (see ListReplicas)")
    parser.add_argument(
        "--address", default="auto", help="the Ray cluster serve runs on (default: auto)"
    )
    parser.add_argument(
        "--namespace", default=NAMESPACE, help=f"serve's Ray namespace (default {NAMESPACE})"
    )
    if restart:
        parser.add_argument(
            "--force",
            action="store_true",
            help="restart even while it holds sessions (failover restores them from checkpoints)",
        )
