"""Everything that crosses the Ray boundary between a replica and the router or a gateway.

Plain, picklable values and nothing else: the pool snapshot, sampling parameters, turn events,
session facts, the replica's description, refusals with their one status-code enum, release
reasons and pool names. Importing this module imports no torch, so the router and the gateways
stay light. A refusal travels as an ``ActorError`` value (returned, never raised across Ray);
inside the replica it is the matching ``ReplicaError`` exception.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class StatusCode(str, enum.Enum):
    """A gRPC status name; the gateway answers with ``grpc.StatusCode[code.value]``."""

    OK = "OK"
    CANCELLED = "CANCELLED"
    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    NOT_FOUND = "NOT_FOUND"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
    FAILED_PRECONDITION = "FAILED_PRECONDITION"
    ABORTED = "ABORTED"
    OUT_OF_RANGE = "OUT_OF_RANGE"
    INTERNAL = "INTERNAL"
    UNAVAILABLE = "UNAVAILABLE"
    UNAUTHENTICATED = "UNAUTHENTICATED"
    UNIMPLEMENTED = "UNIMPLEMENTED"


class ReleaseReason(str, enum.Enum):
    """Why a session's slots were freed (the ``reason`` label of the released counter)."""

    CLOSED = "closed"
    STREAM_ENDED = "stream_ended"
    IDLE_TIMEOUT = "idle_timeout"
    ABORTED = "aborted"
    REPLICA_LOST = "replica_lost"
    MIGRATED = "migrated"


class MigrationReason(str, enum.Enum):
    """Why a session moved to another replica (the ``reason`` label of the migrated counter)."""

    DRAIN = "drain"  # DrainReplica(migrate=true)
    ADMIN = "admin"  # MigrateSession
    FAILOVER = "failover"  # its replica died; restored from its checkpoint


class FinishReason(enum.IntEnum):
    """Values match ``session_router.v1.FinishReason``."""

    UNSPECIFIED = 0
    STOP = 1
    LENGTH = 2
    INTERRUPTED = 3


POOL_NAMES = ("mamba", "kv_tokens", "req", "host_mamba", "host_kv_tokens", "checkpoints")
HOST_POOL_NAMES = ("host_mamba", "host_kv_tokens")  # present only on replicas that park
CHECKPOINT_POOL = "checkpoints"  # present only on replicas that checkpoint sessions
POOL_STATES = ("free", "in_use", "session_held", "cached")


MAX_ECHOED_ID_CHARS = 64


def clip_id(value: str) -> str:
    """A client-sent id as error messages may echo it: cut to ``MAX_ECHOED_ID_CHARS``, so a
    hostile 10 KB id does not come back whole."""
    if len(value) <= MAX_ECHOED_ID_CHARS:
        return value
    return f"{value[:MAX_ECHOED_ID_CHARS]}... ({len(value)} characters)"


def replica_lost_message(session_id: str) -> str:
    return (
        f"the replica of session {clip_id(session_id)} died and its state is gone; "
        "open a new session"
    )


def session_restored_message(session_id: str, committed_tokens: int) -> str:
    return (
        f"the replica of session {clip_id(session_id)} died during this turn; retry the turn: "
        f"the session continues at committed_tokens {committed_tokens}"
    )


# ----- refusals --------------------------------------------------------------------------------


class ReplicaError(Exception):
    """A refusal raised inside a replica; ``code`` is the status the gateway answers with."""

    code = StatusCode.INTERNAL

    def to_actor_error(self) -> ActorError:
        return ActorError(self.code, str(self))


class PoolExhaustedError(ReplicaError):
    """A pool has too few free slots for an allocation. Raised instead of asserting."""

    code = StatusCode.RESOURCE_EXHAUSTED


class SlotStateError(ReplicaError):
    """Misuse of a pool: double free, freeing a slot never allocated, an index out of range."""


class SessionNotFoundError(ReplicaError):
    code = StatusCode.NOT_FOUND


class TurnRunningError(ReplicaError):
    code = StatusCode.FAILED_PRECONDITION


class ContextOverflowError(ReplicaError):
    code = StatusCode.OUT_OF_RANGE


class InvalidRequestError(ReplicaError):
    code = StatusCode.INVALID_ARGUMENT


class ReplicaDrainingError(ReplicaError):
    code = StatusCode.RESOURCE_EXHAUSTED


