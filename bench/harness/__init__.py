"""What the benchmarks share, one concept per module:

- ``stats``: percentiles (``statistics.quantiles``) and min/median/max over repetitions.
- ``report``: aligned tables, ratios, goals (met / not met).
- ``cli``: the flags every benchmark takes (``--quick``, ``--repeats``, cluster flags).
- ``runner``: the entry point of a benchmark on a local cluster (flags, cluster, goals).
- ``workload``: the prompt, the lifecycle record and token rounds, shared by every driver.
- ``window``: which lifecycles of a closed loop are measured, and their samples.
- ``load``: closed-loop load, sequential latencies, calls/s at a fixed number in flight.
- ``cluster``: a local cluster (Ray, router, replicas, gateway) from ``ServeConfig.from_flags``.
- ``client_process``: a gRPC client in a child process, as a real client would be.
- ``grpc_driver``: the session workloads through the gateway, run in that child process.
- ``direct_driver``: the same workloads straight on the replica actors (a gateway minus gRPC).
- ``inprocess_driver``: the same workloads on an ``Engine`` on this thread.
- ``cpu``: CPU seconds per process group (this process, the client, replicas, router, Ray).
- ``profile``: an optional cProfile of this process (the gateway) during chosen calls.

The three drivers expose the same ``lifecycles`` and ``token_rounds`` workloads, so a benchmark
compares paths by running the same call on each.
"""
