"""The batched calls of a gateway to a replica, as they run on the engine thread.

A gateway sends the opens and turn submissions that pile up while its previous call to a replica
is in flight as one call (``router.gateway.replica_calls``): one actor call, one command on the
engine thread and one snapshot for many sessions. Each request succeeds or is refused on its own
(an ``ActorError`` in its place); the arguments are plain tuples (``replica.api.OpenArgs``,
``TurnArgs``), which pickle several times faster than dataclasses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from replica.api import ActorError, OpenArgs, OpenedBatch, ReplicaError, SessionInfo

if TYPE_CHECKING:
    from replica.engine.engine import Engine


def open_batch(engine: Engine, requests: list[OpenArgs]) -> OpenedBatch:
    """Open each session (``lease_s`` > 0: a stream holds it open from the start; a prefix
    text is tokenized as turn text is); the snapshot is taken after the last, so it counts every
    one of them."""
    results: list[SessionInfo | ActorError] = []
    for session_id, idle_timeout_s, gateway_id, tenant, lease_s, *rest in requests:
        prefix = rest[0] if rest else None
        try:
            if isinstance(prefix, str):
                prefix = engine.tokenizer.encode(prefix)
            info = engine.open_session(session_id, idle_timeout_s, tenant, gateway_id, prefix)
        except ReplicaError as exc:
            results.append(exc.to_actor_error())
            continue
        if lease_s > 0:
            engine.leases.hold([session_id], lease_s)
        results.append(info)
    return OpenedBatch(tuple(results), engine.snapshot())


def submit_batch(engine: Engine, gateway_id: str, turns: list[tuple]) -> list[int | ActorError]:
    """Queue each turn (``(session_id, input_ids, sampling)``, or the ``ActorError`` that
    refused its input already); each result is its turn id or its refusal. Events go to
    ``gateway_id``'s stream."""
    results: list[int | ActorError] = []
    for turn in turns:
        if isinstance(turn, ActorError):
            results.append(turn)
            continue
        session_id, input_ids, sampling = turn
        try:
            results.append(engine.submit(session_id, input_ids, sampling, gateway_id).rid)
        except ReplicaError as exc:
            results.append(exc.to_actor_error())
    return results
