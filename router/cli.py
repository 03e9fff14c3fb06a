"""The ``session-router`` command: ``serve``, ``demo`` and ``top``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Sequence

from router.server import ServeConfig, Server


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    d = ServeConfig()
    a = parser.add_argument
    a("--address", default=None, help="Ray address to join ('auto'); default: embedded local Ray")
    a("--replicas", type=int, default=d.replicas, help="replica actors to start")
    a("--model", default=d.model, help="built-in model (tiny-bamba)")
    a("--model-path", default=None, help="HF-format Bamba checkpoint directory")
    a(
        "--max-sessions",
        type=int,
        default=d.max_sessions,
        help="sessions one replica holds at once (sizes req rows and the mamba pool)",
    )
    a("--kv-tokens", type=int, default=d.kv_tokens, help="KV token slots per replica")
    a("--max-context", type=int, default=d.max_context, help="tokens one session may hold")
    a("--page-size", type=int, default=d.page_size, help="KV page size in tokens")
    a(
        "--mamba-track-buffers",
        type=int,
        choices=(0, 1, 2),
        default=d.mamba_track_buffers,
        help="extra mamba slots per session; >= 1 makes turns atomic",
    )
    a("--session-idle-timeout-s", type=float, default=d.session_idle_timeout_s)
    a(
        "--open-timeout-s",
        type=float,
        default=d.open_timeout_s,
        help="how long OpenSession waits for room before RESOURCE_EXHAUSTED",
    )
    a("--grpc-port", type=int, default=d.grpc_port)
    a("--metrics-port", type=int, default=d.metrics_port)
    a("--host", default=d.host, help="interface to listen on")
    a("--replica-gpus", type=float, default=d.replica_gpus, help="GPUs per replica (0: CPU)")
    a("--api-keys", default=None, help="file of 'KEY TENANT' lines; default: no auth")
    a("--strict", action="store_true", help="raise on any pool accounting violation")


def serve_config(args: argparse.Namespace) -> ServeConfig:
    return ServeConfig(
        address=args.address,
        replicas=args.replicas,
        model=args.model,
        model_path=args.model_path,
        max_sessions=args.max_sessions,
        kv_tokens=args.kv_tokens,
        max_context=args.max_context,
        page_size=args.page_size,
        mamba_track_buffers=args.mamba_track_buffers,
        session_idle_timeout_s=args.session_idle_timeout_s,
        open_timeout_s=args.open_timeout_s,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        host=args.host,
        replica_gpus=args.replica_gpus,
        api_keys=args.api_keys,
        strict=args.strict,
    )


async def serve(config: ServeConfig) -> int:
    server = Server(config)
    stop = asyncio.Event()
    print(
        "session-router: starting Ray, the router and "
        f"{config.replicas} replicas ({config.model_path or config.model})...",
        flush=True,
    )
    await server.start()
    # After start: ray.init installs its own SIGTERM handler, which must not win over ours.
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print(f"session-router: gRPC listening on {server.grpc_address}", flush=True)
    print(f"session-router: metrics on {server.metrics_url}", flush=True)
    print("session-router: ready (Ctrl-C or SIGTERM to stop)", flush=True)
    await stop.wait()
    print("session-router: shutting down: releasing sessions, stopping Ray", flush=True)
    await server.stop()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="session-router", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    add_serve_arguments(sub.add_parser("serve", help="serve the gRPC session API"))
    demo = sub.add_parser("demo", help="run many short sessions on a local cluster")
    from router.demo import add_arguments as add_demo_arguments

    add_demo_arguments(demo)
    from router.top import add_arguments as add_top_arguments

    add_top_arguments(sub.add_parser("top", help="live per-replica table of the pools"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "serve":
            return asyncio.run(serve(serve_config(args)))
        if args.command == "demo":
            from router.demo import run_demo

            return asyncio.run(run_demo(args))
        from router.top import run_top

        return run_top(args.metrics_url, args.interval, 1 if args.once else None)
    except ValueError as exc:
        print(f"session-router: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
