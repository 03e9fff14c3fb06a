"""Checkpoints on disk (``--checkpoint-dir``): a store writes each part of a session's chain as a
versioned, checksummed file; read back, the files give the session's whole state byte for byte
(the state a plain export takes), after deltas, a fold and a release. A file that is truncated,
altered, of another format version, not a checkpoint, or of another session is refused with a
clear error and never loaded; the other sessions still load.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest

from replica.checkpoints.chain import fold
from replica.checkpoints.files import MAGIC, CheckpointFileError, CheckpointFiles, decode, encode
from replica.config import PoolConfig
from tests.support.engine import close_and_check, greedy, make_engine, run_turn, token_ids


def same(a, b) -> bool:
    return a.sessions == b.sessions and all(
        np.array_equal(x, y) for x, y in zip((a.conv, a.ssm, a.k, a.v), (b.conv, b.ssm, b.k, b.v))
    )


@pytest.fixture(scope="module")
def chains():
    """Two sessions' checkpoints, turn after turn (a whole state, then deltas), and each
    session's whole state after the last turn."""
    engine = make_engine(
        PoolConfig(max_sessions=2, kv_tokens=1024, max_context=256, page_size=16),
        session_checkpoints=True,
    )
    engine.checkpoints.enabled = True  # as when a checkpoint store follows the replica
    parts: dict[str, list] = {"a": [], "b": []}
    for sid in parts:
        engine.open_session(sid)
    for turn in range(4):
        for k, sid in enumerate(parts):
            run_turn(engine, sid, token_ids(5 + turn, 10 * k + turn), greedy(3))
        for record in engine.session_ops.take_checkpoints().saved:
            parts[record.sessions[0].session_id].append(record)
    wholes = {sid: engine.transfer.export([engine.sessions.get(sid)]) for sid in parts}
    close_and_check(engine)
    return parts, wholes


def write(files: CheckpointFiles, records, first_seq: int = 1) -> None:
    for seq, record in enumerate(records, first_seq):
        files.write(record, seq)


def test_the_files_give_the_whole_state_after_deltas_a_fold_and_a_release(chains, tmp_path):
    parts, wholes = chains
    assert [r.sessions[0].kv_from > 0 for r in parts["a"]] == [False, True, True, True]
    files = CheckpointFiles(tmp_path, "replica-0")
    write(files, parts["a"])
    assert same(files.load("a"), wholes["a"])
    assert files.load("b") is None

    # a store folds the first three parts (the last of them was seq 3), then the fourth lands
    write(files, parts["b"][:3])
    files.write(parts["b"][3], 4)
    files.write(fold(parts["b"][:3]), 3, folded=True)
    on_disk = sorted(p.name for p in files._session_dir("b").iterdir())
    assert on_disk == [f"{3:020d}-1.ckpt", f"{4:020d}-0.ckpt"]  # the folded parts are gone
    assert same(files.load("b"), wholes["b"])
    assert set(files.load_all(["a", "b", "c"])) == {"a", "b"}

    files.write(wholes["a"], 9)  # a whole state (a new store's first) replaces the chain
    assert [p.name for p in files._session_dir("a").iterdir()] == [f"{9:020d}-0.ckpt"]
    files.drop(["a"])
    assert files.load("a") is None
    files.remove()
    assert not files.dir.exists()


@pytest.mark.parametrize("damage", ["truncated", "altered", "foreign", "future", "elsewhere"])
def test_an_untrustworthy_file_is_refused_and_never_loaded(chains, tmp_path, damage):
    parts, wholes = chains
    files = CheckpointFiles(tmp_path, "replica-0")
    write(files, parts["a"])
    write(files, parts["b"])
    victim = sorted(files._session_dir("a").iterdir())[-1]
    data = victim.read_bytes()
    if damage == "truncated":
        data = data[: len(data) // 2]
    elif damage == "altered":
        data = data[:100] + bytes([data[100] ^ 1]) + data[101:]
    elif damage == "foreign":
        data = b"\x80\x04" + data[2:]  # a pickle's opening: never unpickled
    elif damage == "future":
        data = MAGIC[:6] + struct.pack("<H", 99) + data[8:]
    else:  # a whole, valid file of another session put in this one's place
        data = encode(parts["b"][0])
    victim.write_bytes(data)
    why = {
        "truncated": "checksum",
        "altered": "checksum",
        "foreign": "not a session-router checkpoint",
        "future": "format 99",
        "elsewhere": "holds session b",
    }[damage]
    with pytest.raises(CheckpointFileError, match=why):
        files.load("a")
    found = files.load_all(["a", "b"])  # the refused session is left out, the other loads
    assert list(found) == ["b"] and same(found["b"], wholes["b"])


def test_a_file_round_trips_bit_for_bit(chains):
    parts, _ = chains
    for record in parts["a"]:
        assert same(decode(encode(record)), record)
