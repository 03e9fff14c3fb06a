"""A gateway reads its outputs from a replica over a socket of its own: the same tokens as the
Ray stream gives; nothing without the replica's secret; a gateway whose socket closes is gone
(its held sessions released, the pools exact); the replica's shutdown ends the read, its death
or its engine's breaks it; no connection, or one the replica does not take, is
``SocketNotTaken`` before anything is read (the client then reads the Ray stream), and a replica
without the socket is read over Ray."""

from __future__ import annotations

import asyncio
import socket
import struct
import time

import pytest
import ray

from replica.actor import output_wire as wire
from replica.actor import remote_replica_actor
from replica.actor.client import ReplicaClient
from replica.actor.output_reader import ReplicaStreamError, SocketNotTaken, read_socket_outputs
from replica.actor.output_server import OutputServer
from replica.api import ActorError, OutputAddress, SamplingParams, StatusCode, TurnEvent
from replica.config import PoolConfig, ReplicaConfig

NEW_TOKENS = 6
POOLS = PoolConfig(max_sessions=4, kv_tokens=512)


def start(name: str, **settings) -> tuple[object, ReplicaClient]:
    config = ReplicaConfig(pools=POOLS, threads=1, **settings)
    handle = remote_replica_actor().options(num_cpus=0).remote(name, config, None)
    return handle, ReplicaClient(handle)


class Tokens:
    """What a gateway's reads hand out, by session; ``ended`` once its turn's last event came."""

    def __init__(self) -> None:
        self.tokens: dict[str, list[int]] = {}
        self.ended: dict[str, asyncio.Event] = {}

    def take(self, entries: list) -> None:
        for entry in entries:
            if type(entry) is tuple:  # token rows
                for session_id, token in zip(entry[0], entry[2]):
                    self.tokens.setdefault(session_id, []).append(token)
            elif isinstance(entry, TurnEvent):
                self.tokens.setdefault(entry.session_id, []).extend(entry.token_ids)
                if entry.finished:
                    self.ended.setdefault(entry.session_id, asyncio.Event()).set()

    async def turn(self, client: ReplicaClient, gateway_id: str, session_id: str) -> list[int]:
        opened = await client.open_session(session_id=session_id, gateway_id=gateway_id)
        assert not isinstance(opened, ActorError), opened
        turn = await client.submit_turn(
            gateway_id=gateway_id,
            session_id=session_id,
            text=None,
            token_ids=[5, 6, 7],
            sampling=SamplingParams(max_new_tokens=NEW_TOKENS),
        )
        assert isinstance(turn, int), turn
        await asyncio.wait_for(self.ended.setdefault(session_id, asyncio.Event()).wait(), 30)
        return self.tokens[session_id]


def test_the_socket_gives_what_the_ray_stream_gives_and_the_shutdown_ends_it(ray_cluster):
    handle, client = start("sock-same")

    async def run() -> None:
        address = await client.output_address()
        assert isinstance(address, OutputAddress) and address.port > 0
        by_socket, by_ray = Tokens(), Tokens()
        read = asyncio.ensure_future(read_socket_outputs(address, "gw-s", by_socket.take))
        ray_read = asyncio.ensure_future(
            client.read_outputs(gateway_id="gw-r", on_entries=by_ray.take, use_socket=False)
        )
        a = await by_socket.turn(client, "gw-s", "s1")
        b = await by_ray.turn(client, "gw-r", "s2")
        assert a == b and len(a) == NEW_TOKENS
        await client.close_sessions(session_ids=["s1", "s2"])
        snapshot = await client.check_invariant()
        assert not isinstance(snapshot, ActorError) and snapshot.open_sessions == 0
        await client.shutdown()
        await asyncio.wait_for(read, 10)  # END: returns, no error
        await asyncio.wait_for(ray_read, 10)

    asyncio.run(run())


def hello_refused(address: OutputAddress, greeting: bytes) -> bool:
    """Whether the replica closes a connection that opens with ``greeting``, sending nothing
    (a reset when it left some of the greeting unread)."""
    with socket.create_connection((address.host, address.port), timeout=10) as raw:
        raw.sendall(greeting)
        try:
            return raw.recv(1) == b""
        except ConnectionResetError:
            return True


