"""The batched calls of a gateway to a replica, as they run on the engine thread.

A gateway sends the opens and turn submissions that pile up while its previous call to a replica
is in flight as one call (``router.gateway.replica_calls``): one actor call, one command on the
engine thread and one snapshot for many sessions. Each request succeeds or is refused on its own
(an ``ActorError`` in its place); the arguments are plain tuples (``replica.api.OpenArgs``,
``TurnArgs``), which pickle several times faster than dataclasses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from replica.api import (
    ActorError,
    ForkedTurn,
    OpenArgs,
    OpenedBatch,
    ReleaseReason,
    ReplicaError,
    SamplingParams,
    SessionInfo,
    SessionMovingError,
    StatusCode,
)

if TYPE_CHECKING:
    from replica.engine.engine import Engine

# the result of a chat turn that does not continue the state it names: nothing was done (no
# fork made, nothing released, nothing queued); the caller replays the conversation
NOT_FED = ActorError(StatusCode.FAILED_PRECONDITION, "the turn does not continue the state")


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


def submit_batch(
    engine: Engine, gateway_id: str, turns: list[tuple]
) -> list[int | ForkedTurn | ActorError]:
    """Queue each turn (``(session_id, input_ids, sampling[, fork[, continues]])``, or the
    ``ActorError`` that refused its input already); each result is its turn id (a
    ``ForkedTurn`` for one given a fork's ``(child_id, lease_s[, replaces])``) or its refusal.
    A turn given ``continues`` (a chat turn: how many committed tokens the session must hold,
    those its caller saw it end at) goes only when the session holds exactly that many, else
    ``NOT_FED`` (a failover restored it from an older checkpoint); such a turn's end is not held
    for its checkpoint, since its next turn names the state it continues in the same way.
    Events go to ``gateway_id``'s stream."""
    results: list[int | ForkedTurn | ActorError] = []
    for turn in turns:
        if isinstance(turn, ActorError):
            results.append(turn)
            continue
        session_id, input_ids, sampling, *rest = turn
        fork = rest[0] if rest else None
        continues = rest[1] if len(rest) > 1 else None
        if continues is not None and not engine.continues(session_id, continues):
            results.append(NOT_FED)
            continue
        names_state = continues is not None
        try:
            if fork:
                turn_args = (session_id, input_ids, sampling)
                forked = fork_then_submit(
                    engine, gateway_id, turn_args, *fork, names_state=names_state
                )
                results.append(forked)
            else:
                req = engine.submit(session_id, input_ids, sampling, gateway_id, names_state)
                results.append(req.rid)
        except ReplicaError as exc:
            results.append(exc.to_actor_error())
    return results


def fork_then_submit(
    engine: Engine,
    gateway_id: str,
    turn: tuple[str, list[int], SamplingParams],
    child_id: str,
    lease_s: float,
    replaces: str | None = None,
    names_state: bool = False,
) -> ForkedTurn:
    """Release ``replaces`` (the rollback point this fork replaces: its room is the fork's),
    fork the turn's session into ``child_id`` (its state before the turn: a rollback point;
    ``lease_s`` > 0: a stream holds it open from the start, as an open's lease), then queue the
    turn, in one command: no step runs between them. A fork that cannot be made (no room, the
    replica drains) is no reason to refuse the turn, which runs without one (``ForkedTurn.fork``
    says why); a refused turn releases the fork it made and raises its refusal. ``replaces``
    is not released when it is not open here or moves away (``ForkedTurn.replaced`` False)."""
    session_id, input_ids, sampling = turn
    replaced = False
    if replaces is not None:
        try:
            replaced = engine.close_session(replaces, ReleaseReason.STREAM_ENDED)
        except SessionMovingError:
            pass  # its caller releases it where it goes
    try:
        fork: SessionInfo | ActorError = engine.fork_session(session_id, child_id, gateway_id)
    except ReplicaError as exc:
        fork = exc.to_actor_error()
    else:
        if lease_s > 0:
            engine.leases.hold([child_id], lease_s)
    try:
        turn_id = engine.submit(session_id, input_ids, sampling, gateway_id, names_state).rid
    except BaseException:
        if not isinstance(fork, ActorError):
            engine.close_session(child_id, ReleaseReason.ABORTED)
        raise
    return ForkedTurn(turn_id, fork, replaced)
