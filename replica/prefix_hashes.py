"""Chained hashes of a token sequence's whole blocks, as vLLM's block hashes: what a replica's
snapshot says about the states it has cached, and what placement compares an open's prefix with.

Hash ``i`` covers tokens ``0 .. (i + 1) * block - 1`` (it chains hash ``i - 1`` with block ``i``),
so two sequences share hash ``i`` exactly when (up to collisions of a 64-bit hash) they share
their first ``i + 1`` blocks. A block is a whole number of KV pages (page-aligned boundaries).
Torch-free: gateways and the router compute them too. Stable across processes (blake2b, never
Python's ``hash``).
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence

ROUTING_BLOCK_TOKENS = 64  # at least this many tokens per hash, rounded up to whole pages


def block_tokens(page_size: int) -> int:
    """Tokens per hashed block on a replica with ``page_size``: whole pages, >= 64 tokens."""
    return -(-ROUTING_BLOCK_TOKENS // page_size) * page_size


def chained_block_hashes(ids: Sequence[int], block: int, limit: int | None = None) -> list[int]:
    """The hashes of ``ids``' whole blocks of ``block`` tokens, the first ``limit`` at most."""
    count = len(ids) // block if limit is None else min(len(ids) // block, limit)
    hashes, prev = [], b""
    for i in range(count):
        chunk = array("q", ids[i * block : (i + 1) * block]).tobytes()
        prev = hashlib.blake2b(prev + chunk, digest_size=8).digest()
        hashes.append(int.from_bytes(prev, "little"))
    return hashes