class SessionMovingError(ReplicaError):
    """The session is moving to another replica: ask the router where it is, and retry there
    (the gateway does; a client never sees this)."""

    code = StatusCode.UNAVAILABLE


class IncompatibleStateError(ReplicaError):
    """Session state exported by a replica of another model (or format) than this one."""

    code = StatusCode.FAILED_PRECONDITION


@dataclass(frozen=True, slots=True)
class ActorError:
    """A refused call, returned (not raised) across Ray."""

    code: StatusCode
    message: str


# ----- turns -----------------------------------------------------------------------------------


MIN_TEMPERATURE = 1e-5


MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 256


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Validated on construction; out-of-range values raise ``InvalidRequestError``.
    Temperatures below ``MIN_TEMPERATURE`` (0 included) are greedy: at such a temperature
    sampling is greedy to within float precision, and ``logits / temperature`` would overflow.

    ``None`` is "unset": the engine fills it from the checkpoint's ``generation_config.json``
    (``GenerationDefaults.apply``), else from the built-in default (16 new tokens, greedy, top_p
    and top_k off); the turns it runs always carry concrete values. The model's EOS ids end a turn
    (FINISH_REASON_STOP) unless ``ignore_eos``; ``stop`` strings end it at the token that completes
    one, and are not streamed."""

    max_new_tokens: int | None = None
    temperature: float | None = None  # 0 (or below MIN_TEMPERATURE): greedy
    top_p: float | None = None  # 1: off
    seed: int = 0
    stop_token_ids: tuple[int, ...] = ()
    top_k: int | None = None  # 0: off
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    eos_token_ids: tuple[int, ...] = ()  # the model's, set by the engine (GenerationDefaults)

    def __post_init__(self) -> None:
        if self.max_new_tokens is not None and self.max_new_tokens < 0:
            raise InvalidRequestError(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")
        t = self.temperature
        if t is not None and (not 0.0 <= t <= 100.0 or t != t):
            raise InvalidRequestError(f"temperature must be in [0, 100], got {t}")
        if self.top_p is not None and (not 0.0 <= self.top_p <= 1.0 or self.top_p != self.top_p):
            raise InvalidRequestError(f"top_p must be in [0, 1], got {self.top_p}")
        if self.top_k is not None and self.top_k < 0:
            raise InvalidRequestError(f"top_k must be >= 0, got {self.top_k}")
        if not 0 <= self.seed < 2**64:
            raise InvalidRequestError(f"seed must be in [0, 2**64), got {self.seed}")
        if len(self.stop) > MAX_STOP_STRINGS:
            raise InvalidRequestError(f"at most {MAX_STOP_STRINGS} stop strings")
        if any(not s or len(s) > MAX_STOP_STRING_CHARS for s in self.stop):
            raise InvalidRequestError(
                f"stop strings must be 1 to {MAX_STOP_STRING_CHARS} characters long"
            )

    @property
    def greedy(self) -> bool:
        return (self.temperature or 0.0) < MIN_TEMPERATURE


@dataclass(frozen=True, slots=True)
class TurnEvent:
    """Tokens a turn produced in one engine step, and its end when ``finished``.

    ``error_code``/``error`` are set when the turn failed; ``committed_tokens`` is where the
    session stands after the turn (set when finished). ``turn_id`` -1 marks an event about the
    session rather than one turn (its replica was lost). ``gateway_id`` is the gateway whose
    stream the event goes to.
    """

    session_id: str
    turn_id: int
    token_ids: tuple[int, ...] = ()
    text: str = ""
    finish_reason: FinishReason | None = None
    committed_tokens: int = 0
    error_code: StatusCode | None = None
    error: str | None = None
    gateway_id: str = ""

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None or self.error_code is not None


# A gateway's output stream (``ReplicaActor.stream_outputs``) yields lists of entries in the order
# the engine produced them: ``TokenRows`` for the tokens of the running turns of engine steps (one
# row per turn and step: the rows of a ``StepOutputs`` that go to that gateway; consecutive
# steps' rows merged), a ``TurnEvent`` for the last event of a turn (finish or error), for events
# about a session (turn_id -1), and for tokens held back and sent on later. The gateway hands
# each row to its session's call as a ``TokenEntry``. Plain lists and tuples pickle about ten
# times faster than dataclasses, and nearly every token is a row.
# (session_ids: list[str], turn_ids: list[int], token_ids: list[int], texts: list[str])
TokenRows = tuple
TokenEntry = list  # [session_id: str, turn_id: int, token_ids: list[int], text: str]
DeliveryEntry = TokenRows | TurnEvent


@dataclass(frozen=True, slots=True)
class SessionInfo:
    session_id: str
    committed_tokens: int
    max_context_tokens: int
    turn_running: bool
    idle_timeout_s: float
    parked: bool = False  # its state is in host memory until its next turn
    cached_tokens: int = 0  # of an open with a prefix: the prefix tokens taken from a cached state


@dataclass(frozen=True, slots=True)
class Opened:
    """A session opened on a replica, and the replica's snapshot right after."""

    info: SessionInfo
    snapshot: PoolSnapshot


