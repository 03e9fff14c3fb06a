"""What a gateway tells a client whose turn was running on a replica that died
(``router.gateway.inbox.ReplicaLost``): the code follows the router's word about the session,
and only the router's ABORTED (its state is gone) ends it as lost. A session the router could
not place yet (it was restarting, or the failover had not ended) is not gone: the turn ends
UNAVAILABLE, retry it. (Before, any answer but a place was taken for gone, the router's
restart included.)"""

from __future__ import annotations

import pytest

from replica.api import ActorError, StatusCode, replica_lost_message
from router.gateway.inbox import ReplicaLost

SID = "5" * 32


def test_a_restored_session_is_retried_where_it_continues():
    lost = ReplicaLost("replica-0", 12)
    event = lost.event(SID)
    assert not lost.gone
    assert event.error_code == StatusCode.UNAVAILABLE
    assert "committed_tokens 12" in event.error


def test_only_the_routers_aborted_is_gone():
    aborted = ActorError(StatusCode.ABORTED, replica_lost_message(SID))
    for lost in (ReplicaLost("replica-0", None), ReplicaLost("replica-0", None, aborted)):
        assert lost.gone
        event = lost.event(SID)
        assert event.error_code == StatusCode.ABORTED
        assert event.error == replica_lost_message(SID)


def test_a_session_closed_meanwhile_is_not_found():
    closed = ActorError(StatusCode.NOT_FOUND, f"session {SID} is not open; open a new one")
    lost = ReplicaLost("replica-0", None, closed)
    assert lost.gone
    event = lost.event(SID)
    assert (event.error_code, event.error) == (StatusCode.NOT_FOUND, closed.message)


@pytest.mark.parametrize(
    "why",
    [
        "the session router is restarting or down (RayActorError); retry shortly",
        "it is still on replica-0",
        "replica-3 did not answer",
    ],
)
def test_a_session_not_placed_yet_is_retried_not_lost(why):
    lost = ReplicaLost("replica-0", None, ActorError(StatusCode.UNAVAILABLE, why))
    assert not lost.gone  # a Converse asks the router again instead of ending
    event = lost.event(SID)
    assert event.error_code == StatusCode.UNAVAILABLE
    assert "retry the turn" in event.error and why in event.error
