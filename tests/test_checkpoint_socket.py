"""A checkpoint store reads its replica's checkpoints from a socket of its own: the items in
order, whole, one at a time (the next only once the store said it has the last: what the
replica counts as stored), then the end; nothing without the secret of that one ``open``, and
nothing once its wait is over; a store that leaves closes the replica's stream. Over real
actors, a store fed by the socket holds byte for byte what a store fed by the Ray stream holds
for the same turns, keeps it when the replica dies, and a store killed is replaced with no turn
held up and every session protected again."""

from __future__ import annotations

import asyncio
import socket
import time

import numpy as np
import pytest
import ray

from replica.actor import CheckpointStore, checkpoint_socket, remote_replica_actor
from replica.actor.checkpoint_socket import CheckpointSocket
from replica.actor.output_reader import SocketNotTaken
from replica.actor.tasks import BackgroundTasks
from replica.api import OutputAddress, PoolSnapshot, SamplingParams, SessionMeta, SessionStates
from replica.checkpoints import socket_wire as wire
from replica.checkpoints.entries import CheckpointBlank, CheckpointDrop
from replica.checkpoints.holds import HOLD_S
from replica.checkpoints.socket_reader import CheckpointSocketReader
from replica.config import PoolConfig, ReplicaConfig
from tests.support.cluster import wait_for


def record(session_id: str, seed: int) -> SessionStates:
    rng = np.random.default_rng(seed)
    meta = SessionMeta(session_id, "", 30.0, 5, (), 0.0, 0)
    conv, ssm = rng.integers(0, 255, (2, 1, 24), np.uint8), rng.integers(0, 255, (2, 1, 99))
    k = rng.integers(0, 255, (1, 5, 2, 16), np.uint8)
    return SessionStates(1, "m", "float32", "float32", (meta,), conv, ssm.astype(np.uint8), k, k)


class Producer:
    """An outbox's stream stand-in: counts the items asked for, and notes its close."""

    def __init__(self, items: list[list]) -> None:
        self.items = items
        self.asked = 0
        self.closed = asyncio.Event()

    async def stream(self):
        try:
            for item in self.items:
                self.asked += 1
                yield item
        finally:
            self.closed.set()


