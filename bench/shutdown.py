"""How long ``serve`` takes to stop (SIGTERM's path: ``Server.stop``), by replica count.

For each replica count, a local cluster (tiny-bamba, CPU replicas, embedded Ray) with 4 idle
sessions per replica and one turn streaming is stopped, and the time from ``stop()`` to its
return is printed beside its parts' bounds: the gRPC grace (``--shutdown-grace-s``, which a
running turn may use up) and the replicas' shutdown (all at once, bounded by
``REPLICA_SHUTDOWN_TIMEOUT_S`` whatever their count). The KubeRay head's
``terminationGracePeriodSeconds`` must exceed grace + that bound + Ray's stop.

Run: ``python -m bench.shutdown [--quick]``. Goal: the stop time does not grow with the replica
count (4 replicas within 1.5x of 1).
"""

from __future__ import annotations

import asyncio
import time

import grpc

from bench.harness import cli
from bench.harness.report import Goal, Table, number, print_goals
from bench.harness.stats import Spread
from protos import session_router_pb2 as pb
from protos import session_router_pb2_grpc as pb_grpc
from router.config import ServeConfig
from router.control.fleet import REPLICA_SHUTDOWN_TIMEOUT_S
from router.ops.serve import Server

SESSIONS_PER_REPLICA = 4


async def stop_time(replicas: int, grace_s: float) -> tuple[float, int]:
    """Seconds ``Server.stop()`` took with ``replicas`` replicas, and the sessions released."""
    config = ServeConfig.from_flags(
        replicas=replicas,
        threads=1,
        max_sessions=8,
        kv_tokens=2048,
        max_context=512,
        grpc_port=0,
        metrics_port=0,
        http_port=0,
        shutdown_grace_s=grace_s,
    )
    server = Server(config)
    await server.start()
    channel = grpc.aio.insecure_channel(server.grpc_address)
    stub = pb_grpc.SessionServiceStub(channel)
    sessions = [
        await stub.OpenSession(pb.OpenSessionRequest())
        for _ in range(replicas * SESSIONS_PER_REPLICA)
    ]
    turn = stub.Generate(
        pb.GenerateRequest(
            session_id=sessions[0].session_id,
            tokens=pb.TokenIds(ids=[1, 2, 3]),
            sampling=pb.SamplingParams(max_new_tokens=200),
        )
    )
    await turn.read()  # streaming when the stop begins
    started = time.perf_counter()
    released = await server.stop()
    took = time.perf_counter() - started
    turn.cancel()
    await channel.close()
    return took, released


async def main() -> None:
    args = cli.parser(__doc__).parse_args()
    counts = (1, 2) if args.quick else (1, 4)
    grace_s = 2.0
    table = Table("replicas", "sessions released", "stop (s)", "bound (s)")
    took = {}
    for count in counts:
        took[count], released = await stop_time(count, grace_s)
        bound = grace_s + REPLICA_SHUTDOWN_TIMEOUT_S
        table.add(count, released, number(took[count]), number(bound))
    table.print()
    few, many = counts
    growth = Spread.of([took[many] / took[few]])
    print_goals([Goal(f"stop time, {many} replicas / {few}", growth, 1.5, at_least=False)])


if __name__ == "__main__":
    asyncio.run(main())
