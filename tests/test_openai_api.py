"""The OpenAI-compatible front door with the official ``openai`` SDK as the client, on a chat
checkpoint (BPE tokenizer, chat template, a reachable EOS): chat completions and completions
streamed and not, Responses chains on live state (``previous_response_id`` forks the held
session and feeds only the new tokens), forks, replay of an evicted state, deletes, tenants,
and every error the API defines — each text equal to transformers' greedy ``generate`` on the
same token sequence, and the pools back at capacity with nothing leaked at the end."""

from __future__ import annotations

import json
import socket
import subprocess

import httpx2 as httpx
import openai
import pytest
import ray

from tests.support.chat_peer import prompt_ids, save_chat_peer
from tests.support.cluster import ServerThread, wait_for
from tests.support.hf_peer import hf_greedy
from tests.support.serve_process import REPO, user_env

KEY_A, KEY_B = "key-acme", "key-globex"
NEW = 8


@pytest.fixture(scope="module")
def peer(tmp_path_factory):
    path = tmp_path_factory.mktemp("chat-peer")
    hf, tok = save_chat_peer(path, seed=5)
    return str(path), hf, tok


@pytest.fixture(scope="module")
def served(ray_cluster, peer, tmp_path_factory):
    path, _, _ = peer
    keys = tmp_path_factory.mktemp("keys") / "keys"
    keys.write_text(f"{KEY_A} acme\n{KEY_B} globex\n")
    server = ServerThread(
        model_path=path,
        replicas=1,
        max_sessions=6,
        max_parked_sessions=24,
        max_context=512,
        api_keys=str(keys),
        max_stored_responses=3,
    ).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served.server.front.http_url, api_key=KEY_A, max_retries=0)


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


def reference(peer, ids: list[int], new: int = NEW) -> tuple[list[int], str]:
    _, hf, tok = peer
    out = hf_greedy(hf, ids, new, until_eos=True)
    return out, tok.decode(out, skip_special_tokens=True)


def continued(peer, state: list[int], messages: list[dict[str, str]]) -> list[int]:
    """The tokens a continuation feeds: the conversation's rendering past the text of
    ``state`` (what the session holds), tokenized by transformers' tokenizer."""
    _, _, tok = peer
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    prior = tok.decode(state, skip_special_tokens=False)
    assert text.startswith(prior)
    return tok.encode(text[len(prior) :], add_special_tokens=False)


def test_models_lists_the_served_checkpoint(client, peer):
    models = client.models.list().data
    assert [m.id for m in models] == [peer[0]]
    assert client.models.retrieve(peer[0]).id == peer[0]


def test_chat_completion_equals_generate(client, model, peer):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
    ids = prompt_ids(peer[2], messages)
    tokens, text = reference(peer, ids)
    got = client.chat.completions.create(model=model, messages=messages, max_tokens=NEW)
    choice = got.choices[0]
    assert choice.message.content == text and choice.message.role == "assistant"
    assert choice.finish_reason == ("stop" if len(tokens) < NEW else "length")
    assert got.usage.prompt_tokens == len(ids)
    assert got.usage.completion_tokens == len(tokens)
    assert got.usage.prompt_tokens_details.cached_tokens == 0
    # cut at its length: finish_reason length, the same first tokens
    short = client.chat.completions.create(model=model, messages=messages, max_tokens=3)
    assert short.choices[0].finish_reason == "length"
    assert short.usage.completion_tokens == 3