@dataclass(frozen=True, slots=True)
class OpenedBatch:
    """Sessions opened on a replica in one call (each an info or its refusal, in the order
    asked), and the replica's snapshot after the last."""

    results: tuple[SessionInfo | ActorError, ...]
    snapshot: PoolSnapshot


# The batched calls of a gateway carry plain tuples (``replica.actor.batch_calls``):
# (session_id, idle_timeout_s, gateway_id, tenant, lease_s[, prefix]); prefix: None, the text or
# the token ids the session starts holding (``SessionOps.open_session``)
OpenArgs = tuple
# (session_id, text | ChatInput | None, token_ids | None, SamplingParams[, ForkArgs]); with
# ForkArgs the session is forked first, in the same command
# (``replica.actor.batch_calls.fork_then_submit``); a ChatInput is rendered in the same call
TurnArgs = tuple
# (child_id, lease_s[, replaces]): the fork's id, its stream lease (0: none), and the session it
# replaces (the previous rollback point), released first in the same command
ForkArgs = tuple


@dataclass(frozen=True, slots=True)
class ForkedTurn:
    """A turn submitted with a fork of its session taken just before it, in one command: the
    turn's id, and the fork (the session's state before the turn, a rollback point: its info)
    or why none was made (no room, draining: the turn runs regardless); ``replaced``: the
    session the fork replaces was released here first (else its caller releases it)."""

    turn_id: int
    fork: SessionInfo | ActorError
    replaced: bool = False


@dataclass(frozen=True, slots=True)
class Closed:
    """Sessions released on a replica (whether each was open), and its snapshot right after.
    ``moving`` are those not released because they are moving to another replica: close them
    where the router says they are now."""

    was_open: tuple[bool, ...]
    snapshot: PoolSnapshot
    moving: tuple[str, ...] = ()


# ----- session state that moves between replicas -----------------------------------------------


STATE_FORMAT = 2  # the layout of ``SessionStates``; a replica imports only its own


@dataclass(frozen=True, slots=True)
class SessionMeta:
    """One session's facts in a ``SessionStates`` record: its owner, its idle timeout, the
    tokens folded into its state (KV positions ``0..committed_len-1``), the tokens produced but
    not folded yet, and what was left of a stream's hold on it (``lease_s``).

    ``kv_from`` is the first KV position the record carries: 0 in a whole state; in a delta
    checkpoint, the ``committed_len`` of the checkpoint before it, whose KV it extends (a
    session's KV below its committed length never changes). Only a whole state is imported."""

    session_id: str
    tenant: str
    idle_timeout_s: float
    committed_len: int
    pending_ids: tuple[int, ...] = ()
    lease_s: float = 0.0
    kv_from: int = 0

    @property
    def kv_len(self) -> int:
        """KV positions the record carries for this session."""
        return self.committed_len - self.kv_from

    @property
    def committed_tokens(self) -> int:
        return self.committed_len + len(self.pending_ids)


@dataclass(frozen=True, slots=True)
class SessionStates:
    """The whole state of ``sessions``, exported by one replica for another running the same
    model (``model`` is its fingerprint) to import; versioned by ``format``.

    The tensors are numpy arrays of raw bytes (``uint8``, the last dimension times the element
    size of ``state_dtype``/``kv_dtype``), so the record crosses Ray's object store without a
    copy in pickle and without torch on the reader's side: ``conv``/``ssm`` ``[mamba layers,
    sessions, *state]`` (each session's live state, in ``sessions`` order) and ``k``/``v``
    ``[attention layers, tokens, kv heads, head_dim]`` (the committed positions of each session
    in turn from its ``kv_from``, ``kv_len`` of them each).
    """

    format: int
    model: str
    state_dtype: str
    kv_dtype: str
    sessions: tuple[SessionMeta, ...]
    conv: Any
    ssm: Any
    k: Any
    v: Any

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in (self.conv, self.ssm, self.k, self.v))


