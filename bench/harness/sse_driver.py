"""Token rounds over the OpenAI-compatible API: concurrent streamed completions (SSE) from a
client in a child process (``ClientProcess`` with ``connect=SseClient``), counted from the
streams' ``usage`` chunks."""

from __future__ import annotations

import asyncio
import json
import time

import httpx2 as httpx

from bench.harness.workload import TokenRounds

PROMPT = [11, 12, 13, 14, 15, 16, 17, 18]


class SseClient:
    """An HTTP/1.1 client of one base URL, with enough connections for every stream."""

    def __init__(self, base_url: str) -> None:
        limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
        self.http = httpx.AsyncClient(base_url=base_url, limits=limits, timeout=120)
        self.model: str | None = None

    async def close(self) -> None:
        await self.http.aclose()


async def _completion(client: SseClient, new_tokens: int) -> int:
    body = {"model": client.model, "prompt": PROMPT, "max_tokens": new_tokens, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": True}  # fmt: skip
    tokens = 0
    async with client.http.stream("POST", "/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if line.startswith("data: {") and '"usage"' in line:
                tokens = json.loads(line[6:])["usage"]["completion_tokens"]
    return tokens


async def run_sse_rounds(
    client: SseClient, sessions: int, new_tokens: int, rounds: int
) -> TokenRounds:
    if client.model is None:
        client.model = (await client.http.get("/models")).json()["data"][0]["id"]
    result = TokenRounds()
    for _ in range(rounds):
        t0 = time.perf_counter()
        counts = await asyncio.gather(*(_completion(client, new_tokens) for _ in range(sessions)))
        result.rounds.append((sum(counts), time.perf_counter() - t0))
    return result