def test_chat_completion_streamed(client, model, peer):
    messages = [{"role": "user", "content": "how are you today?"}]
    tokens, text = reference(peer, prompt_ids(peer[2], messages))
    stream = client.chat.completions.create(
        model=model,
        messages=messages,
        max_completion_tokens=NEW,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] in ("stop", "length") and not any(finishes[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(tokens)


def test_a_resent_history_reuses_the_cached_state_exactly(client, model, peer):
    """Chat completions are stateless, but the replica keeps the state at the end of each
    prompt and reply: the next request of the conversation (the whole reply resent, or only
    its first characters, as a client that kept what was spoken) continues from it."""
    tok = peer[2]
    first = [{"role": "user", "content": "tell me about mamba slots"}]
    ids1 = prompt_ids(tok, first)
    reply = client.chat.completions.create(model=model, messages=first, max_tokens=NEW)
    text1 = reply.choices[0].message.content
    for kept in (text1, text1[:2]):
        messages = [*first, {"role": "assistant", "content": kept},
                    {"role": "user", "content": "and then?"}]  # fmt: skip
        ids = prompt_ids(tok, messages)
        _, expected = reference(peer, ids)
        got = client.chat.completions.create(model=model, messages=messages, max_tokens=NEW)
        assert got.choices[0].message.content == expected
        assert got.usage.prompt_tokens == len(ids)
        assert ids[: len(ids1)] == ids1  # the template renders the past as it was
        cached = got.usage.prompt_tokens_details.cached_tokens
        assert len(ids1) <= cached < len(ids), (kept, cached, len(ids1))


def test_completion_of_text_and_tokens(client, model, peer):
    _, _, tok = peer
    prompt = "the session keeps"
    ids = tok.encode(prompt, add_special_tokens=False)
    tokens, text = reference(peer, ids)
    got = client.completions.create(model=model, prompt=prompt, max_tokens=NEW)
    assert got.choices[0].text == text
    assert (got.usage.prompt_tokens, got.usage.completion_tokens) == (len(ids), len(tokens))
    streamed = client.completions.create(model=model, prompt=ids, max_tokens=NEW, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == text


def test_responses_chain_forks_and_deletes(client, model, peer):
    tok = peer[2]
    # turn 1: a fresh state
    first = [{"role": "user", "content": "hello there"}]
    ids1 = prompt_ids(tok, first)
    out1, text1 = reference(peer, ids1)
    r1 = client.responses.create(model=model, input="hello there", max_output_tokens=NEW)
    assert r1.output_text == text1 and r1.status in ("completed", "incomplete")
    assert r1.usage.input_tokens == len(ids1)
    assert r1.usage.input_tokens_details.cached_tokens == 0
    # turn 2 continues the held state: only the new part is fed
    state1 = ids1 + out1
    second = [*first, {"role": "assistant", "content": text1},
              {"role": "user", "content": "and then?"}]  # fmt: skip
    fed2 = continued(peer, state1, second)
    out2, text2 = reference(peer, state1 + fed2)
    r2 = client.responses.create(
        model=model, input="and then?", previous_response_id=r1.id, max_output_tokens=NEW
    )
    assert r2.output_text == text2
    assert r2.usage.input_tokens_details.cached_tokens == len(state1)
    assert r2.usage.input_tokens == len(state1) + len(fed2)
    # turn 3, cut at its length
    state2 = state1 + fed2 + out2
    third = [*second, {"role": "assistant", "content": text2},
             {"role": "user", "content": "stream the tokens"}]  # fmt: skip
    fed3 = continued(peer, state2, third)
    out3, text3 = reference(peer, state2 + fed3, new=2)
    r3 = client.responses.create(
        model=model, input="stream the tokens", previous_response_id=r2.id, max_output_tokens=2
    )
    assert r3.output_text == text3 and r3.status == "incomplete"
    assert r3.incomplete_details.reason == "max_output_tokens"
    assert r3.usage.input_tokens_details.cached_tokens == len(state2)
    # two continuations of r2: a fork each, both exact
    for follow_up in ("merci", "hello"):
        messages = [*second, {"role": "assistant", "content": text2},
                    {"role": "user", "content": follow_up}]  # fmt: skip
        fed = continued(peer, state2, messages)
        _, expected = reference(peer, state2 + fed)
        fork = client.responses.create(
            model=model, input=follow_up, previous_response_id=r2.id, max_output_tokens=NEW
        )
        assert fork.output_text == expected
        assert fork.usage.input_tokens_details.cached_tokens == len(state2)
    # read back, list the input items, delete
    assert client.responses.retrieve(r2.id).output_text == text2
    items = client.responses.input_items.list(r2.id)
    assert [i.content[0].text for i in items.data] == ["and then?"]
    assert client.responses.delete(r3.id) is None
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r3.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=model, input="x", previous_response_id=r3.id)


def test_an_evicted_state_is_replayed_exactly(client, model, peer):
    """--max-stored-responses 3: a fourth stored response evicts the first's state; continuing
    it replays the stored conversation (cached_tokens 0) with the same output."""
    tok = peer[2]
    first = client.responses.create(model=model, input="ok", max_output_tokens=NEW)
    for word in ("one", "two", "three"):
        client.responses.create(model=model, input=word, max_output_tokens=2)
    messages = [{"role": "user", "content": "ok"},
                {"role": "assistant", "content": first.output_text},
                {"role": "user", "content": "again"}]  # fmt: skip
    _, expected = reference(peer, prompt_ids(tok, messages))
    again = client.responses.create(
        model=model, input="again", previous_response_id=first.id, max_output_tokens=NEW
    )
    assert again.output_text == expected
    # replayed: not from the evicted response's state; at most what the turn-boundary cache
    # still held of the conversation's prompt (never its last token)
    assert again.usage.input_tokens_details.cached_tokens < again.usage.input_tokens


def test_streamed_response_events(client, model, peer):
    tok = peer[2]
    _, text = reference(peer, prompt_ids(tok, [{"role": "user", "content": "hello there"}]))
    events = list(
        client.responses.create(
            model=model, input="hello there", max_output_tokens=NEW, stream=True
        )  # fmt: skip
    )
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]  # fmt: skip
    assert kinds[-4:-1] == ["response.output_text.done", "response.content_part.done",
                            "response.output_item.done"]  # fmt: skip
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == text == events[-1].response.output_text
    assert client.responses.retrieve(events[-1].response.id).output_text == text


def test_tenants_see_only_their_responses(served, client, model):
    mine = client.responses.create(model=model, input="hello", max_output_tokens=2)
    other = openai.OpenAI(base_url=served.server.front.http_url, api_key=KEY_B, max_retries=0)
    with pytest.raises(openai.NotFoundError):
        other.responses.retrieve(mine.id)
    with pytest.raises(openai.NotFoundError):
        other.responses.create(model=model, input="x", previous_response_id=mine.id)
    with pytest.raises(openai.NotFoundError):
        other.responses.delete(mine.id)
    nobody = openai.OpenAI(base_url=served.server.front.http_url, api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        nobody.models.list()


def test_errors_in_the_apis_shape(served, client, model):
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-nope", messages=messages)
    for extra in ({"n": 2}, {"tools": [{"type": "function", "function": {"name": "f"}}]},
                  {"logprobs": True}, {"presence_penalty": 0.5}):  # fmt: skip
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(model=model, messages=messages, **extra)
        assert refused.value.code == "unsupported_parameter"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=model, messages=messages, temperature=3)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=model, messages=[{"role": "tool", "content": "x"}])
    with pytest.raises(openai.BadRequestError) as overflow:
        client.chat.completions.create(model=model, messages=messages, max_tokens=100_000)
    assert overflow.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as overflow:
        client.responses.create(model=model, input="x " * 2000)
    assert overflow.value.code == "context_length_exceeded"
    url = served.server.front.http_url
    auth = {"Authorization": f"Bearer {KEY_A}"}
    raw = httpx.post(f"{url}/chat/completions", content=b"{not json", headers=auth)
    assert raw.status_code == 400 and raw.json()["error"]["type"] == "invalid_request_error"
    big = httpx.post(f"{url}/completions", content=b" " * (9 << 20), headers=auth)
    assert big.status_code == 413
    assert httpx.get(f"{url}/nothing", headers=auth).status_code == 404
    assert httpx.post(f"{url}/responses", json=[1], headers=auth).status_code == 400