@dataclass(frozen=True, slots=True)
class Exported:
    """What ``export_sessions`` did: ``exported`` are in its states record, in order (moving:
    they take no turn until ``finish_export``); ``busy`` still run a turn (moving too, exported
    once it ends); ``missing`` are not open here."""

    exported: tuple[str, ...] = ()
    busy: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Imported:
    """What ``import_sessions`` did: the sessions now open here, those refused (id -> why, with
    its status), and the replica's snapshot right after."""

    opened: tuple[SessionInfo, ...]
    refused: dict[str, ActorError]
    snapshot: PoolSnapshot


@dataclass(frozen=True, slots=True)
class ReportReply:
    """The router's answer to a replica's snapshot report. ``router`` is the answering router's
    incarnation, which the moves it sends carry (``import_sessions(router=...)``): a replica
    refuses a move sent by a router other than the one it reports to now (that router died, and
    its successor has learned this replica's sessions without the move)."""

    known: bool  # False: the router does not know this replica (it restarted): register again
    router: str


# ----- replicas --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OutputAddress:
    """Where a gateway reads its outputs from a replica over a socket of its own
    (``replica.actor.output_server``): the node's address, a port, and the replica's secret,
    which the gateway presents first. Handed out only through Ray, so only to its callers."""

    host: str
    port: int
    token: bytes = field(repr=False)


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


@dataclass(frozen=True, slots=True)
class PoolStats:
    """One pool's capacity by state; ``leaked`` must be 0."""

    pool: str
    capacity: int
    free: int
    in_use: int
    session_held: int
    cached: int = 0

    @property
    def leaked(self) -> int:
        return self.capacity - (self.free + self.in_use + self.session_held + self.cached)

    def describe(self) -> str:
        return (
            f"{self.pool}: capacity={self.capacity} free={self.free} in_use={self.in_use} "
            f"session_held={self.session_held} cached={self.cached} leaked={self.leaked}"
        )


@dataclass(frozen=True, slots=True)
class HistogramCounts:
    """A histogram's observations so far: ``buckets[i]`` of them were <= ``bounds[i]``
    (cumulative, as Prometheus counts them); ``count`` and ``total`` over all of them."""

    bounds: tuple[float, ...] = ()
    buckets: tuple[int, ...] = ()
    count: int = 0
    total: float = 0.0


@dataclass(frozen=True, slots=True)
class ParkingStats:
    """A replica's parking so far; all 0 on a replica that does not park sessions."""

    sessions_parked: int = 0  # open sessions whose state is in host memory now
    parks_total: int = 0
    restores_total: int = 0
    restore_seconds: HistogramCounts = field(default_factory=HistogramCounts)


@dataclass(frozen=True, slots=True)
class CheckpointStats:
    """A replica's session checkpoints so far; all 0 without checkpoints."""

    written_total: int = 0  # checkpoints written (one per session whose state changed)
    bytes_written_total: int = 0
    bytes_held: int = 0  # what its store holds now
    unprotected: int = 0  # open sessions of which its store holds no checkpoint now
    recheckpointed_total: int = 0  # sessions checkpointed again because a new store followed
    # sessions whose turn's end went out without its checkpoint stored (the hold bound passed),
    # until one is: a client may have seen a turn that no checkpoint holds
    let_go: frozenset[str] = frozenset()
    # entries sent to its store that no acknowledgement counts yet: the ``checkpoints`` pool is
    # as of the last acknowledgement, so it is settled (a drop after a released session's last
    # checkpoint counted too) only when this is 0
    unacked: int = 0


@dataclass(frozen=True, slots=True)
class StepStats:
    """A replica's engine forwards so far: decode steps and the rows they ran, prefill steps
    and the chunks they folded in. Rows per step is how full the batches were, which is what a
    step's fixed cost is shared by."""

    decode_steps_total: int = 0
    decode_rows_total: int = 0
    prefill_steps_total: int = 0
    prefill_rows_total: int = 0


