"""The ``session-router`` command: ``serve``, ``gateway``, ``demo``, ``top``, ``drain``,
``resume``, and the runbooks' per-replica steps ``sessions`` and ``restart``.

The ``serve`` and ``gateway`` flags are generated from the settings dataclasses
(``router.config``, ``replica.config``), so each has one default and one help text. Ray's start-up
settings depend on the command's ``--address`` and are read by Ray when it is imported, so this
module imports nothing that imports Ray until ``ray_join.prepare`` has run.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Sequence
from typing import Protocol

import router.ops.demo.run as demo
from router.config import JoinConfig, ServeConfig
from router.flags import add_arguments, from_arguments
from router.ops import drain, ray_join, replica_tools, stop, top
from router.ops.ray_join import JoinError


class Service(Protocol):
    async def start(self) -> None: ...
    def listening(self) -> list[str]: ...
    async def stop(self) -> int | None: ...
    async def undo_start(self) -> None: ...


async def run_until_stopped(service: Service, starting: str, stopping: str) -> int:
    """Start ``service``, print where it listens, run until SIGINT or SIGTERM, stop it."""
    from router.control.scheduling import ReplicaStartError
    from router.ops.join import RouterNotFound

    stop = asyncio.Event()
    print(f"session-router: {starting}...", flush=True)
    try:
        await service.start()
    except (ReplicaStartError, RouterNotFound, JoinError) as exc:
        print(f"session-router: {exc}", file=sys.stderr, flush=True)
        await service.undo_start()
        return 1
    # After start: ray.init installs its own SIGTERM handler, which must not win over ours.
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    for line in service.listening():
        print(f"session-router: {line}", flush=True)
    print("session-router: ready (Ctrl-C or SIGTERM to stop)", flush=True)
    await stop.wait()
    print(f"session-router: shutting down: {stopping}", flush=True)
    released = await service.stop()
    if released is not None:
        print(f"session-router: stopped; {released} sessions released", flush=True)
    return 0


async def serve(config: ServeConfig) -> int:
    from router.ops.serve import Server

    model = config.replica.model_name
    starting = f"starting Ray, the router and {config.replicas} replicas ({model})"
    return await run_until_stopped(Server(config), starting, "releasing sessions, stopping Ray")


async def gateway(config: JoinConfig) -> int:
    from router.ops.join import JoinedGateway

    joined = JoinedGateway(config)
    return await run_until_stopped(
        joined, f"joining the cluster at {config.address}", "the cluster and its sessions go on"
    )


def ray_address(args: argparse.Namespace) -> str | None:
    """The Ray cluster the command joins; None: it embeds its own (or uses no Ray)."""
    if args.command == "drain" and not args.this_node:
        return None
    return getattr(args, "address", None)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="session-router", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    add_arguments(sub.add_parser("serve", help="serve the gRPC session API"), ServeConfig)
    add_arguments(
        sub.add_parser("gateway", help="add a gateway in front of a running cluster"), JoinConfig
    )
    demo.add_arguments(sub.add_parser("demo", help="run many short sessions on a local cluster"))
    top.add_arguments(sub.add_parser("top", help="live per-replica table of the pools"))
    drain.add_drain_arguments(
        sub.add_parser("drain", help="drain replicas (admin), optionally moving their sessions")
    )
    drain.add_resume_arguments(sub.add_parser("resume", help="take a drained replica back"))
    replica_tools.add_arguments(
        sub.add_parser("sessions", help="a replica's sessions beside the router's pins")
    )
    replica_tools.add_arguments(
        sub.add_parser("restart", help="replace a replica with a new, empty one"), restart=True
    )
    stop.add_arguments(
        sub.add_parser("stop", help="stop the deployment in a namespace: sessions released")
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    ray_join.prepare(ray_address(args))
    try:
        if args.command == "serve":
            return asyncio.run(serve(from_arguments(ServeConfig, args)))
        if args.command == "gateway":
            return asyncio.run(gateway(from_arguments(JoinConfig, args)))
        if args.command == "demo":
            return asyncio.run(demo.run_demo(args))
        if args.command == "drain":
            return drain.run_drain(args)
        if args.command == "resume":
            return drain.run_resume(args)
        if args.command == "sessions":
            return replica_tools.run_sessions(args)
        if args.command == "restart":
            return replica_tools.run_restart(args)
        if args.command == "stop":
            return stop.run_stop(args)
        return top.run_top(args.metrics_url, args.interval, 1 if args.once else None)
    except JoinError as exc:
        print(f"session-router: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"session-router: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
