"""``--model-path``: an HF-format checkpoint with its own ``tokenizer.json`` served end to end.

The checkpoint is ``tests.support.bpe_peer``'s: a tiny random transformers Bamba saved with
``save_pretrained`` plus a small BPE tokenizer trained with the ``tokenizers`` library. Text goes
in through gRPC and the streamed text is the tokenizer's decoding of the streamed tokens.
"""

from __future__ import annotations

import statistics
import time

import pytest
import ray

from protos import session_router_pb2 as pb
from replica.api import ActorError, SamplingParams, StatusCode
from replica.model import HFTokenizer, load_model
from router.client import SessionClient
from tests.support.bpe_peer import CORPUS, save_bpe_peer
from tests.support.cluster import ServerThread


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("bamba-bpe")
    save_bpe_peer(path, seed=3)
    return str(path)


def test_loader_uses_the_checkpoints_tokenizer(checkpoint):
    _, _, tok = load_model(checkpoint)
    assert isinstance(tok, HFTokenizer)
    assert tok.eos_token_id == tok.token_to_id("</s>")
    text = "hello there, the session keeps its state"
    ids = tok.encode(text)
    assert len(ids) < len(text.encode()) and tok.decode(ids) == text


def test_serve_with_model_path_streams_text(ray_cluster, checkpoint):
    server = ServerThread(replicas=1, model_path=checkpoint).start()
    try:
        _, _, tok = load_model(checkpoint)
        with SessionClient(server.address) as client, client.open() as session:
            ids, pieces = [], []
            for chunk in session.generate("hello there, how are", max_new_tokens=12):
                ids.extend(chunk.token_ids)
                pieces.append(chunk.text)
                last = chunk
            assert last.finish_reason == pb.FINISH_REASON_LENGTH and len(ids) == 12
            assert "".join(pieces) == tok.decode(ids)
            assert last.committed_tokens == len(tok.encode("hello there, how are")) + 12
        server.wait_at_capacity()
        server.assert_no_leaks()
    finally:
        server.stop()


def test_a_long_text_is_tokenised_off_the_replicas_event_loop(ray_cluster, checkpoint):
    """Tokenising megabytes of text takes seconds; meanwhile the replica still answers its
    health probes at once (the stale-replica check relies on them)."""
    server = ServerThread(replicas=1, model_path=checkpoint).start()
    try:
        _, _, tok = load_model(checkpoint)
        text = " ".join(CORPUS) * 1200  # about 3 MB: the gateway's limit is not in the way here
        started = time.perf_counter()
        tok.encode(text)
        encode_s = time.perf_counter() - started
        replica = server.replicas["replica-0"]
        with SessionClient(server.address) as client, client.open() as session:
            ray.get(replica.ping.remote(), timeout=30)
            submitted = replica.submit_turn.remote(
                "no-gateway", session.id, text, None, SamplingParams(max_new_tokens=1)
            )
            waits = []
            while not ray.wait([submitted], timeout=0)[0]:
                started = time.perf_counter()
                assert ray.get(replica.ping.remote(), timeout=30)
                waits.append(time.perf_counter() - started)
            refused = ray.get(submitted)
            assert isinstance(refused, ActorError) and refused.code == StatusCode.OUT_OF_RANGE
        # on the event loop, the pings would queue behind the whole encode: one or two answered,
        # the first after about encode_s
        assert len(waits) >= 4 and statistics.median(waits) < encode_s / 2, (waits, encode_s)
        server.wait_at_capacity()
        server.assert_no_leaks()
    finally:
        server.stop()
