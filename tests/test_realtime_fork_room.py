"""Realtime rollback points at capacity, through the ``openai`` SDK's ``realtime.connect``, on a
replica with room for exactly two sessions (no host tier). A response's fork is taken by the
replica in the command that submits its turn, after the previous response's fork is released:
a connection holds at most two sessions, and each response of a lone connection still gets its
rollback point (deleting its reply is exact). When another connection takes the room, a
response runs at once without one (it never waits for room) and deleting its reply replays.
The router learns of every fork off the token path (pinned, then forgotten). Pools at capacity
with nothing leaked once the sockets close. (A module of its own: its server's replica asks
for the CPU another module's server holds.)"""

from __future__ import annotations

import openai
import pytest
import ray

from tests.support.chat_peer import long_reply_peer, prompt_ids
from tests.support.cluster import ServerThread, wait_for
from tests.support.realtime_turns import (
    ask,
    continued,
    deltas,
    reference,
    replies_of_new_tokens,
    until_done,
)


@pytest.fixture(scope="module")
def peer(tmp_path_factory):
    return long_reply_peer(tmp_path_factory)


@pytest.fixture(scope="module")
def served(ray_cluster, peer):
    server = ServerThread(
        model_path=peer[0], replicas=1, max_sessions=2, max_parked_sessions=0, max_context=1024,
        open_timeout_s=2.0,
    ).start()  # fmt: skip
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served.server.front.http_url, api_key="unused", max_retries=0)


def held(served) -> tuple[set[str], set[str]]:
    """The sessions the replica holds, and those the router pins to it."""
    [(replica_id, sessions)] = served.sessions_on().items()
    pinned = ray.get(served.server.router.pinned_sessions.remote(replica_id), timeout=30)
    return sessions, set(pinned)


def pinned_as_held(served, count: int) -> None:
    """The replica holds ``count`` sessions, and the router pins exactly those (soon)."""
    seen: list = []

    def agree() -> bool:
        seen[:] = held(served)
        return len(seen[0]) == count and seen[0] == seen[1]

    try:
        wait_for(agree, timeout=30)
    except AssertionError:
        raise AssertionError(f"{count} sessions wanted; held, pinned: {seen}") from None


def test_a_lone_connection_at_capacity_keeps_its_rollback_point(served, client, peer):
    tok = peer[2]
    model = client.models.list().data[0].id
    with client.realtime.connect(model=model) as conn:
        replies_of_new_tokens(conn)
        first = [{"role": "user", "content": "hello there"}]
        ids1 = prompt_ids(tok, first)
        out1, text1 = reference(peer, ids1)
        ask(conn, "hello there")
        pinned_as_held(served, 2)  # the session and its fork: the replica is full
        state1 = ids1 + out1
        second = [*first, {"role": "assistant", "content": text1},
                  {"role": "user", "content": "and then?"}]  # fmt: skip
        _, text2 = reference(peer, state1 + continued(peer, state1, second))
        # the first fork goes before the second is taken: never three sessions, and the
        # second response has its rollback point although the replica was full
        events, done2 = ask(conn, "and then?")
        assert deltas(events) == text2
        pinned_as_held(served, 2)
        conn.conversation.item.delete(item_id=done2.output[0].id)
        assert conn.recv().type == "conversation.item.deleted"
        conn.response.create()
        events, again = until_done(conn)
        assert deltas(events) == text2  # exact: the fork held state1
        assert again.usage.input_token_details.cached_tokens == len(state1)
        pinned_as_held(served, 2)

        # rolling back to that fork leaves the connection one session; another connection
        # takes the room the next fork would need: the response runs at once without a
        # rollback point (exact all the same), and deleting its reply replays the conversation
        conn.conversation.item.delete(item_id=again.output[0].id)
        assert conn.recv().type == "conversation.item.deleted"
        pinned_as_held(served, 1)
        with client.realtime.connect(model=model) as other:
            other.recv()
            pinned_as_held(served, 2)
            conn.response.create()
            events, unforked = until_done(conn)
            assert deltas(events) == text2
            assert unforked.usage.input_token_details.cached_tokens == len(state1)
            pinned_as_held(served, 2)
        pinned_as_held(served, 1)
        conn.conversation.item.delete(item_id=unforked.output[0].id)
        assert conn.recv().type == "conversation.item.deleted"
        conn.response.create()
        events, replayed = until_done(conn)
        assert replayed.usage.input_token_details.cached_tokens == 0  # no fork: a replay
        replay_ids = prompt_ids(tok, second)
        assert deltas(events) == reference(peer, replay_ids)[1]
        assert replayed.usage.input_tokens == len(replay_ids)
    pinned_as_held(served, 0)
    served.wait_at_capacity(timeout=30)
    served.assert_no_leaks(at_capacity=True)
