"""A small Python client of the session API, blocking (``SessionClient``) and asyncio
(``AsyncSessionClient``). Sessions are context managers that close themselves.

    with SessionClient("127.0.0.1:50051") as client, client.open() as session:
        for chunk in session.generate("Hello", max_new_tokens=16):
            print(chunk.text, end="")

Over TLS (``serve --tls-cert``), pass ``credentials=tls_credentials(ca_file)``, adding
``cert_file``/``key_file`` when the server requires client certificates (``--tls-client-ca``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Iterator, Sequence

import grpc

from protos import session_router_pb2 as pb
from protos import session_router_pb2_grpc as pb_grpc

# How far gRPC may send a token stream ahead of the client's reads: the HTTP/2 stream window. A
# client that reads slowly fills it soon, gRPC's flow control then holds the gateway's next write,
# and the gateway merges what the engine produces meanwhile into that message: messages grow with
# the client's backlog, and no more than this waits in the transport. (gRPC's BDP probing would
# grow the window on a fast link, so it is off; a merged message carries a few bytes per token.)
STREAM_WINDOW_BYTES = 1024
CHANNEL_OPTIONS = (
    ("grpc.http2.lookahead_bytes", STREAM_WINDOW_BYTES),
    ("grpc.http2.bdp_probe", 0),
)


def tls_credentials(
    ca_file: str | None = None, cert_file: str | None = None, key_file: str | None = None
) -> grpc.ChannelCredentials:
    """TLS channel credentials: trust ``ca_file`` (the system's roots when None) and present
    ``cert_file``/``key_file`` as the client certificate when given."""

    def read(path: str | None) -> bytes | None:
        if path is None:
            return None
        with open(path, "rb") as f:
            return f.read()

    return grpc.ssl_channel_credentials(read(ca_file), read(key_file), read(cert_file))


def open_request(
    idle_timeout_s: float = 0.0,
    prefix_text: str | None = None,
    prefix_tokens: Iterable[int] | None = None,
) -> pb.OpenSessionRequest:
    """An open; with a prefix (text or token ids, not both) the session starts holding it, from
    the longest state the replica has cached that begins it (``Session.cached_tokens``)."""
    if prefix_text is not None and prefix_tokens is not None:
        raise ValueError("give prefix_text or prefix_tokens, not both")
    request = pb.OpenSessionRequest(idle_timeout_s=idle_timeout_s)
    if prefix_text is not None:
        request.prefix_text = prefix_text
    elif prefix_tokens is not None:
        request.prefix_tokens.ids.extend(prefix_tokens)
    return request


def generate_request(
    session_id: str = "",
    text: str | None = None,
    tokens: Iterable[int] | None = None,
    max_new_tokens: int = 16,
    temperature: float = 0.0,
    top_p: float = 0.0,
    seed: int = 0,
    stop_token_ids: Iterable[int] = (),
    stop: Iterable[str] = (),
    top_k: int | None = None,
    ignore_eos: bool = False,
) -> pb.GenerateRequest:
    """``top_k`` None and ``top_p`` 0 leave them to the model's defaults; the model's EOS ends
    the turn unless ``ignore_eos``; ``stop`` strings end it and are not streamed."""
    sampling = pb.SamplingParams(
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        seed=seed,
        stop_token_ids=list(stop_token_ids),
        stop=list(stop),
        top_k=top_k,
        ignore_eos=ignore_eos,
    )
    request = pb.GenerateRequest(session_id=session_id, sampling=sampling)
    if text is not None:
        request.text = text
    elif tokens is not None:
        request.tokens.ids.extend(tokens)
    return request


class _Stubs:
    """The stubs, credentials and turn call shared by the blocking and the asyncio client; the
    stubs behave alike over either kind of channel (calls are iterators or async iterators).
    With ``credentials`` the channel is TLS (``tls_credentials``); ``options`` are the channel's
    (by default a small stream window, ``CHANNEL_OPTIONS``)."""

    grpc_kind = grpc  # the module that makes the channel: grpc or grpc.aio

    def __init__(
        self,
        address: str,
        api_key: str | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        options: Sequence[tuple[str, int]] = CHANNEL_OPTIONS,
    ) -> None:
        if credentials is None:
            channel = self.grpc_kind.insecure_channel(address, options=options)
        else:
            channel = self.grpc_kind.secure_channel(address, credentials, options=options)
        self.channel = channel
        self.sessions = pb_grpc.SessionServiceStub(channel)
        self.admin = pb_grpc.AdminServiceStub(channel)
        self.metadata = (("authorization", f"Bearer {api_key}"),) if api_key else ()

    def generate(
        self,
        session_id: str,
        text: str | None = None,
        tokens=None,
        timeout: float | None = None,
        **sampling,
    ):
        """One turn; iterate the returned call for its ``GenerateChunk``s."""
        request = generate_request(session_id, text, tokens, **sampling)
        return self.sessions.Generate(request, metadata=self.metadata, timeout=timeout)


class SessionClient(_Stubs):
    def open(
        self,
        idle_timeout_s: float = 0.0,
        timeout: float | None = None,
        prefix_text: str | None = None,
        prefix_tokens: Iterable[int] | None = None,
    ) -> Session:
        msg = self.sessions.OpenSession(
            open_request(idle_timeout_s, prefix_text, prefix_tokens),
            metadata=self.metadata,
            timeout=timeout,
        )
        return Session(self, msg)

    def fork(self, session_id: str, timeout: float | None = None) -> Session:
        """A new session on the same replica holding ``session_id``'s committed state."""
        msg = self.sessions.ForkSession(
            pb.ForkSessionRequest(session_id=session_id), metadata=self.metadata, timeout=timeout
        )
        return Session(self, msg)

    def close_session(self, session_id: str) -> bool:
        return self.sessions.CloseSession(
            pb.CloseSessionRequest(session_id=session_id), metadata=self.metadata
        ).was_open

    def replicas(self) -> list[pb.ReplicaInfo]:
        return list(
            self.admin.ListReplicas(pb.ListReplicasRequest(), metadata=self.metadata).replicas
        )

    def drain(
        self, replica_id: str, migrate: bool = False, timeout: float | None = None
    ) -> pb.DrainReplicaResponse:
        """Drain a replica (admin); with ``migrate``, its sessions move to the others and the
        answer comes when it holds none, or before ``timeout`` with how many are left."""
        request = pb.DrainReplicaRequest(replica_id=replica_id, migrate=migrate)
        return self.admin.DrainReplica(request, metadata=self.metadata, timeout=timeout)

    def resume(self, replica_id: str) -> pb.ReplicaInfo:
        request = pb.ResumeReplicaRequest(replica_id=replica_id)
        return self.admin.ResumeReplica(request, metadata=self.metadata).replica

    def migrate(
        self, session_id: str, target_replica_id: str = "", timeout: float | None = None
    ) -> pb.Session:
        """Move a session to ``target_replica_id`` (empty: placement chooses); admin."""
        request = pb.MigrateSessionRequest(
            session_id=session_id, target_replica_id=target_replica_id
        )
        return self.admin.MigrateSession(request, metadata=self.metadata, timeout=timeout)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> SessionClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Session:
    def __init__(self, client: SessionClient, msg: pb.Session) -> None:
        self.client = client
        self.id = msg.session_id
        self.replica_id = msg.replica_id
        self.committed_tokens = msg.committed_tokens  # at the open
        self.cached_tokens = msg.cached_tokens  # of its prefix, from a cached state

    def generate(self, text: str | None = None, tokens=None, **kw) -> Iterator[pb.GenerateChunk]:
        return self.client.generate(self.id, text, tokens, **kw)

    def complete(self, text: str | None = None, tokens=None, **kw) -> tuple[list[int], str, int]:
        """Run a turn to its end: (token ids, text, finish reason)."""
        ids, pieces, reason = [], [], 0
        for chunk in self.generate(text, tokens, **kw):
            ids.extend(chunk.token_ids)
            pieces.append(chunk.text)
            reason = chunk.finish_reason or reason
        return ids, "".join(pieces), reason

    def fork(self, timeout: float | None = None) -> Session:
        return self.client.fork(self.id, timeout)

    def close(self) -> bool:
        return self.client.close_session(self.id)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class AsyncSessionClient(_Stubs):
    """The same over grpc.aio, for many concurrent sessions from one process."""

    grpc_kind = grpc.aio

    async def open(
        self,
        idle_timeout_s: float = 0.0,
        timeout: float | None = None,
        prefix_text: str | None = None,
        prefix_tokens: Iterable[int] | None = None,
    ) -> pb.Session:
        return await self.sessions.OpenSession(
            open_request(idle_timeout_s, prefix_text, prefix_tokens),
            metadata=self.metadata,
            timeout=timeout,
        )

    def converse(self, requests: AsyncIterator[pb.ConverseRequest]):
        """Full duplex: ``requests`` starts with ``open``; iterate the call for responses."""
        return self.sessions.Converse(requests, metadata=self.metadata)

    async def close_session(self, session_id: str) -> bool:
        response = await self.sessions.CloseSession(
            pb.CloseSessionRequest(session_id=session_id), metadata=self.metadata
        )
        return response.was_open

    async def replicas(self) -> list[pb.ReplicaInfo]:
        response = await self.admin.ListReplicas(pb.ListReplicasRequest(), metadata=self.metadata)
        return list(response.replicas)

    async def close(self) -> None:
        await self.channel.close()
