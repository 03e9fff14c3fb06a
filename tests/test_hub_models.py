"""``serve --model ORG/NAME``: a hub id found in a Hugging Face cache (``HF_HOME``) offline.

The cache is laid out here as ``huggingface_hub`` lays it out (``hub/models--ORG--NAME`` with
``blobs/``, ``snapshots/REV/`` linking to them and ``refs/main`` naming REV), holding a tiny
transformers Bamba saved with ``save_pretrained``. serve runs as a user runs it: a subprocess
with ``HF_HUB_OFFLINE=1`` and no inherited ``RAY_*`` variables. The streamed tokens are
transformers' greedy ``generate`` on the same checkpoint.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess

import pytest

from replica.model.source import ModelNotFoundError, resolve
from router.client import SessionClient
from tests.support.hf_peer import hf_greedy, tiny_hf_bamba
from tests.support.serve_process import ServeProcess, kill_session, spawn, tail

REPO_ID = "acme-labs/bamba-tiny"
REVISION = "3f1b2c4d5e6f708192a3b4c5d6e7f8091a2b3c4d"


def hub_cache(home, repo_id: str, checkpoint) -> str:
    """Put the files of ``checkpoint`` into ``home``'s hub cache as ``repo_id`` at REVISION;
    returns the snapshot directory."""
    repo = home / "hub" / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / REVISION
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REVISION)
    for file in sorted(checkpoint.iterdir()):
        data = file.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / file.name).symlink_to(os.path.relpath(blob, snapshot))
    return str(snapshot)


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory):
    saved = tmp_path_factory.mktemp("saved")
    tiny_hf_bamba(seed=5).save_pretrained(str(saved))
    home = tmp_path_factory.mktemp("hf-home")
    hub_cache(home, REPO_ID, saved)
    return home


def offline(home) -> dict[str, str]:
    return {"HF_HOME": str(home), "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(home / "hub")}


def test_resolve_finds_the_cached_snapshot(hf_home, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hf_home / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    source = resolve(REPO_ID, frozenset({"tiny-bamba"}))
    assert source.path.endswith(f"models--acme-labs--bamba-tiny/snapshots/{REVISION}")
    assert resolve("tiny-bamba", frozenset({"tiny-bamba"})).builtin == "tiny-bamba"
    with pytest.raises(ModelNotFoundError) as err:
        resolve(REPO_ID, frozenset(), revision="v9")
    assert REPO_ID in str(err.value) and str(hf_home / "hub") in str(err.value)


def test_serve_loads_a_hub_id_from_the_cache(hf_home, tmp_path):
    serve = ServeProcess.start(
        tmp_path / "serve.log",
        ["--model", REPO_ID, "--replicas", "1", "--max-sessions", "4", "--kv-tokens", "1024"],
        env=offline(hf_home),
        ready_timeout=180,
    )
    try:
        prompt = [5, 17, 42, 99, 3, 250, 8]
        with SessionClient(serve.grpc_address) as client, client.open(timeout=30) as session:
            ids, _, _ = session.complete(tokens=prompt, max_new_tokens=10, timeout=60)
        assert ids == hf_greedy(tiny_hf_bamba(seed=5), prompt, 10)
        assert f"({REPO_ID})" in tail(serve.log)
    finally:
        code = serve.stop()
    assert code == 0, tail(serve.log)


def test_serve_names_a_missing_id_and_the_cache(hf_home, tmp_path):
    log = tmp_path / "serve.log"
    missing = "acme-labs/no-such-model"
    proc = spawn(log, ["--model", missing, "--replicas", "1"], offline(hf_home))
    try:
        code = proc.wait(timeout=180)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        kill_session(proc.pid)
    out = log.read_text(errors="replace")
    assert code == 1, out
    said = re.search(r"^session-router: replica-\d+ did not start: (.*)$", out, re.M)
    assert said, out  # one line of its own (Ray forwards the replica's traceback as well)
    assert said[1].startswith(f"ModelNotFoundError: hub id {missing!r}: looked in the cache ")
    assert str(hf_home / "hub") in said[1] and "HF_HUB_OFFLINE" in said[1], said[1]
