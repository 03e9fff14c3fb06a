"""The replica's Ray actor, as a package of the parts it builds and owns
(``replica.actor.replica_actor``), and the typed client every caller uses
(``replica.actor.client``). ``remote_replica_actor()`` is the Ray actor class a replica is started
from: it declares the concurrency groups its output streams run in, which Ray takes only there.

``ReplicaActor`` and ``CheckpointStore`` (the serve process starts one store per replica) are
imported on first use: a checkpoint store imports ``replica.actor.client`` and must not load the
actor's modules, and the store's own module imports this package's client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from replica.actor.replica_actor import ReplicaActor
    from replica.checkpoints.store import CheckpointStore

__all__ = ["CheckpointStore", "ReplicaActor", "remote_replica_actor"]


def remote_replica_actor(stream_threads: int | None = None) -> Any:
    """``ReplicaActor`` as a Ray actor class with ``stream_threads`` output stream groups (the
    default: ``OUTPUT_STREAM_THREADS``; pass the same number to the actor)."""
    import ray

    from replica.actor.replica_actor import ReplicaActor
    from replica.actor.stream_threads import OUTPUT_STREAM_THREADS, concurrency_groups

    groups = concurrency_groups(stream_threads or OUTPUT_STREAM_THREADS)
    return ray.remote(concurrency_groups=groups)(ReplicaActor)


def __getattr__(name: str) -> Any:
    if name == "ReplicaActor":
        from replica.actor.replica_actor import ReplicaActor

        return ReplicaActor
    if name == "CheckpointStore":
        from replica.checkpoints.store import CheckpointStore

        return CheckpointStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
