"""The flags every benchmark takes (``--quick``, ``--repeats``) and those of benchmarks on a
local cluster (``--replicas``, ``--threads``, ``--max-sessions``, ``--no-checkpoints``,
``--profile-gateway``)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

FULL_REPEATS = 3
CLUSTER_MAX_CONTEXT = 512  # a benchmark session never holds more
CLUSTER_KV_PER_SESSION = 128


def parser(doc: str, cluster: bool = False) -> argparse.ArgumentParser:
    """``--quick`` and ``--repeats``; with ``cluster``, the local cluster's flags too."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a fast check: fewer, shorter runs")
    p.add_argument(
        "--repeats",
        type=int,
        default=None,
        help=f"repetitions of each measurement (default {FULL_REPEATS}, --quick 1); figures "
        "are the median with min–max",
    )
    if cluster:
        p.add_argument("--replicas", type=int, default=1, help="replica actors (default 1)")
        p.add_argument(
            "--threads",
            type=int,
            default=1,
            help="torch threads per replica and for the in-process engine (the replicas' "
            "threads setting; default 1; 0: serve's default, the cores less one shared among "
            "the replicas)",
        )
        p.add_argument(
            "--max-sessions",
            type=int,
            default=512,
            help="sessions per replica: >= 64 plus what the router reserves between two "
            "snapshots (a close frees room only at the replica's next report, ~1 s)",
        )
        p.add_argument(
            "--no-checkpoints",
            action="store_true",
            help="the replicas without their per-turn session checkpoints (serve's "
            "--no-session-checkpoints): what failover's protection costs, by difference",
        )
        p.add_argument(
            "--profile-gateway",
            metavar="FILE",
            help="cProfile this process (the gateway) during the gRPC runs; print its top",
        )
    return p


def parse(p: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> argparse.Namespace:
    args = p.parse_args(argv)
    if args.repeats is None:
        args.repeats = 1 if args.quick else FULL_REPEATS
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    if getattr(args, "max_sessions", 64) < 64:
        p.error("--max-sessions must be >= 64 (64 concurrent sessions on one replica)")
    return args


def cluster_flags(args: argparse.Namespace) -> dict[str, object]:
    """Serve's flags for the benchmark cluster."""
    return {
        "replicas": args.replicas,
        "threads": args.threads,
        "max_sessions": args.max_sessions,
        "kv_tokens": args.max_sessions * CLUSTER_KV_PER_SESSION,
        "max_context": CLUSTER_MAX_CONTEXT,
        "page_size": 16,
        "session_checkpoints": not args.no_checkpoints,
    }