def test_no_secret_no_outputs_and_a_gone_gateways_held_sessions_are_released(ray_cluster):
    handle, client = start("sock-secret")

    async def run() -> None:
        address = await client.output_address()
        wrong = bytes(wire.TOKEN_BYTES)
        assert hello_refused(address, wire.hello(wrong, "gw-x"))
        assert hello_refused(address, struct.pack("<32sH", address.token, 60_000))  # too long
        assert hello_refused(address, b"GET / HTTP/1.1\r\n\r\n" + bytes(40))
        # the right secret: served, and the pools stay exact when it goes
        outputs = Tokens()
        read = asyncio.ensure_future(read_socket_outputs(address, "gw-x", outputs.take))
        assert len(await outputs.turn(client, "gw-x", "held")) == NEW_TOKENS
        assert await client.hold_sessions(session_ids=["held"], lease_s=600) == []  # none gone
        read.cancel()  # the gateway's socket closes: its held session goes within a heartbeat
        deadline = time.monotonic() + 10
        while not isinstance(gone := await client.get_session(session_id="held"), ActorError):
            assert time.monotonic() < deadline, "the gone gateway's session was kept"
            await asyncio.sleep(0.2)
        assert gone.code == StatusCode.NOT_FOUND
        snapshot = await client.check_invariant()
        assert not isinstance(snapshot, ActorError) and snapshot.open_sessions == 0
        assert snapshot.sessions_released_total.get("stream_ended") == 1

    asyncio.run(run())
    ray.kill(handle)


def test_a_dead_engine_or_replica_breaks_the_read(ray_cluster):
    handle, client = start("sock-fail", failpoints=frozenset({"engine_step_raises"}))
    other, other_client = start("sock-kill")

    async def run() -> None:
        outputs = Tokens()
        read = asyncio.ensure_future(
            read_socket_outputs(await client.output_address(), "gw-f", outputs.take)
        )
        await client.open_session(session_id="f", gateway_id="gw-f")
        await client.submit_turn(
            gateway_id="gw-f", session_id="f", text=None, token_ids=[5], sampling=SamplingParams()
        )
        with pytest.raises(ReplicaStreamError, match="engine_step_raises"):
            await asyncio.wait_for(read, 30)
        killed = asyncio.ensure_future(
            read_socket_outputs(await other_client.output_address(), "gw-k", outputs.take)
        )
        assert len(await outputs.turn(other_client, "gw-k", "k")) == NEW_TOKENS
        ray.kill(other)
        with pytest.raises(ReplicaStreamError):
            await asyncio.wait_for(killed, 30)

    asyncio.run(run())
    ray.kill(handle)


def test_a_socket_not_taken_reads_nothing_and_no_socket_reads_ray(ray_cluster):
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    handle, client = start("sock-off", output_socket=False)
    with_socket, served = start("sock-on")

    async def run() -> None:
        taken = []
        dead = OutputAddress("127.0.0.1", port, bytes(wire.TOKEN_BYTES))
        with pytest.raises(SocketNotTaken):
            await read_socket_outputs(dead, "gw", taken.append)
        live = await served.output_address()
        wrong = OutputAddress(live.host, live.port, bytes(wire.TOKEN_BYTES))
        with pytest.raises(SocketNotTaken):  # closed before READY, as when it has no room
            await read_socket_outputs(wrong, "gw", taken.append)
        assert taken == []  # nothing read: the client falls back to the Ray stream
        assert await client.output_address() is None
        outputs = Tokens()
        read = asyncio.ensure_future(
            client.read_outputs(gateway_id="gw-o", on_entries=outputs.take)
        )
        assert len(await outputs.turn(client, "gw-o", "o")) == NEW_TOKENS
        read.cancel()

    asyncio.run(run())
    ray.kill(handle)
    ray.kill(with_socket)


def test_the_server_listens_on_an_ipv6_node_address_too():
    """Ray's node address may be IPv6: the server listens there, items arrive in order, END."""
    sent = [[("a", 1)], [], [("b", 2)]]

    def stream(gateway_id: str):
        yield from sent

    server = OutputServer(stream, "::1")
    got: list = []

    async def run() -> None:
        await asyncio.wait_for(read_socket_outputs(server.address, "gw-6", got.append), 10)

    asyncio.run(run())
    server.close()
    assert got == sent
