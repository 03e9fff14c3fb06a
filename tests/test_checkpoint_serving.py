"""``--model-path``: an HF-format checkpoint with its own ``tokenizer.json`` served end to end.

The checkpoint is made here: a tiny random transformers Bamba saved with ``save_pretrained``
plus a small BPE tokenizer trained with the ``tokenizers`` library. Text goes in through gRPC
and the streamed text is the tokenizer's decoding of the streamed tokens.
"""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from protos import session_router_pb2 as pb
from replica.model import HFTokenizer, load_model
from router.client import SessionClient
from tests.support.cluster import ServerThread
from tests.support.hf_peer import VOCAB, tiny_hf_bamba

CORPUS = [
    "the session keeps its state between turns",
    "hello there, how are you today?",
    "mamba slots are freed when a session ends",
    "stream the tokens as they come",
] * 20


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("bamba-bpe")
    tiny_hf_bamba(seed=3).save_pretrained(str(path))
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer)
    assert tok.get_vocab_size() <= VOCAB
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
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