@dataclass(frozen=True, slots=True)
class StateCacheStats:
    """A replica's cache of states at turn boundaries; all 0 with the cache off.
    ``block_hashes``: chained hashes (``replica.prefix_hashes``) of the cached token sequences'
    whole blocks of ``block_tokens``, capped in number, which placement compares an open's
    prefix with."""

    cached_states: int = 0
    max_cached_states: int = 0
    hits_total: int = 0  # opens with a prefix that started from a cached state
    misses_total: int = 0  # opens with a prefix that found none
    evictions_total: int = 0
    reused_tokens_total: int = 0  # prefix tokens taken from cached states, never prefilled
    block_tokens: int = 0
    block_hashes: frozenset[int] = frozenset()


@dataclass(frozen=True, slots=True)
class PoolSnapshot:
    """A consistent view of one replica's pools, taken between engine steps. Cheap to pickle."""

    replica_id: str
    incarnation: str
    pools: tuple[PoolStats, ...]
    open_sessions: int
    running_requests: int
    waiting_requests: int
    taken_at: float  # time.time() on the replica
    seq: int = 0  # increases with every snapshot of one incarnation: newer wins
    draining: bool = False
    sessions_opened_total: int = 0
    sessions_released_total: dict[str, int] = field(default_factory=dict)
    parking: ParkingStats = field(default_factory=ParkingStats)
    checkpoints: CheckpointStats = field(default_factory=CheckpointStats)
    state_cache: StateCacheStats = field(default_factory=StateCacheStats)
    steps: StepStats = field(default_factory=StepStats)

    def pool(self, name: str) -> PoolStats:
        for stats in self.pools:
            if stats.pool == name:
                return stats
        raise KeyError(f"no pool named {name!r} in snapshot of {self.replica_id}")

    @property
    def leaked(self) -> int:
        return sum(abs(stats.leaked) for stats in self.pools)

    @property
    def consistent(self) -> bool:
        return all(stats.leaked == 0 for stats in self.pools)

    @property
    def at_capacity(self) -> bool:
        """Nothing open or running, every pool free but for cached states (evictable), and
        the checkpoint accounting settled: a released session's last checkpoint and its drop
        reach the store one after the other, and the ``checkpoints`` pool counts what the store
        acknowledged, so it is free for certain only once every entry is."""
        return (
            self.open_sessions == self.running_requests == self.waiting_requests == 0
            and self.checkpoints.unacked == 0
            and all(stats.free + stats.cached == stats.capacity for stats in self.pools)
        )


@dataclass(frozen=True, slots=True)
class ChatPrompt:
    """The tokens of a chat turn rendered with the model's chat template. ``token_ids`` are what
    the turn feeds: the whole rendering, or (``reused_tokens`` > 0) only what follows the
    ``reused_tokens`` tokens of the state it continues, whose text the rendering begins with."""

    token_ids: list[int]
    reused_tokens: int = 0


@dataclass(frozen=True, slots=True)
class ChatInput:
    """A turn's input given as a conversation (in a ``TurnArgs``' text place): the replica
    renders it with the chat template and tokenizes it in the submit's own call, so a chat turn
    costs one round trip, not a render's and then a submit's. With ``prior_ids`` (the tokens
    the session holds) only what follows their text is fed. The turn goes only when the
    rendering begins with that text and the session holds exactly ``len(prior_ids)`` committed
    tokens (none without them: a failover may have restored an older state, since a chat
    turn's end is not held for its checkpoint); otherwise nothing is done
    (``RenderedTurn.turn`` None: the caller replays the conversation into a fresh session)."""

    messages: list[dict[str, str]]
    prior_ids: list[int] | None = None


@dataclass(frozen=True, slots=True)
class RenderedTurn:
    """The result of a ``ChatInput`` turn: the prompt it was rendered to, and the turn's id (a
    ``ForkedTurn`` for one that asked for a fork), or None when the rendering does not continue
    the ``prior_ids`` given (nothing was submitted, forked or released)."""

    prompt: ChatPrompt
    turn: int | ForkedTurn | None


@dataclass(frozen=True, slots=True)
class ModelCard:
    """What a client is told of the served model."""

    name: str
    max_context: int
    chat_template: bool  # whether chat endpoints can render its prompts
    created: int  # seconds since the epoch: when the replica loaded it
