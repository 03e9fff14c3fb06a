"""Real generation on a checkpoint transformers saved, with a BPE ``tokenizer.json`` trained
here: the model's EOS (from ``generation_config.json``) ends a turn exactly where transformers'
``generate`` stops, ``ignore_eos`` runs on, the file's defaults fill what a request leaves unset,
stop strings split across tokens end a turn (not streamed; the state holds the tokens up to the
match), ``top_k`` 1 is greedy and seeded ``top_k`` is reproducible and keeps to the k most likely
tokens; text in and text out (through ``DecodeStream``) equal transformers' tokenizer."""

from __future__ import annotations

import json
import random
import shutil

import pytest
import torch
import transformers

from replica.api import FinishReason, SamplingParams
from replica.config import PoolConfig
from replica.engine.engine import Engine
from replica.generation import GenerationDefaults
from replica.model import ByteTokenizer, load_model
from replica.model.tokenizer import TextStream
from tests.support.bpe_peer import (
    CORPUS,
    first_new_at,
    save_bpe_peer,
    stop_across_tokens,
    with_generation_config,
)
from tests.support.engine import close_and_check, make_checkpoint_engine, make_engine
from tests.support.hf_peer import VOCAB, hf_greedy

PROMPT = "hello there, how are"
NEW = 14
POOLS = PoolConfig(max_sessions=4, kv_tokens=1024, max_context=256, page_size=16)


@pytest.fixture(scope="module")
def peer(tmp_path_factory):
    """(transformers model, checkpoint dir)."""
    path = tmp_path_factory.mktemp("gen-peer")
    return save_bpe_peer(path, seed=7), str(path)


def turn(engine: Engine, sid: str, ids: list[int], sampling: SamplingParams):
    """One turn to its end: (tokens, streamed text, finish reason, committed tokens)."""
    req = engine.submit(sid, ids, sampling)
    tokens, text = [], []
    for _ in range(10_000):
        for event in engine.step():
            if event.turn_id != req.rid:
                continue
            assert event.error_code is None, event.error
            tokens += event.token_ids
            text.append(event.text)
            if event.finished:
                return tokens, "".join(text), event.finish_reason, event.committed_tokens
    raise AssertionError("the turn did not end")


@pytest.fixture(scope="module")
def greedy_run(peer):
    """The prompt's ids and transformers' greedy tokens after it (no EOS: the peer has none)."""
    hf, path = peer
    prompt = load_model(path)[2].encode(PROMPT)
    return prompt, hf_greedy(hf, prompt, NEW, until_eos=True)


def test_the_models_eos_ends_the_turn_where_generate_stops(peer, greedy_run, tmp_path):
    hf, path = peer
    prompt, tokens = greedy_run
    k = first_new_at(tokens, 4)
    unused = next(t for t in range(VOCAB) if t not in tokens)
    ckpt = with_generation_config(path, tmp_path / "eos", {"eos_token_id": [unused, tokens[k]]})
    reference = transformers.AutoModelForCausalLM.from_pretrained(ckpt).eval()
    expected = hf_greedy(reference, prompt, NEW, until_eos=True)
    assert expected == tokens[: k + 1]  # transformers stops at the EOS and returns it

    engine = make_checkpoint_engine(ckpt, POOLS)
    tok = engine.tokenizer
    engine.open_session("s")
    got, text, reason, committed = turn(engine, "s", prompt, SamplingParams(max_new_tokens=NEW))
    assert (got, reason, committed) == (expected, FinishReason.STOP, len(prompt) + k + 1)
    assert text == tok.decode(expected[:-1])  # the EOS's text is not streamed
    # the EOS is in the state: the next turn continues from prompt + reply (EOS included)
    follow = tok.encode(" the session")
    want = hf_greedy(hf, prompt + expected + follow, 6, until_eos=True)
    sampling = SamplingParams(max_new_tokens=6, ignore_eos=True)
    assert turn(engine, "s", follow, sampling)[0] == want

    # ignore_eos: the same turn runs on to max_new_tokens, through the EOS
    engine.open_session("t")
    sampling = SamplingParams(max_new_tokens=NEW, ignore_eos=True)
    got, text, reason, committed = turn(engine, "t", prompt, sampling)
    assert (got, reason, committed) == (tokens, FinishReason.LENGTH, len(prompt) + NEW)
    assert text == tok.decode(tokens)
    close_and_check(engine)


