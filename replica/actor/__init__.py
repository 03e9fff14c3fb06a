"""The replica's Ray actor, as a package of the parts it builds and owns
(``replica.actor.replica_actor``), and the typed client every caller uses
(``replica.actor.client``).

``ReplicaActor`` and ``CheckpointStore`` (the serve process starts one store per replica) are
imported on first use: a checkpoint store imports ``replica.actor.client`` and must not load the
actor's modules, and the store's own module imports this package's client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from replica.actor.replica_actor import ReplicaActor
    from replica.checkpoints.store import CheckpointStore

__all__ = ["CheckpointStore", "ReplicaActor"]


def __getattr__(name: str) -> Any:
    if name == "ReplicaActor":
        from replica.actor.replica_actor import ReplicaActor

        return ReplicaActor
    if name == "CheckpointStore":
        from replica.checkpoints.store import CheckpointStore

        return CheckpointStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