async def until(predicate, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def raw_connect(address: OutputAddress, token: bytes) -> socket.socket:
    conn = socket.create_connection((address.host, address.port), timeout=5)
    conn.sendall(token)
    return conn


def read_exactly(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            return data
        data += chunk
    return data


def read_item(conn: socket.socket) -> int:
    """Read one whole ITEM frame; returns its kind."""
    kind, size, count = wire.HEADER.unpack(read_exactly(conn, wire.HEADER.size))
    lengths = wire.lengths(read_exactly(conn, 8 * count))
    read_exactly(conn, size + sum(lengths))
    return kind


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_items_arrive_whole_in_order_and_the_end_ends_the_read(host):
    items = [
        [record("a", 1), CheckpointBlank((("b", "t", 5.0),))],
        [CheckpointDrop(("a",))],
        [record("b", 2), record("c", 3)],
    ]

    async def run() -> None:
        producer = Producer(items)
        server = CheckpointSocket(host, BackgroundTasks())
        address = server.open(producer.stream)
        reader = await CheckpointSocketReader.connect(address)
        got = [entries async for entries in reader.items()]
        assert len(got) == len(items)
        for entries, sent in zip(got, items):
            assert [type(e) for e in entries] == [type(e) for e in sent]
            for e, s in zip(entries, sent):
                if isinstance(s, SessionStates):
                    assert e.sessions == s.sessions
                    for a, b in zip((e.conv, e.ssm, e.k, e.v), (s.conv, s.ssm, s.k, s.v)):
                        assert np.array_equal(a, b)
                else:
                    assert e == s
        await asyncio.wait_for(producer.closed.wait(), 5)

    asyncio.run(run())


def test_the_next_item_waits_for_taken_and_a_store_that_leaves_closes_the_stream():
    async def run() -> None:
        producer = Producer([[record(f"s{i}", i)] for i in range(5)])
        server = CheckpointSocket("127.0.0.1", BackgroundTasks())
        address = server.open(producer.stream)
        conn = await raw_connect(address, address.token)
        loop = asyncio.get_running_loop()
        ready = await loop.run_in_executor(None, read_exactly, conn, wire.HEADER.size)
        assert wire.HEADER.unpack(ready)[0] == wire.READY
        assert await loop.run_in_executor(None, read_item, conn) == wire.ITEM
        await asyncio.sleep(0.3)
        assert producer.asked == 1  # not taken yet: the replica holds the next one back
        conn.sendall(wire.signal(wire.TAKEN))
        assert await loop.run_in_executor(None, read_item, conn) == wire.ITEM
        await until(lambda: producer.asked == 2)
        conn.close()  # the store leaves with an item not taken
        await asyncio.wait_for(producer.closed.wait(), 5)
        assert producer.asked == 2
        with pytest.raises(SocketNotTaken):  # one connection an open: the listener is gone
            await CheckpointSocketReader.connect(address)

    asyncio.run(run())


def test_only_the_secret_of_that_open_within_its_wait_is_taken(monkeypatch):
    monkeypatch.setattr(checkpoint_socket, "ACCEPT_TIMEOUT_S", 1.0)

    async def run() -> None:
        producer = Producer([[record("a", 1)]])
        server = CheckpointSocket("127.0.0.1", BackgroundTasks())
        address = server.open(producer.stream)
        loop = asyncio.get_running_loop()
        stranger = await raw_connect(address, bytes(wire.TOKEN_BYTES))
        assert await loop.run_in_executor(None, read_exactly, stranger, 1) == b""  # closed
        stale = server.open(producer.stream)  # a second open: the first's listener closes
        with pytest.raises(SocketNotTaken):
            await CheckpointSocketReader.connect(address)
        assert producer.asked == 0
        await asyncio.sleep(1.3)  # past the wait: nobody came
        with pytest.raises(SocketNotTaken):
            await CheckpointSocketReader.connect(stale)
        address = server.open(producer.stream)
        reader = await CheckpointSocketReader.connect(address)
        assert len([entries async for entries in reader.items()]) == 1

    asyncio.run(run())


POOLS = PoolConfig(max_sessions=4, kv_tokens=1024, max_context=256)


def replica_with_store(name: str, output_socket: bool = True):
    config = ReplicaConfig(pools=POOLS, threads=1, output_socket=output_socket)
    replica = remote_replica_actor().options(num_cpus=0).remote(name, config)
    node = ray.get(replica.describe.remote(), timeout=120).node_id
    store = ray.remote(CheckpointStore).options(num_cpus=0).remote(name)
    ray.get(store.follow.remote(replica, node))
    return replica, store, node


def over_socket(store) -> bool:
    return ray.get(store.__ray_call__.remote(lambda s: s.over_socket))


def snapshot(replica) -> PoolSnapshot:
    snap = ray.get(replica.snapshot.remote(True), timeout=30)
    assert isinstance(snap, PoolSnapshot), snap
    return snap


def turns(replica, sessions: list[str]) -> None:
    """Two turns on each session, one session at a time (the same steps on every replica)."""
    for t in range(2):
        for i, sid in enumerate(sessions):
            ids = [5 + i, 6 + t, 7, 8 + i * t]
            turn = replica.submit_turn.remote("", sid, None, ids, SamplingParams(4))
            assert isinstance(ray.get(turn), int)
            wait_for(lambda: snapshot(replica).running_requests == 0, 30, 0.02, "turn ended")


def held(store, sessions: list[str]) -> dict[str, SessionStates]:
    found = ray.get(store.checkpoints.remote(sessions, 5.0))
    return {sid: ray.get(refs[0]) for sid, (_, refs) in found.items()}


def test_a_socket_fed_store_holds_what_a_ray_fed_one_holds_and_keeps_it(ray_cluster):
    sessions = ["a", "b"]
    fed = {
        "socket": replica_with_store("ckpt-sock"),
        "ray": replica_with_store("ckpt-ray", output_socket=False),
    }
    # ``follow`` returns as the store starts to connect
    wait_for(lambda: over_socket(fed["socket"][1]), 30, 0.05, "the store reads the socket")
    for replica, _, _ in fed.values():
        for sid in sessions:
            ray.get(replica.open_session.remote(sid))
        turns(replica, sessions)
        wait_for(lambda r=replica: snapshot(r).checkpoints.unprotected == 0, 30, 0.05, "stored")
    assert not over_socket(fed["ray"][1])  # it reads the Ray stream: the replica has no socket
    by_socket, by_ray = (held(store, sessions) for _, store, _ in fed.values())
    assert sorted(by_socket) == sorted(by_ray) == sessions
    for sid in sessions:
        a, b = by_socket[sid], by_ray[sid]
        assert a.sessions[0].committed_len == b.sessions[0].committed_len > 8
        for x, y in zip((a.conv, a.ssm, a.k, a.v), (b.conv, b.ssm, b.k, b.v)):
            assert np.array_equal(x, y)

    replica, store, _ = fed["socket"]
    ray.kill(replica)  # the socket closes: the store's stream ends, its checkpoints stay
    wait_for(lambda: not ray.get(store.following.remote()), 30, 0.05, "the stream ended")
    kept = held(store, sessions)
    for sid in sessions:
        assert np.array_equal(kept[sid].ssm, by_ray[sid].ssm)
        assert np.array_equal(kept[sid].k, by_ray[sid].k)
    for actor in (store, *fed["ray"][:2]):
        ray.kill(actor)


def test_a_store_killed_holds_no_turn_up_and_a_new_one_protects_every_session(ray_cluster):
    replica, store, node = replica_with_store("ckpt-sock-kill")
    wait_for(lambda: over_socket(store), 30, 0.05, "the store reads the socket")
    ray.get(replica.open_session.remote("a"))
    turns(replica, ["a"])
    wait_for(lambda: snapshot(replica).checkpoints.unprotected == 0, 30, 0.05, "stored")
    ray.kill(store)
    started = time.monotonic()
    turns(replica, ["a"])  # two turns, neither held by the checkpoint that cannot come
    assert time.monotonic() - started < 2 * HOLD_S + 5
    wait_for(lambda: snapshot(replica).checkpoints.unprotected == 1, 30, 0.05, "unprotected")
    store = ray.remote(CheckpointStore).options(num_cpus=0).remote("ckpt-sock-kill-2")
    ray.get(store.follow.remote(replica, node))
    wait_for(lambda: over_socket(store), 30, 0.05, "the new store reads the socket")
    wait_for(lambda: snapshot(replica).checkpoints.unprotected == 0, 30, 0.05, "protected")
    assert ray.get(store.stats.remote())[0] == 1
    ray.get(replica.close_sessions.remote(["a"]))
    wait_for(lambda: snapshot(replica).pool("checkpoints").session_held == 0, 30, 0.05, "freed")
    assert all(p.leaked == 0 for p in snapshot(replica).pools)
    for actor in (replica, store):
        ray.kill(actor)
