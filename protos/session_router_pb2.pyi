from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_INTERRUPTED: _ClassVar[FinishReason]

class ReplicaState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REPLICA_STATE_UNSPECIFIED: _ClassVar[ReplicaState]
    REPLICA_STATE_HEALTHY: _ClassVar[ReplicaState]
    REPLICA_STATE_DRAINING: _ClassVar[ReplicaState]
    REPLICA_STATE_DEAD: _ClassVar[ReplicaState]
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_INTERRUPTED: FinishReason
REPLICA_STATE_UNSPECIFIED: ReplicaState
REPLICA_STATE_HEALTHY: ReplicaState
REPLICA_STATE_DRAINING: ReplicaState
REPLICA_STATE_DEAD: ReplicaState

class TokenIds(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ("max_new_tokens", "temperature", "top_p", "seed", "stop_token_ids", "ignore_eos", "stop", "top_k")
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    max_new_tokens: int
    temperature: float
    top_p: float
    seed: int
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    ignore_eos: bool
    stop: _containers.RepeatedScalarFieldContainer[str]
    top_k: int
    def __init__(self, max_new_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., seed: _Optional[int] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., ignore_eos: _Optional[bool] = ..., stop: _Optional[_Iterable[str]] = ..., top_k: _Optional[int] = ...) -> None: ...

class OpenSessionRequest(_message.Message):
    __slots__ = ("idle_timeout_s", "prefix_text", "prefix_tokens")
    IDLE_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    PREFIX_TEXT_FIELD_NUMBER: _ClassVar[int]
    PREFIX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    idle_timeout_s: float
    prefix_text: str
    prefix_tokens: TokenIds
    def __init__(self, idle_timeout_s: _Optional[float] = ..., prefix_text: _Optional[str] = ..., prefix_tokens: _Optional[_Union[TokenIds, _Mapping]] = ...) -> None: ...

class Session(_message.Message):
    __slots__ = ("session_id", "replica_id", "committed_tokens", "max_context_tokens", "turn_running", "parked", "cached_tokens")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_CONTEXT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TURN_RUNNING_FIELD_NUMBER: _ClassVar[int]
    PARKED_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    replica_id: str
    committed_tokens: int
    max_context_tokens: int
    turn_running: bool
    parked: bool
    cached_tokens: int
    def __init__(self, session_id: _Optional[str] = ..., replica_id: _Optional[str] = ..., committed_tokens: _Optional[int] = ..., max_context_tokens: _Optional[int] = ..., turn_running: _Optional[bool] = ..., parked: _Optional[bool] = ..., cached_tokens: _Optional[int] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("session_id", "text", "tokens", "sampling")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    text: str
    tokens: TokenIds
    sampling: SamplingParams
    def __init__(self, session_id: _Optional[str] = ..., text: _Optional[str] = ..., tokens: _Optional[_Union[TokenIds, _Mapping]] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ...) -> None: ...

class GenerateChunk(_message.Message):
    __slots__ = ("token_ids", "text", "finish_reason", "committed_tokens")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    text: str
    finish_reason: FinishReason
    committed_tokens: int
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., text: _Optional[str] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., committed_tokens: _Optional[int] = ...) -> None: ...

class CloseSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class CloseSessionResponse(_message.Message):
    __slots__ = ("was_open",)
    WAS_OPEN_FIELD_NUMBER: _ClassVar[int]
    was_open: bool
    def __init__(self, was_open: _Optional[bool] = ...) -> None: ...

class GetSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class ForkSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class ConverseRequest(_message.Message):
    __slots__ = ("open", "input", "interrupt")
    OPEN_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    INTERRUPT_FIELD_NUMBER: _ClassVar[int]
    open: OpenSessionRequest
    input: GenerateRequest
    interrupt: Interrupt
    def __init__(self, open: _Optional[_Union[OpenSessionRequest, _Mapping]] = ..., input: _Optional[_Union[GenerateRequest, _Mapping]] = ..., interrupt: _Optional[_Union[Interrupt, _Mapping]] = ...) -> None: ...

class Interrupt(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ConverseResponse(_message.Message):
    __slots__ = ("opened", "chunk")
    OPENED_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    opened: Session
    chunk: GenerateChunk
    def __init__(self, opened: _Optional[_Union[Session, _Mapping]] = ..., chunk: _Optional[_Union[GenerateChunk, _Mapping]] = ...) -> None: ...

class PoolStats(_message.Message):
    __slots__ = ("pool", "capacity", "free", "in_use", "session_held", "cached", "leaked")
    POOL_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    FREE_FIELD_NUMBER: _ClassVar[int]
    IN_USE_FIELD_NUMBER: _ClassVar[int]
    SESSION_HELD_FIELD_NUMBER: _ClassVar[int]
    CACHED_FIELD_NUMBER: _ClassVar[int]
    LEAKED_FIELD_NUMBER: _ClassVar[int]
    pool: str
    capacity: int
    free: int
    in_use: int
    session_held: int
    cached: int
    leaked: int
    def __init__(self, pool: _Optional[str] = ..., capacity: _Optional[int] = ..., free: _Optional[int] = ..., in_use: _Optional[int] = ..., session_held: _Optional[int] = ..., cached: _Optional[int] = ..., leaked: _Optional[int] = ...) -> None: ...

class ReplicaInfo(_message.Message):
    __slots__ = ("replica_id", "node_id", "state", "pools", "sessions", "sessions_pinned", "running_requests", "waiting_requests", "snapshot_age_s", "sessions_parked")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    POOLS_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_PINNED_FIELD_NUMBER: _ClassVar[int]
    RUNNING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    WAITING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_AGE_S_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_PARKED_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    node_id: str
    state: ReplicaState
    pools: _containers.RepeatedCompositeFieldContainer[PoolStats]
    sessions: int
    sessions_pinned: int
    running_requests: int
    waiting_requests: int
    snapshot_age_s: float
    sessions_parked: int
    def __init__(self, replica_id: _Optional[str] = ..., node_id: _Optional[str] = ..., state: _Optional[_Union[ReplicaState, str]] = ..., pools: _Optional[_Iterable[_Union[PoolStats, _Mapping]]] = ..., sessions: _Optional[int] = ..., sessions_pinned: _Optional[int] = ..., running_requests: _Optional[int] = ..., waiting_requests: _Optional[int] = ..., snapshot_age_s: _Optional[float] = ..., sessions_parked: _Optional[int] = ...) -> None: ...

class ListReplicasRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListReplicasResponse(_message.Message):
    __slots__ = ("replicas",)
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaInfo]
    def __init__(self, replicas: _Optional[_Iterable[_Union[ReplicaInfo, _Mapping]]] = ...) -> None: ...

class DrainReplicaRequest(_message.Message):
    __slots__ = ("replica_id", "migrate")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    MIGRATE_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    migrate: bool
    def __init__(self, replica_id: _Optional[str] = ..., migrate: _Optional[bool] = ...) -> None: ...

class DrainReplicaResponse(_message.Message):
    __slots__ = ("replica", "sessions_migrated", "sessions_left")
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_MIGRATED_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_LEFT_FIELD_NUMBER: _ClassVar[int]
    replica: ReplicaInfo
    sessions_migrated: int
    sessions_left: int
    def __init__(self, replica: _Optional[_Union[ReplicaInfo, _Mapping]] = ..., sessions_migrated: _Optional[int] = ..., sessions_left: _Optional[int] = ...) -> None: ...

class ResumeReplicaRequest(_message.Message):
    __slots__ = ("replica_id",)
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    def __init__(self, replica_id: _Optional[str] = ...) -> None: ...

class ResumeReplicaResponse(_message.Message):
    __slots__ = ("replica",)
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    replica: ReplicaInfo
    def __init__(self, replica: _Optional[_Union[ReplicaInfo, _Mapping]] = ...) -> None: ...

class MigrateSessionRequest(_message.Message):
    __slots__ = ("session_id", "target_replica_id")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    target_replica_id: str
    def __init__(self, session_id: _Optional[str] = ..., target_replica_id: _Optional[str] = ...) -> None: ...
