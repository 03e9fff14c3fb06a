"""End to end, through the ``openai`` SDK's ``realtime.connect``: a Realtime response's end is not
held for its checkpoint, and the conversation stays exact when its replica dies.

A gRPC turn's last chunk waits until its checkpoint is stored, so that a client that saw the
turn end finds its session there after a failover. A Realtime response does not wait: its next
turn names the tokens the session must hold (``ChatInput.prior_ids``), and a session a failover
restored from an older checkpoint refuses it, nothing done, and the connection replays the
conversation into a fresh session. With the replica's checkpoint store stopped (SIGSTOP), a
response ends at once while a gRPC turn on the same replica is held until the hold's bound; then
the replica is SIGKILLed and the next response equals transformers' greedy reply to the state it
continues (the restored session's, or the replayed conversation's).

The test kills a replica, so the module has its own server.
"""

from __future__ import annotations

import os
import signal
import time

import openai
import pytest

from replica.checkpoints.holds import HOLD_S
from tests.support.chat_peer import long_reply_peer, prompt_ids
from tests.support.cluster import actor_pid, drain_stream
from tests.support.realtime_turns import (
    ask,
    continued,
    deltas,
    first_exchange,
    reference,
    user,
)
from tests.support.servers import grpc_client, serve_cluster


@pytest.fixture(scope="module")
def peer(tmp_path_factory):
    return long_reply_peer(tmp_path_factory)


@pytest.fixture(scope="module")
def server(ray_cluster, peer):
    with serve_cluster(model_path=peer[0], replicas=2, max_context=1024, stale_after_s=3.0) as srv:
        yield srv


def let_go(server, replica_id: str) -> frozenset[str]:
    """The sessions whose turn end went on before their checkpoint was stored, and were held."""
    return server.snapshots([replica_id])[replica_id].checkpoints.let_go


def test_a_response_is_not_held_for_its_checkpoint_and_stays_exact_after_a_failover(server, peer):
    tok = peer[2]
    client = openai.OpenAI(base_url=server.server.front.http_url, api_key="-", max_retries=0)
    model = client.models.list().data[0].id
    with client.realtime.connect(model=model) as conn, grpc_client(server.address) as rpc:
        messages, state, reply = first_exchange(conn, peer)
        [victim] = [r for r, held in server.sessions_on().items() if held]
        store = actor_pid(server.stores[victim])
        os.kill(store, signal.SIGSTOP)
        try:
            messages += [{"role": "assistant", "content": reply},
                         {"role": "user", "content": "and then?"}]  # fmt: skip
            fed = continued(peer, state, messages)
            out, reply = reference(peer, state + fed)
            events, _ = ask(conn, "and then?")
            assert deltas(events) == reply
            state += fed + out
            # the response ended with the store stopped: not held (a hold ends only at its
            # bound, and leaves the session let go until a checkpoint of it is stored)
            assert not let_go(server, victim) & server.sessions_on([victim])[victim]

            # a gRPC turn on the same replica is held until the bound
            sessions = [rpc.open() for _ in range(4)]
            plain = next(s for s in sessions if s.replica_id == victim)
            start = time.monotonic()
            drain_stream(plain.generate(tokens=[3, 4, 5], max_new_tokens=2))
            assert time.monotonic() - start >= HOLD_S * 0.9
            assert plain.id in let_go(server, victim)
            for s in sessions:
                s.close()
            server.sigkill_replica(victim)
        finally:
            os.kill(store, signal.SIGCONT)

        messages += [{"role": "assistant", "content": reply},
                     {"role": "user", "content": "more"}]  # fmt: skip
        conn.conversation.item.create(item=user("more"))
        for _ in range(10):  # a response that found its replica dead fails: ask again
            conn.response.create()
            events = []
            for event in conn:
                events.append(event)
                if event.type == "response.done":
                    break
            done = event.response
            if done.status != "failed":
                break
            time.sleep(0.5)
        assert done.status == "incomplete", done  # the reply ran to its length
        cached = done.usage.input_token_details.cached_tokens
        if cached:  # the session was restored holding every token it had: continued
            assert cached == len(state)
            want, _ = reference(peer, state + continued(peer, state, messages))
        else:  # restored from an older checkpoint (or lost): the conversation was replayed
            want, _ = reference(peer, prompt_ids(tok, messages))
        assert deltas(events) == tok.decode(want, skip_special_tokens=True)
    live = server.wait_healed()
    assert victim not in live
    server.wait_at_capacity(live)
