"""End to end: failover from checkpoints. A replica's process is SIGKILLed under load: every
session continues on the survivor exactly from its last ended turn (a fresh session replaying
its turns produces the same tokens); a turn in flight ends UNAVAILABLE once, saying where the
session continues, and its retry runs; a Converse stream goes on, its turn in flight ending
INTERRUPTED; nothing ends ABORTED; and no checkpoint or slot is leaked anywhere afterwards. Then
a drain with migration while another replica dies. The server writes its checkpoints to files
too (``--checkpoint-dir``): a replica killed together with its checkpoint store has its sessions
restored from their files, exactly, and its files are removed after.

The tests kill replicas, so the module has its own server.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import threading
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
import ray

from protos import session_router_pb2 as pb
from router.client import SessionClient, generate_request
from tests.support.cluster import actor_pid, drain_stream, wait_for
from tests.support.servers import serve_cluster

SEEDED = dict(temperature=0.7, seed=99)
COMMITTED = re.compile(r"continues at committed_tokens (\d+)")


@pytest.fixture(scope="module")
def checkpoint_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("checkpoints")


@pytest.fixture(scope="module")
def server(ray_cluster, checkpoint_dir):
    with serve_cluster(stale_after_s=3.0, checkpoint_dir=str(checkpoint_dir)) as srv:
        yield srv


def tokens(seed: int, n: int = 5) -> list[int]:
    return [(seed * 29 + i * 13) % 250 + 1 for i in range(n)]


class Load:
    """One session's client: turns back to back (seeded), each recorded once it has ended; a
    turn that fails UNAVAILABLE is retried, unless the session continues past where the turn
    began (it ended, checkpointed, and the replica died before its last chunk went out): that
    turn is recorded with the committed tokens the error names and no tokens (the client never
    saw them). Stops after ``stop`` is set and 2 more turns."""

    def __init__(self, client: SessionClient, k: int) -> None:
        self.session = client.open()
        self.k = k
        # (seed, tokens or None when unseen, committed after)
        self.done: list[tuple[int, list[int] | None, int]] = []
        self.unavailable: list[str] = []
        self.other: list[grpc.RpcError] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run)

    def run(self) -> None:
        n, extra = 0, 0
        while extra < 2:
            seed = 1000 * self.k + n
            try:
                ids, _, committed = drain_stream(
                    self.session.generate(tokens=tokens(seed), max_new_tokens=12, **SEEDED)
                )
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE:
                    self.other.append(exc)
                    return
                self.unavailable.append(exc.details())
                said = COMMITTED.search(exc.details())
                if said is None or int(said[1]) == (self.done[-1][2] if self.done else 0):
                    continue  # back where the turn began: retry it
                ids, committed = None, int(said[1])
            self.done.append((seed, ids, committed))
            n += 1
            extra += self.stop.is_set()


def test_sessions_survive_a_sigkill_of_their_replica(server):
    client = SessionClient(server.address)
    conversation = Conversation(server.address)
    victim = conversation.session.replica_id
    loads = [Load(client, k) for k in range(6)]
    doomed = [load for load in loads if load.session.replica_id == victim]
    assert doomed and len(doomed) < len(loads)
    for load in loads:
        load.thread.start()
    wait_for(lambda: all(len(load.done) >= 2 for load in loads), 60, 0.02, "two turns each")
    conversation.start_turn()
    server.sigkill_replica(victim)
    for load in loads:
        load.stop.set()
    for load in loads:
        load.thread.join(120)

    assert any(load.unavailable for load in doomed)  # back-to-back turns: one was in flight
    for load in loads:
        assert not load.other, load.other  # no ABORTED: every session had a checkpoint
        assert len(load.unavailable) <= 1, load.unavailable
        if load.unavailable:  # its turn was in flight: it continues at its last ended turn
            said = int(COMMITTED.search(load.unavailable[0]).group(1))
            assert load in doomed and said in {c for _, _, c in load.done}
    # every session continues exactly where its last ended turn left it: a session that never
    # moved, replaying the same turns, produces the same tokens
    for load in loads:
        replay = client.open()
        for seed, ids, committed in load.done:
            got, _, at = drain_stream(
                replay.generate(tokens=tokens(seed), max_new_tokens=12, **SEEDED)
            )
            assert (got if ids is not None else None, at) == (ids, committed)
        assert replay.close()
    conversation.check_continues(server)

    for load in loads:
        assert load.session.close()
    live = server.wait_healed()
    assert victim not in live
    server.wait_at_capacity(live)
    assert_no_checkpoints_left(server, live)
    with pytest.raises(ray.exceptions.RayActorError):  # the dead replica's store was ended
        ray.get(server.stores[victim].stats.remote(), timeout=30)
    client.close()


def assert_no_checkpoints_left(server, replica_ids) -> None:
    """Every live replica's checkpoint store holds nothing once its sessions are closed, and
    its ``checkpoints`` pool is at capacity with nothing leaked."""

    def empty() -> bool:
        stores = [server.stores[r] for r in replica_ids]
        return all(held == 0 for held, _ in ray.get([s.stats.remote() for s in stores]))

    wait_for(empty, 30, 0.05, "the checkpoint stores to be empty")
    for replica_id, snap in server.snapshots(replica_ids).items():
        pool = snap.pool("checkpoints")
        assert pool.leaked == 0 and pool.free == pool.capacity, (replica_id, pool.describe())


class Conversation:
    """A Converse stream on the victim whose turn is in flight at the kill."""

    def __init__(self, address: str) -> None:
        self.client = SessionClient(address)
        self.requests: queue.Queue = queue.Queue()
        self.responses = self.client.sessions.Converse(iter(self.requests.get, None))
        self.requests.put(pb.ConverseRequest(open=pb.OpenSessionRequest()))
        self.session = next(self.responses).opened

    def start_turn(self) -> None:
        self.requests.put(
            pb.ConverseRequest(input=generate_request(tokens=[3, 4], max_new_tokens=400))
        )
        assert next(self.responses).chunk.token_ids  # the turn runs

    def check_continues(self, server) -> None:
        last = next(r for r in self.responses if r.chunk.finish_reason)
        assert last.chunk.finish_reason == pb.FINISH_REASON_INTERRUPTED
        assert last.chunk.committed_tokens == 0  # nothing had ended before the kill
        self.requests.put(pb.ConverseRequest(input=generate_request(tokens=[5], max_new_tokens=3)))
        ids = []
        for response in self.responses:
            ids += response.chunk.token_ids
            if response.chunk.finish_reason:
                break
        assert len(ids) == 3
        self.requests.put(None)
        assert list(self.responses) == []
        self.client.close()


def test_a_drain_with_migration_while_another_replica_dies(server):
    server.wait_healed()
    (extra,) = server.start_replicas(1)
    client = SessionClient(server.address)
    wait_for(
        lambda: any(r.replica_id == extra and r.pools for r in client.replicas()),
        30,
        0.1,
        "the third replica's first snapshot",
    )
    cluster = server.server.gateway.cluster  # the gateway places by its own view, polled
    wait_for(lambda: extra in cluster.handles, 30, 0.1, "the gateway's view of the third replica")
    sessions = [client.open() for _ in range(6)]
    first = {}
    for n, s in enumerate(sessions):
        first[s.id] = drain_stream(s.generate(tokens=tokens(n), max_new_tokens=6, **SEEDED))
    placed = {s.replica_id for s in sessions}
    assert len(placed) == 3, placed
    drained, dying = sorted(placed - {extra})
    with ThreadPoolExecutor(1) as pool:
        drain = pool.submit(client.drain, drained, True, 120)
        server.sigkill_replica(dying)
        reply = drain.result(150)
    assert reply.sessions_left == 0 and reply.replica.state == pb.REPLICA_STATE_DRAINING
    server.wait_at_capacity([drained])

    # no session was lost: each continues exactly where its turn left it
    for n, s in enumerate(sessions):
        second = drain_stream(s.generate(tokens=tokens(50 + n), max_new_tokens=6, **SEEDED))
        replay = client.open()
        for seed, want in ((n, first[s.id]), (50 + n, second)):
            got = drain_stream(replay.generate(tokens=tokens(seed), max_new_tokens=6, **SEEDED))
            assert got == want
        assert replay.close() and s.close()
    client.resume(drained)
    live = server.wait_healed()
    server.wait_at_capacity(live)
    assert_no_checkpoints_left(server, live)
    client.close()


def test_a_replica_killed_with_its_store_is_restored_from_files(server, checkpoint_dir):
    server.wait_healed()
    client = SessionClient(server.address)
    sessions = [client.open() for _ in range(6)]
    done: dict[str, list] = {s.id: [] for s in sessions}
    for n, s in enumerate(sessions):
        for turn in range(3):  # a whole state, then deltas, on disk
            seed = 100 * n + turn
            ids, _, at = drain_stream(s.generate(tokens=tokens(seed), max_new_tokens=6, **SEEDED))
            done[s.id].append((seed, ids, at))
    victim = sessions[0].replica_id
    assert any((checkpoint_dir / victim).iterdir())
    pids = actor_pid(server.stores[victim]), actor_pid(server.replicas[victim])
    for pid in pids:  # as when the node that held both dies
        os.kill(pid, signal.SIGKILL)

    for n, s in enumerate(sessions):  # each continues exactly where its last turn left it
        seed = 100 * n + 3
        for _ in range(3):
            try:
                ids, _, at = drain_stream(
                    s.generate(tokens=tokens(seed), max_new_tokens=6, **SEEDED)
                )
                break
            except grpc.RpcError as exc:  # its replica died: retry the turn
                assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc.details()
        done[s.id].append((seed, ids, at))
        replay = client.open()
        for seed, want, committed in done[s.id]:
            got = drain_stream(replay.generate(tokens=tokens(seed), max_new_tokens=6, **SEEDED))
            assert got[0::2] == (want, committed)
        assert replay.close() and s.close()
    live = server.wait_healed()
    assert victim not in live and not (checkpoint_dir / victim).exists()
    server.wait_at_capacity(live)
    assert_no_checkpoints_left(server, live)
    client.close()
