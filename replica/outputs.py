"""What the engine reports after a step: typed, picklable events per turn and per session."""

from __future__ import annotations

from dataclasses import dataclass

from replica.engine.request import FinishReason


@dataclass(frozen=True, slots=True)
class TurnEvent:
    """Tokens a turn produced in one engine step, and its end when ``finished``.

    ``error_code``/``error`` are set when the turn failed (a gRPC status name and a message);
    ``committed_tokens`` is where the session stands after the turn (set when finished).
    """

    session_id: str
    turn_id: int
    token_ids: tuple[int, ...] = ()
    text: str = ""
    finish_reason: FinishReason | None = None
    committed_tokens: int = 0
    error_code: str | None = None
    error: str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None or self.error_code is not None


@dataclass(frozen=True, slots=True)
class SessionInfo:
    session_id: str
    committed_tokens: int
    max_context_tokens: int
    turn_running: bool
    idle_timeout_s: float


@dataclass(frozen=True, slots=True)
class ActorError:
    """A refused call, returned (not raised) across Ray: ``code`` is a gRPC status name."""

    code: str
    message: str


@dataclass(frozen=True, slots=True)
class ReplicaDescription:
    """What the router needs to know about a replica to place sessions on it."""

    replica_id: str
    node_id: str
    incarnation: str
    mamba_slots_per_session: int
    kv_tokens_per_session: int
    max_context: int
    vocab_size: int
