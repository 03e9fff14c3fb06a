"""The generation fields over the wire: ``serve --model-path`` of a checkpoint whose
``generation_config.json`` names an EOS; through gRPC the EOS ends a turn where transformers'
``generate`` stops, ``ignore_eos`` runs on, a stop string ends a turn without being streamed,
``top_k`` 1 is greedy; every slot is free afterwards."""

from __future__ import annotations

import pytest

from protos import session_router_pb2 as pb
from replica.model import load_model
from router.client import SessionClient
from tests.support.bpe_peer import (
    first_new_at,
    save_bpe_peer,
    stop_across_tokens,
    with_generation_config,
)
from tests.support.cluster import ServerThread
from tests.support.hf_peer import hf_greedy

PROMPT = "hello there, how are"
NEW = 40


def chunks(session, **sampling) -> tuple[list[int], str, int, int]:
    """One turn: (token ids, text, finish reason, committed tokens)."""
    ids, text = [], []
    for chunk in session.generate(PROMPT, **sampling):
        ids += chunk.token_ids
        text.append(chunk.text)
        last = chunk
    return ids, "".join(text), last.finish_reason, last.committed_tokens


@pytest.fixture(scope="module")
def served(ray_cluster, tmp_path_factory):
    """(server, tokenizer, prompt ids, transformers' greedy tokens without EOS, EOS index)."""
    base = tmp_path_factory.mktemp("grpc-gen")
    hf = save_bpe_peer(base / "peer", seed=11)
    tok = load_model(str(base / "peer"))[2]
    prompt = tok.encode(PROMPT)
    tokens = hf_greedy(hf, prompt, NEW, until_eos=True)
    k = first_new_at(tokens, 30)  # late, so the stop string comes first
    ckpt = with_generation_config(str(base / "peer"), base / "eos", {"eos_token_id": tokens[k]})
    server = ServerThread(replicas=1, model_path=ckpt).start()
    try:
        yield server, tok, prompt, tokens, k
    finally:
        server.stop()


def test_eos_ignore_eos_stop_strings_and_top_k_over_grpc(served):
    server, tok, prompt, tokens, k = served
    with SessionClient(server.address) as client:
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
    server.wait_at_capacity()
    server.assert_no_leaks()
