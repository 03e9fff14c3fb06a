"""The Realtime WebSocket over TLS (``wss://``): the front door serves ``GET /v1/realtime`` on its
HTTP port with the gRPC server's TLS files (here with client certificates required, as in
test_e2e_security.py) and its API keys. Through the official ``openai`` SDK's
``realtime.connect``, trusting the test CA and presenting a client certificate it signed: an
exchange whose reply equals transformers' greedy one (the reference the plain ``ws://`` tests of
test_realtime.py compare with), its session released once the socket closes (pools back at
capacity, nothing leaked). A wrong key is refused with 401 at the upgrade; a plaintext
``ws://`` connection to the TLS port, and a TLS one without a client certificate or with another
CA's, fail before any upgrade; none of them leaves a session behind."""

from __future__ import annotations

import ssl
from collections.abc import Iterator

import httpx2 as httpx
import openai
import pytest
from openai.resources.realtime.realtime import RealtimeConnectionManager
from websockets.exceptions import ConnectionClosedError, InvalidMessage, InvalidStatus

from tests.support.chat_peer import long_reply_peer
from tests.support.cluster import ServerThread, wait_for
from tests.support.realtime_turns import first_exchange
from tests.support.servers import api_keys_file, serve_cluster
from tests.support.tls import Issued, module_pki

KEY = "acme-key-1234567890"


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> dict[str, str | Issued]:
    return module_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def peer(tmp_path_factory):
    """A chat checkpoint whose greedy replies run to their length (no early EOS)."""
    return long_reply_peer(tmp_path_factory)


@pytest.fixture(scope="module")
def served(ray_cluster, peer, pki, tmp_path_factory) -> Iterator[ServerThread]:
    """One replica of ``peer``'s checkpoint behind mutual TLS and one tenant key."""
    keys = api_keys_file(tmp_path_factory.mktemp("keys"), {KEY: "acme"})
    server_cert = pki["server"]
    assert isinstance(server_cert, Issued)
    with serve_cluster(
        model_path=peer[0], replicas=1, max_sessions=4, max_context=1024, api_keys=keys,
        tls_cert=server_cert.cert, tls_key=server_cert.key, tls_client_ca=pki["ca"],
    ) as server:  # fmt: skip
        yield server


def tls_context(pki: dict[str, str | Issued], cert: str | None = "client") -> ssl.SSLContext:
    """A client context that trusts the test CA (and checks the server's name) and presents
    ``pki[cert]``'s certificate; none when ``cert`` is None."""
    context = ssl.create_default_context(cafile=pki["ca"])
    if cert is not None:
        issued = pki[cert]
        assert isinstance(issued, Issued)
        context.load_cert_chain(issued.cert, issued.key)
    return context


def sdk(base_url: str, context: ssl.SSLContext, key: str = KEY) -> openai.OpenAI:
    """An ``openai`` client of ``base_url`` whose HTTPS requests use ``context``."""
    http = openai.DefaultHttpxClient(verify=context)
    return openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, http_client=http)


def connect(
    client: openai.OpenAI, model: str, context: ssl.SSLContext
) -> RealtimeConnectionManager:
    """``client.realtime.connect`` with ``context`` as the WebSocket's TLS: the SDK passes
    ``websocket_connection_options`` on to ``websockets.sync.client.connect`` as they are, and
    ``ssl`` is one of its options (the SDK's TypedDict does not list it)."""
    return client.realtime.connect(model=model, websocket_connection_options={"ssl": context})


@pytest.fixture(scope="module")
def model(served, pki) -> str:
    """The served model's id, listed over HTTPS."""
    url = served.server.front.http_url
    assert url.startswith("https://")
    return sdk(url, tls_context(pki)).models.list().data[0].id


def realtime_sessions(served: ServerThread) -> float:
    """The gauge of live Realtime sessions (metrics stay plain HTTP)."""
    lines = httpx.get(served.server.metrics_url).text.splitlines()
    gauge = [line for line in lines if line.startswith("session_router_realtime_sessions ")]
    return float(gauge[0].split()[-1]) if gauge else 0.0


def released(served: ServerThread) -> None:
    """No Realtime session is live, every pool is back at capacity and nothing leaked."""
    wait_for(lambda: realtime_sessions(served) == 0, 30, 0.2, "the sockets' sessions to end")
    served.wait_at_capacity(timeout=30)
    served.assert_no_leaks(at_capacity=True)


def test_an_exchange_over_wss_equals_the_reference_and_is_released(served, pki, peer, model):
    """Over ``wss://``: a user message and a response, its reply equal to transformers'
    greedy one (``first_exchange`` compares them); one live session while the socket is open,
    none once it closes."""
    context = tls_context(pki)
    with connect(sdk(served.server.front.http_url, context), model, context) as conn:
        first_exchange(conn, peer)  # its reply checked equal to transformers' greedy one
        assert realtime_sessions(served) == 1
    released(served)


def test_a_wrong_key_is_refused_with_401(served, pki, model):
    """The TLS handshake succeeds; the upgrade is answered 401 and no session is left open."""
    context = tls_context(pki)
    nobody = sdk(served.server.front.http_url, context, key="not-a-key")
    with pytest.raises(InvalidStatus) as refused:
        connect(nobody, model, context).enter()
    assert refused.value.response.status_code == 401
    released(served)


# How a connection cut before any HTTP response reaches the client: the status line never
# comes, or the request cannot be sent (the server's TLS alert), or the TLS handshake fails.
CUT = (InvalidMessage, ConnectionClosedError, ssl.SSLError)


def test_plaintext_ws_to_the_tls_port_fails(served, pki, model):
    """The SDK on the same port with ``http://`` (so ``ws://``): no HTTP response comes back
    (not even a refusal) and no session is left open."""
    plain = served.server.front.http_url.replace("https://", "http://", 1)
    assert plain.startswith("http://")
    with pytest.raises(CUT):
        sdk(plain, tls_context(pki)).realtime.connect(model=model).enter()
    released(served)


@pytest.mark.parametrize("cert", [None, "rogue"], ids=["no-certificate", "another-ca"])
def test_wss_without_a_trusted_client_certificate_fails(served, pki, model, cert):
    """With client certificates required, a client that presents none, or one another CA
    signed, is cut before any HTTP response (a key is not enough); no session is left open."""
    context = tls_context(pki, cert)
    with pytest.raises(CUT):
        connect(sdk(served.server.front.http_url, context), model, context).enter()
    released(served)