def test_defaults_come_from_generation_config(peer, greedy_run, tmp_path):
    hf, path = peer
    prompt, tokens = greedy_run
    config = {"do_sample": True, "temperature": 0.7, "top_p": 0.9, "top_k": 5,
              "max_new_tokens": 9, "eos_token_id": 3}  # fmt: skip
    ckpt = with_generation_config(path, tmp_path / "defaults", config)
    theirs = transformers.GenerationConfig.from_pretrained(ckpt)
    ours = GenerationDefaults.from_checkpoint(ckpt)
    assert ours == GenerationDefaults(
        eos_token_ids=(theirs.eos_token_id,),
        temperature=theirs.temperature,
        top_p=theirs.top_p,
        top_k=theirs.top_k,
        max_new_tokens=theirs.max_new_tokens,
    )
    engine = make_checkpoint_engine(ckpt, POOLS)
    engine.open_session("s")
    resolved = engine.submit("s", prompt, SamplingParams(seed=1)).sampling
    assert (resolved.max_new_tokens, resolved.temperature, resolved.top_p, resolved.top_k) == (
        9, 0.7, 0.9, 5)  # fmt: skip
    assert resolved.eos_token_ids == (3,) and not resolved.greedy
    engine.interrupt("s")
    drain_all(engine)
    # what a request sets wins: greedy, top_k off, its own length
    engine.open_session("g")
    sampling = SamplingParams(max_new_tokens=NEW, temperature=0.0, top_k=0, ignore_eos=True)
    assert turn(engine, "g", prompt, sampling)[0] == tokens
    close_and_check(engine)

    # max_length counts the whole context; without the file, config.json's eos is the EOS
    ckpt = with_generation_config(path, tmp_path / "length", {"max_length": len(prompt) + 5})
    engine = make_checkpoint_engine(ckpt, POOLS)
    engine.open_session("s")
    got, _, reason, committed = turn(engine, "s", prompt, SamplingParams())
    assert (got, reason, committed) == (tokens[:5], FinishReason.LENGTH, len(prompt) + 5)
    close_and_check(engine)
    # a default longer than the context has room for is cut to the room (never an overflow)
    ckpt = with_generation_config(path, tmp_path / "long", {"max_new_tokens": 100_000})
    engine = make_checkpoint_engine(ckpt, POOLS)
    engine.open_session("s")
    resolved = engine.submit("s", prompt, SamplingParams()).sampling
    assert resolved.max_new_tokens == POOLS.max_context - len(prompt)
    engine.interrupt("s")
    drain_all(engine)
    close_and_check(engine)
    bare = tmp_path / "bare"
    shutil.copytree(path, bare)
    (bare / "generation_config.json").unlink(missing_ok=True)
    hf_config = json.loads((bare / "config.json").read_text())
    (bare / "config.json").write_text(json.dumps({**hf_config, "eos_token_id": tokens[2]}))
    assert GenerationDefaults.from_checkpoint(str(bare)).eos_token_ids == (tokens[2],)
    # the built-in models: no checkpoint, no EOS, 16 greedy tokens as before
    builtin = make_engine(POOLS)
    builtin.open_session("b")
    resolved = builtin.submit("b", [1, 2, 3], SamplingParams()).sampling
    assert (resolved.max_new_tokens, resolved.greedy, resolved.eos_token_ids) == (16, True, ())
    drain_all(builtin)
    close_and_check(builtin)


def drain_all(engine: Engine) -> None:
    while engine.has_work:
        engine.step()
    engine.take_events()


def test_stop_strings_split_across_tokens(peer, greedy_run):
    hf, path = peer
    prompt, _ = greedy_run
    tokens = hf_greedy(hf, prompt, 48, until_eos=True)
    engine = make_checkpoint_engine(path, POOLS)
    tok = engine.tokenizer
    full = tok.decode(tokens)
    j, stop = stop_across_tokens(tok, tokens)
    engine.open_session("s")
    sampling = SamplingParams(max_new_tokens=48, stop=("never there", stop))
    got, text, reason, committed = turn(engine, "s", prompt, sampling)
    assert (got, reason, committed) == (tokens[: j + 2], FinishReason.STOP, len(prompt) + j + 2)
    assert text == full[: full.find(stop)] and stop not in text
    # the state holds exactly the tokens up to the one that completed the match
    follow = tok.encode(" the session")
    want = hf_greedy(hf, prompt + tokens[: j + 2] + follow, 5, until_eos=True)
    assert turn(engine, "s", follow, SamplingParams(max_new_tokens=5))[0] == want
    # a stop string that never comes: nothing is held back at the end
    engine.open_session("t")
    got, text, reason, _ = turn(engine, "t", prompt, SamplingParams(48, stop=(full + "x",)))
    assert (got, text, reason) == (tokens, full, FinishReason.LENGTH)
    close_and_check(engine)


def test_top_k(peer, greedy_run):
    hf, path = peer
    prompt, tokens = greedy_run
    engine = make_checkpoint_engine(path, POOLS)
    engine.open_session("g")
    hot = SamplingParams(max_new_tokens=NEW, temperature=5.0, top_k=1, seed=11)
    assert turn(engine, "g", prompt, hot)[0] == tokens  # top_k 1 is greedy at any temperature
    runs = []
    for sid in ("a", "b"):
        engine.open_session(sid)
        runs.append(turn(engine, sid, prompt, SamplingParams(NEW, 5.0, seed=11, top_k=2))[0])
    assert runs[0] == runs[1]  # seeded: reproducible
    context = list(prompt)
    with torch.no_grad():
        for token in runs[0]:
            logits = hf(torch.tensor([context])).logits[0, -1]
            assert token in logits.topk(2).indices.tolist()
            context.append(token)
    assert runs[0] != tokens[: len(runs[0])]  # at temperature 5 it did sample
    close_and_check(engine)


def test_text_in_and_out_equal_transformers_tokenizer(peer):
    _, path = peer
    theirs = transformers.AutoTokenizer.from_pretrained(path)
    ours = load_model(path)[2]
    for text in CORPUS[:4] + ["naïve 🙂 café — très ✓ tokens"]:
        ids = ours.encode(text)
        assert ids == theirs.encode(text, add_special_tokens=False)
    rng = random.Random(0)
    for _ in range(200):  # any ids, UTF-8 split across tokens and special ids included
        ids = [rng.randrange(ours.vocab_size) for _ in range(rng.randrange(1, 24))]
        stream = TextStream(ours)
        pieces = [stream.push(i) for i in ids]
        assert "".join(pieces) + stream.flush() == theirs.decode(ids, skip_special_tokens=True)
    # the byte tokenizer of the built-in models: as Python decodes the bytes
    byte = ByteTokenizer(300)
    for _ in range(200):
        ids = [rng.choice([rng.randrange(300), *"é🙂✓".encode()]) for _ in range(24)]
        stream = TextStream(byte)
        text = "".join(stream.push(i) for i in ids) + stream.flush()
        assert text == bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")
