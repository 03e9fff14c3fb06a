"""Router overhead: what the gateway and Ray cost on top of the engine, all on one cluster.

Runs, in order and on one local cluster (one start-up instead of three):

- ``bench.lifecycles``: open -> 8-token turn -> close at concurrency 1/16/64, gateway vs direct to
  the replica actor vs the engine in-process, with the raw actor-call yardstick;
- ``bench.tokens``: tokens/s to 64 concurrent sessions on one replica, gRPC vs actor vs
  in-process, and the CPU per 1,000 tokens of each process group;
- ``bench.rpc_latency``: the gateway's added latency per RPC against the gRPC round trip alone;

then the goals of all three. Each also runs alone (``python -m bench.NAME``).

Run: ``python -m bench.router_overhead [--quick] [--threads N] [--profile-gateway FILE]``.
"""

from __future__ import annotations

from bench import lifecycles, rpc_latency, tokens
from bench.harness import runner

if __name__ == "__main__":
    runner.main(__doc__, lifecycles.measure, tokens.measure, rpc_latency.measure)