def settled(served) -> bool:
    """No turn runs and the only open sessions are those stored responses hold."""
    held = sum(ray.get(served.server.responses.stats.remote()).states.values())
    snaps = served.snapshots()
    running = sum(s.running_requests + s.waiting_requests for s in snaps.values())
    return running == 0 and sum(s.open_sessions for s in snaps.values()) == held


def test_a_client_that_leaves_mid_stream_stores_nothing(served, client, model):
    """The turn is cancelled, its session released, no response stored."""
    store = served.server.responses
    before = ray.get(store.ids.remote("acme"))
    url = served.server.front.http_url
    body = {"model": model, "input": "hello", "max_output_tokens": 300, "ignore_eos": True,
            "stream": True}  # fmt: skip
    headers = {"Authorization": f"Bearer {KEY_A}"}
    with httpx.stream("POST", f"{url}/responses", json=body, headers=headers) as response:
        lines = response.iter_lines()
        deltas = 0
        for line in lines:
            deltas += "output_text.delta" in line
            if deltas == 3:
                break  # leave: the connection closes with the block
    assert ray.get(store.ids.remote("acme")) == before
    wait_for(lambda: settled(served), 30, 0.2, "the abandoned turn's session to be released")
    served.assert_no_leaks()


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 300}),
        ("responses", {"input": "hi", "max_output_tokens": 300}),
    ],
)
def test_a_client_that_leaves_before_the_first_byte_holds_nothing(served, model, path, body):
    """The request is sent and the socket closed at once: the answer is never read, so its
    stream is never iterated. The session is released within seconds (the idle timeout is
    minutes), not when the generator is collected or the session times out."""
    host, port = served.server.front.http_url.removeprefix("http://").split("/")[0].split(":")
    payload = json.dumps({"model": model, "stream": True, "ignore_eos": True, **body}).encode()
    request = (
        f"POST /v1/{path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {KEY_A}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    ).encode() + payload
    for _ in range(3):
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(request)
            sock.shutdown(socket.SHUT_RDWR)
    wait_for(lambda: settled(served), 15, 0.2, "the unread answers' sessions to be released")
    served.assert_no_leaks()


def test_metrics_count_requests_and_reused_tokens(served, client, model):
    text = httpx.get(served.server.metrics_url).text
    assert 'session_router_http_requests_total{route="responses",status="200"}' in text
    assert 'session_router_http_requests_total{route="chat_completions",status="400"}' in text
    series = 'session_router_http_cached_prompt_tokens_total{route="responses"}'
    reused = [line for line in text.splitlines() if line.startswith(series)]
    assert reused and float(reused[0].split()[-1]) > 0

    def stored_gauges() -> bool:
        lines = httpx.get(served.server.metrics_url).text.splitlines()
        total = [line for line in lines if line.startswith("session_router_stored_responses ")]
        states = 'session_router_stored_response_states{replica="replica-0"}'
        return (
            bool(total)
            and float(total[0].split()[-1]) > 0
            and any(line.startswith(states) for line in lines)
        )

    wait_for(stored_gauges, 30, 0.5, "the stored-responses gauges")


def test_the_openai_agents_sdk_runs_two_turns_unchanged(served, client, model, peer):
    """The Agents SDK (in its own environment, .venv/agents) holds a two-turn exchange; the
    second turn continues the first's state (previous_response_id)."""
    agents_python = REPO / ".venv" / "agents" / "bin" / "python"
    script = REPO / "tests" / "support" / "agents_exchange.py"
    result = subprocess.run(
        [str(agents_python), str(script), served.server.front.http_url, model, KEY_A],
        capture_output=True, text=True, timeout=120, env=user_env(), cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    exchange = json.loads(result.stdout.strip().splitlines()[-1])
    messages = [{"role": "system", "content": "be brief"},
                {"role": "user", "content": "hello there"}]  # fmt: skip
    _, expected = reference(peer, prompt_ids(peer[2], messages))
    assert exchange["replies"][0] == expected
    first, second = (client.responses.retrieve(i) for i in exchange["ids"])
    assert first.output_text == expected and second.output_text == exchange["replies"][1]
    assert second.previous_response_id == first.id
    assert second.usage.input_tokens_details.cached_tokens == first.usage.total_tokens


def test_a_response_outlives_the_gateway_that_made_it(served, client, model, peer):
    """A response made through a second gateway is continued through the first after the
    second has stopped: the state and the record belong to the cluster."""
    import dataclasses

    from router.ops.gateway_server import GatewayServer

    config = dataclasses.replace(served.config.gateway, grpc_port=0, metrics_port=0, http_port=0)
    other = GatewayServer(config, cluster_metrics=False)
    served.call(other.start(served.server.router, served.server.responses))
    try:
        theirs = openai.OpenAI(base_url=other.http_url, api_key=KEY_A, max_retries=0)
        made = theirs.responses.create(model=model, input="hello there", max_output_tokens=NEW)
    finally:
        served.call(other.stop())
    tok = peer[2]
    ids = prompt_ids(tok, [{"role": "user", "content": "hello there"}])
    out, text = reference(peer, ids)
    assert made.output_text == text
    messages = [{"role": "user", "content": "hello there"}, {"role": "assistant", "content": text},
                {"role": "user", "content": "merci"}]  # fmt: skip
    _, expected = reference(peer, ids + out + continued(peer, ids + out, messages))
    later = client.responses.create(
        model=model, input="merci", previous_response_id=made.id, max_output_tokens=NEW
    )
    assert later.output_text == expected
    assert later.usage.input_tokens_details.cached_tokens == len(ids + out)


def test_after_everything_every_pool_is_back(served, client, model):
    """Delete every stored response: the sessions they held are released, the pools are at
    capacity with nothing leaked."""
    store = served.server.responses
    for key, tenant in ((KEY_A, "acme"), (KEY_B, "globex")):
        owner = openai.OpenAI(base_url=served.server.front.http_url, api_key=key, max_retries=0)
        ids = ray.get(store.ids.remote(tenant))
        assert tenant == "globex" or ids
        for response_id in ids:
            owner.responses.delete(response_id)
        assert ray.get(store.ids.remote(tenant)) == []
    served.wait_at_capacity(timeout=30)
    served.assert_no_leaks(at_capacity=True)
