"""Conversions between the wire (``session_router.v1``) and the typed values of the replicas."""

from __future__ import annotations

import grpc

from protos import session_router_pb2 as pb
from replica.api import (
    ActorError,
    InvalidRequestError,
    SamplingParams,
    SessionInfo,
    StatusCode,
)
from router.control.api import ReplicaView
from router.gateway.inbox import Piece

MAX_STOP_TOKENS = 64
MAX_TEXT_BYTES = 1 << 20  # of a turn's text, or of an open's prefix text


class Refused(Exception):
    """Ends an RPC with ``code`` and ``message``."""

    def __init__(self, code: StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = StatusCode(code)


def check(result):
    """``result`` itself, or ``Refused`` when it is an ``ActorError``."""
    if isinstance(result, ActorError):
        raise Refused(result.code, result.message)
    return result


def status_code(code: StatusCode) -> grpc.StatusCode:
    return grpc.StatusCode[StatusCode(code).value]


def sampling_from_proto(msg: pb.SamplingParams) -> SamplingParams:
    """Raises ``InvalidRequestError`` for parameters out of range. ``top_p`` 0 and an absent
    ``top_k`` are unset (the model's defaults); the other fields are as sent (proto3 cannot tell
    0 from unset: ``max_new_tokens`` 0 appends only, ``temperature`` 0 is greedy)."""
    if len(msg.stop_token_ids) > MAX_STOP_TOKENS:
        raise InvalidRequestError(f"at most {MAX_STOP_TOKENS} stop tokens")
    return SamplingParams(
        max_new_tokens=msg.max_new_tokens,
        temperature=msg.temperature,
        top_p=msg.top_p if msg.top_p != 0.0 else None,
        seed=msg.seed,
        stop_token_ids=tuple(msg.stop_token_ids),
        top_k=msg.top_k if msg.HasField("top_k") else None,
        stop=tuple(msg.stop),
        ignore_eos=msg.ignore_eos,
    )


def turn_input(msg: pb.GenerateRequest) -> tuple[str | None, list[int] | None]:
    kind = msg.WhichOneof("input")
    if kind == "text":
        return msg.text, None
    if kind == "tokens":
        return None, list(msg.tokens.ids)
    return None, []


def turn_of(msg: pb.GenerateRequest) -> tuple[str | None, list[int] | None, SamplingParams]:
    """A turn in the replicas' terms: its text or token ids, and its sampling (``Refused``
    INVALID_ARGUMENT for parameters out of range)."""
    try:
        sampling = sampling_from_proto(msg.sampling)
    except InvalidRequestError as exc:
        raise Refused(StatusCode.INVALID_ARGUMENT, str(exc)) from None
    return *turn_input(msg), sampling


def open_prefix(msg: pb.OpenSessionRequest) -> str | list[int] | None:
    """The prefix an open asks the session to start from: text, token ids, or None."""
    kind = msg.WhichOneof("prefix")
    if kind == "prefix_text":
        return msg.prefix_text
    if kind == "prefix_tokens":
        return list(msg.prefix_tokens.ids)
    return None


def session_to_proto(session_id: str, replica_id: str, info: SessionInfo) -> pb.Session:
    return pb.Session(
        session_id=session_id,
        replica_id=replica_id,
        committed_tokens=info.committed_tokens,
        max_context_tokens=info.max_context_tokens,
        turn_running=info.turn_running,
        parked=info.parked,
        cached_tokens=info.cached_tokens,
    )


def chunk_from_piece(piece: Piece) -> pb.GenerateChunk:
    """One message of a turn; raises ``Refused`` when the piece ends its turn with an error."""
    end = piece.end
    if end is None:
        return pb.GenerateChunk(token_ids=piece.token_ids, text=piece.text)
    if end.error_code is not None:
        raise Refused(end.error_code, end.error or "turn failed")
    return pb.GenerateChunk(
        token_ids=piece.token_ids,
        text=piece.text,
        finish_reason=int(end.finish_reason),
        committed_tokens=end.committed_tokens,
    )


def replica_to_proto(view: ReplicaView) -> pb.ReplicaInfo:
    info = pb.ReplicaInfo(
        replica_id=view.replica_id,
        node_id=view.node_id,
        state=int(view.health),
        sessions_pinned=view.sessions_pinned,
        snapshot_age_s=view.snapshot_age_s,
    )
    snap = view.snapshot
    if snap is not None:
        info.sessions = snap.open_sessions
        info.sessions_parked = snap.parking.sessions_parked
        info.running_requests = snap.running_requests
        info.waiting_requests = snap.waiting_requests
        for stats in snap.pools:
            info.pools.add(
                pool=stats.pool,
                capacity=stats.capacity,
                free=stats.free,
                in_use=stats.in_use,
                session_held=stats.session_held,
                cached=stats.cached,
                leaked=stats.leaked,
            )
    return info
