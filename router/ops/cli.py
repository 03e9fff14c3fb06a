"""The ``session-router`` command: ``serve``, ``demo``, ``top``, ``drain``, ``resume``, and the
runbooks' per-replica steps ``sessions`` and ``restart``.

The ``serve`` and ``demo`` flags are generated from the settings dataclasses (``router.config``,
``replica.config``), so each has one default and one help text.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Sequence

from router.config import ServeConfig
from router.flags import add_arguments, from_arguments
from router.ops.scheduling import ReplicaStartError
from router.ops.serve import Server


async def serve(config: ServeConfig) -> int:
    server = Server(config)
    stop = asyncio.Event()
    model = config.replica.model_path or config.replica.model
    print(
        f"session-router: starting Ray, the router and {config.replicas} replicas ({model})...",
        flush=True,
    )
    try:
        await server.start()
    except ReplicaStartError as exc:
        print(f"session-router: {exc}", file=sys.stderr, flush=True)
        await server.stop()
        return 1
    # After start: ray.init installs its own SIGTERM handler, which must not win over ours.
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    for line in server.listening():
        print(f"session-router: {line}", flush=True)
    print("session-router: ready (Ctrl-C or SIGTERM to stop)", flush=True)
    await stop.wait()
    print("session-router: shutting down: releasing sessions, stopping Ray", flush=True)
    released = await server.stop()
    print(f"session-router: stopped; {released} sessions released", flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    from router.ops import demo, drain, replica_tools, top

    parser = argparse.ArgumentParser(prog="session-router", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    add_arguments(sub.add_parser("serve", help="serve the gRPC session API"), ServeConfig)
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
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "serve":
            return asyncio.run(serve(from_arguments(ServeConfig, args)))
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
        return top.run_top(args.metrics_url, args.interval, 1 if args.once else None)
    except ValueError as exc:
        print(f"session-router: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
