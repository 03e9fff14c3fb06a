"""``CheckpointFiles``: session checkpoints on a volume that outlives pods (``--checkpoint-dir``).

A replica's checkpoint store writes every part of each session's chain (``CheckpointChain``: a
whole state, then deltas) as one file, ``<dir>/<replica id>/<session>/<seq>-<0|1>.ckpt`` (the
part's sequence number in the store; 1: a whole folded from the parts up to that number), to a
temporary name then renamed, so a reader sees whole files only; a whole state removes the
session's files before it once it is written, a release removes the session's directory. When a
replica dies and its store cannot answer (it died too, or the node that held both), the
failover reads the session's files: the last whole state and the deltas after it, folded.

The file format (``FILE_FORMAT``) is versioned and checksummed, and never unpickled: the magic
``SRCKPT`` and the format number, a JSON header (the record's state format, model fingerprint,
dtypes, the session's meta, each array's shape), the raw array bytes, and the SHA-256 of all of
that. A file that is truncated, altered, of another format or not a checkpoint at all is refused
with ``CheckpointFileError`` saying which and why; it is never loaded. Torch-free (numpy only).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import struct
from dataclasses import asdict
from pathlib import Path

import numpy as np

from replica.api import SessionMeta, SessionStates
from replica.checkpoints.chain import BrokenChainError, fold

log = logging.getLogger(__name__)

FILE_FORMAT = 1
MAGIC = b"SRCKPT" + struct.pack("<H", FILE_FORMAT)
_DIGEST = 32  # SHA-256
_SUFFIX = ".ckpt"


class CheckpointFileError(ValueError):
    """A checkpoint file that cannot be trusted: refused, never loaded."""


def encode(record: SessionStates) -> bytes:
    """One file's bytes for ``record`` (one session's whole state or delta)."""
    arrays = (record.conv, record.ssm, record.k, record.v)
    header = json.dumps(
        {
            "state_format": record.format,
            "model": record.model,
            "state_dtype": record.state_dtype,
            "kv_dtype": record.kv_dtype,
            "sessions": [asdict(meta) for meta in record.sessions],
            "shapes": [list(a.shape) for a in arrays],
        }
    ).encode()
    body = b"".join([MAGIC, struct.pack("<I", len(header)), header, *(a.tobytes() for a in arrays)])
    return body + hashlib.sha256(body).digest()


def decode(data: bytes, source: str = "checkpoint") -> SessionStates:
    """The record in a file's bytes ``data``; ``CheckpointFileError`` when it is not one."""
    if not data.startswith(MAGIC[:6]):
        raise CheckpointFileError(f"{source} is not a session-router checkpoint file")
    if not data.startswith(MAGIC):
        version = struct.unpack("<H", data[6:8])[0] if len(data) >= 8 else "?"
        raise CheckpointFileError(
            f"{source} is of checkpoint file format {version}; this version reads {FILE_FORMAT}"
        )
    body, digest = data[:-_DIGEST], data[-_DIGEST:]
    if len(data) < len(MAGIC) + 4 + _DIGEST or hashlib.sha256(body).digest() != digest:
        raise CheckpointFileError(f"{source} fails its checksum: it is truncated or altered")
    try:
        return _record(body)
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointFileError(f"{source} is malformed: {exc}") from exc


def _record(body: bytes) -> SessionStates:
    (size,) = struct.unpack_from("<I", body, len(MAGIC))
    start = len(MAGIC) + 4
    header = json.loads(body[start : start + size])
    offset, arrays = start + size, []
    for shape in header["shapes"]:
        n = int(np.prod(shape))
        arrays.append(np.frombuffer(body, np.uint8, n, offset).reshape(shape))
        offset += n
    if offset != len(body):
        raise ValueError("its arrays do not fill it")
    sessions = tuple(
        SessionMeta(**{**m, "pending_ids": tuple(m["pending_ids"])}) for m in header["sessions"]
    )
    return SessionStates(
        header["state_format"],
        header["model"],
        header["state_dtype"],
        header["kv_dtype"],
        sessions,
        *arrays,
    )


class CheckpointFiles:
    """One replica's checkpoint files under ``root``. Used from one thread at a time."""

    def __init__(self, root: str | Path, replica_id: str) -> None:
        self.dir = Path(root) / replica_id

    def _session_dir(self, session_id: str) -> Path:
        # ids come from clients too: a digest keeps every name a plain file name
        return self.dir / hashlib.sha256(session_id.encode()).hexdigest()[:32]

    def write(self, record: SessionStates, seq: int, folded: bool = False) -> None:
        """Write part ``seq`` of a session's chain (``folded``: the whole state of its parts up
        to ``seq``); a whole state removes the files before it."""
        meta = record.sessions[0]
        where = self._session_dir(meta.session_id)
        where.mkdir(parents=True, exist_ok=True)
        path = where / f"{seq:020d}-{int(folded)}{_SUFFIX}"
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(encode(record))
        os.replace(tmp, path)
        if not meta.kv_from:
            for older in where.glob(f"*{_SUFFIX}"):
                if older.name < path.name:
                    older.unlink(missing_ok=True)

    def drop(self, session_ids: tuple[str, ...] | list[str]) -> None:
        for session_id in session_ids:
            shutil.rmtree(self._session_dir(session_id), ignore_errors=True)

    def remove(self) -> None:
        """Every file of the replica (its sessions were restored elsewhere, or released)."""
        shutil.rmtree(self.dir, ignore_errors=True)

    def load(self, session_id: str) -> SessionStates | None:
        """The session's whole state from its files (None: it has none); raises
        ``CheckpointFileError`` when a file it needs is not to be trusted."""
        paths = sorted(self._session_dir(session_id).glob(f"*{_SUFFIX}"))
        records = []
        for path in paths:
            record = decode(path.read_bytes(), str(path))
            if record.sessions[0].session_id != session_id:
                raise CheckpointFileError(f"{path} holds session {record.sessions[0].session_id}")
            if not record.sessions[0].kv_from:
                records = []  # a whole state: what came before it is superseded
            records.append(record)
        if not records:
            return None
        try:
            return fold(records) if len(records) > 1 else records[0]
        except BrokenChainError as exc:
            raise CheckpointFileError(f"the files of session {session_id}: {exc}") from exc

    def load_all(self, session_ids: list[str]) -> dict[str, SessionStates]:
        """Those of ``session_ids`` with files that load; a refused one is logged and left out
        (its session is not restored from a state that cannot be trusted)."""
        found = {}
        for session_id in session_ids:
            try:
                record = self.load(session_id)
            except (CheckpointFileError, OSError) as exc:  # untrusted, or the volume failed
                log.error("checkpoint of %s refused: %s", session_id, exc)
                continue
            if record is not None:
                found[session_id] = record
        return found
