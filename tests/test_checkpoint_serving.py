"""``--model-path``: an HF-format checkpoint with its own ``tokenizer.json`` and
``generation_config.json`` served end to end (one server for the module, one replica).

The checkpoint is ``tests.support.bpe_peer``'s: a tiny random transformers Bamba saved with
``save_pretrained`` plus a small BPE tokenizer trained with the ``tokenizers`` library, its
``generation_config.json`` naming an EOS. Text goes in through gRPC and the streamed text is the
tokenizer's decoding of the streamed tokens; through gRPC the EOS ends a turn where
transformers' ``generate`` stops, ``ignore_eos`` runs on, a stop string ends a turn without being
streamed, ``top_k`` 1 is greedy. Every test leaves every slot free.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import pytest
import ray

from protos import session_router_pb2 as pb
from replica.api import ActorError, SamplingParams, StatusCode
from replica.model import HFTokenizer, Tokenizer, load_model
from replica.model.tokenizer import LONG_TEXT_CHARS
from tests.support.bpe_peer import (
    CORPUS,
    first_new_at,
    save_bpe_peer,
    stop_across_tokens,
    with_generation_config,
)
from tests.support.cluster import ServerThread
from tests.support.hf_peer import hf_greedy
from tests.support.servers import grpc_client, leave_clean, serve_cluster

PROMPT = "hello there, how are"
NEW = 40


@dataclass(frozen=True)
class Served:
    server: ServerThread
    peer: str  # the checkpoint transformers saved (no generation_config.json)
    tok: Tokenizer
    prompt: list[int]
    tokens: list[int]  # transformers' greedy tokens after the prompt, the peer having no EOS
    eos_at: int  # the index in ``tokens`` of the served checkpoint's EOS


@pytest.fixture(scope="module")
def served(ray_cluster, tmp_path_factory):
    base = tmp_path_factory.mktemp("bamba-bpe")
    hf = save_bpe_peer(base / "peer", seed=11)
    tok = load_model(str(base / "peer"))[2]
    prompt = tok.encode(PROMPT)
    tokens = hf_greedy(hf, prompt, NEW, until_eos=True)
    k = first_new_at(tokens, 30)  # late, so the stop string comes first
    ckpt = with_generation_config(str(base / "peer"), base / "eos", {"eos_token_id": tokens[k]})
    # stale_after_s: on a loaded machine the replica encoding 3 MB of text may push no snapshot
    # for 5 s and be replaced mid-test; the test times the replica's answers itself
    with serve_cluster(replicas=1, model_path=ckpt, stale_after_s=30.0) as server:
        yield Served(server, str(base / "peer"), tok, prompt, tokens, k)


def chunks(session, **sampling) -> tuple[list[int], str, int, int]:
    """One turn: (token ids, text, finish reason, committed tokens)."""
    ids, text = [], []
    for chunk in session.generate(PROMPT, **sampling):
        ids += chunk.token_ids
        text.append(chunk.text)
        last = chunk
    return ids, "".join(text), last.finish_reason, last.committed_tokens


def test_loader_uses_the_checkpoints_tokenizer(served):
    _, _, tok = load_model(served.peer)
    assert isinstance(tok, HFTokenizer)
    assert tok.eos_token_id == tok.token_to_id("</s>")
    text = "hello there, the session keeps its state"
    ids = tok.encode(text)
    assert len(ids) < len(text.encode()) and tok.decode(ids) == text


def test_serve_with_model_path_streams_text(served):
    with grpc_client(served.server.address) as client, client.open() as session:
        ids, text, reason, committed = chunks(session, max_new_tokens=12)
        assert reason == pb.FINISH_REASON_LENGTH and ids == served.tokens[:12]
        assert text == served.tok.decode(ids)
        assert committed == len(served.tok.encode(PROMPT)) + 12
    leave_clean(served.server)


def test_eos_ignore_eos_stop_strings_and_top_k_over_grpc(served):
    tok, prompt, tokens, k = served.tok, served.prompt, served.tokens, served.eos_at
    with grpc_client(served.server.address) as client:
        with client.open() as session:
            got = chunks(session, max_new_tokens=NEW)
            assert got == (
                tokens[: k + 1],
                tok.decode(tokens[:k]),
                pb.FINISH_REASON_STOP,
                len(prompt) + k + 1,
            )
        with client.open() as session:
            ids, text, reason, _ = chunks(session, max_new_tokens=NEW, ignore_eos=True)
            assert (ids, text, reason) == (tokens, tok.decode(tokens), pb.FINISH_REASON_LENGTH)
        j, stop = stop_across_tokens(tok, tokens[:k])
        full = tok.decode(tokens)
        with client.open() as session:
            ids, text, reason, committed = chunks(session, max_new_tokens=NEW, stop=[stop])
            assert (ids, reason, committed) == (
                tokens[: j + 2],
                pb.FINISH_REASON_STOP,
                len(prompt) + j + 2,
            )
            assert text == full[: full.find(stop)]
        with client.open() as session:
            hot = dict(temperature=4.0, top_k=1, seed=9)
            assert chunks(session, max_new_tokens=NEW, **hot)[0] == tokens[: k + 1]
    leave_clean(served.server)
    served.server.assert_no_leaks()


def test_a_long_text_is_tokenised_off_the_replicas_event_loop(served):
    """Tokenising megabytes of text takes seconds; meanwhile the replica still answers its
    health probes at once (the stale-replica check relies on them)."""
    server, tok = served.server, served.tok
    text = " ".join(CORPUS) * 500  # about 1.8 MB: the gateway's limit is not in the way here
    long_enough = text[: LONG_TEXT_CHARS + 100]  # encoded the GIL-free way, to the same ids
    assert tok.encode(long_enough) == tok.backend.encode(long_enough, add_special_tokens=False).ids
    started = time.perf_counter()
    tok.encode(text)
    encode_s = time.perf_counter() - started
    replica = server.replicas["replica-0"]
    with grpc_client(server.address) as client, client.open() as session:
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
    leave_clean(server)
    server.assert_no_leaks()
