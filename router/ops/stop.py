"""``session-router stop``: the clean stop of the deployment in a namespace, from any shell.

    session-router stop [--address ADDR] [--namespace NS]

It joins the cluster (``--address``, default auto), finds the deployment there (its router and
controller) and stops it as ``serve`` stops on SIGTERM (``router.ops.serve.stop_deployment``):
every session released, every actor removed. The way to
end a deployment whose ``serve`` crashed (a crash removes nothing: the actors are detached).
Exit status: 0 stopped, 2 no deployment in the namespace.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from router.config import NAMESPACE, ServeConfig

# Ray and what imports it are imported in the calls: Ray's settings are settled first (cli.py).


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--address", default="auto", help="Ray address of the cluster (default auto)")
    p.add_argument("--namespace", default=NAMESPACE, help="Ray namespace of the deployment")


async def stop_deployment(address: str, namespace: str) -> int | None:
    """Sessions released by the stop, or None when the namespace has no deployment."""
    import ray

    from router.control.api import CONTROLLER_NAME, ROUTER_NAME
    from router.control.controller_client import ControllerClient
    from router.ops import ray_join
    from router.ops.serve import named_actor, stop_deployment

    if not ray.is_initialized():
        ray_join.connect(address, namespace, logging_level="ERROR", log_to_driver=False)
    router = await named_actor(ROUTER_NAME, namespace)
    if router is None:
        return None
    controller = await named_actor(CONTROLLER_NAME, namespace)
    config = ServeConfig.from_flags(namespace=namespace, address=address)
    return await stop_deployment(
        config, router, ControllerClient(controller) if controller is not None else None
    )


def run_stop(args: argparse.Namespace) -> int:
    released = asyncio.run(stop_deployment(args.address, args.namespace))
    if released is None:
        print(f"no deployment in namespace {args.namespace}", file=sys.stderr)
        return 2
    print(f"stopped the deployment in namespace {args.namespace}: {released} session(s) released")
    return 0
