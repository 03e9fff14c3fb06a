"""Barge-in on the Realtime WebSocket: how fast a cancel lands and the next response starts.

A few sockets at once (``SOCKETS``), each through the ``openai`` SDK's async
``client.realtime.connect`` on a chat checkpoint whose replies run to their length: a user
message and a long ``response.create``; after its second delta ``response.cancel`` is sent, and
the time to its ``response.done`` (status cancelled, the turn interrupted on the replica, its
tokens kept) is the cancel latency; then a new message and ``response.create`` are sent, and
the time to the first delta of that response (render-diff on a replica, a fork of the session
for its rollback, the new tokens prefilled, the first token) is the restart latency. That
response is the next round's long one. The clients share this process's event loop with the
gateway (what a client adds is in the figures). Goals: cancel p50 < 50 ms, restart p50 < 100 ms
on a 2-core box.

Run: ``python -m bench.realtime_bargein [--quick]``.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import openai

from bench.harness import cli
from bench.harness.cluster import local_cluster
from bench.harness.report import Goal, Table, number, print_goals
from bench.harness.stats import Spread, p50, p99
from tests.support.chat_peer import save_long_reply_peer

SOCKETS = 4
LONG = 400
GOAL_CANCEL_MS, GOAL_RESTART_MS = 50.0, 100.0


def message(text: str) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


async def until(conn, kind: str):
    async for event in conn:
        if event.type == "error":
            raise RuntimeError(event.error.message)
        if event.type == kind:
            return event
    raise RuntimeError("the socket closed")


async def one_socket(client: openai.AsyncOpenAI, model: str, rounds: int) -> tuple[list, list]:
    cancels, restarts = [], []
    async with client.realtime.connect(model=model) as conn:
        await until(conn, "session.created")
        await conn.session.update(session={"type": "realtime", "max_output_tokens": LONG})
        await conn.conversation.item.create(item=message("tell me a story"))
        await conn.response.create()
        for i in range(rounds):
            await until(conn, "response.output_text.delta")
            await until(conn, "response.output_text.delta")
            sent = time.perf_counter()
            await conn.response.cancel()
            done = await until(conn, "response.done")
            cancels.append((time.perf_counter() - sent) * 1000)
            assert done.response.status == "cancelled", done.response.status
            sent = time.perf_counter()
            await conn.conversation.item.create(item=message(f"and then {i}?"))
            await conn.response.create()
            await until(conn, "response.output_text.delta")
            restarts.append((time.perf_counter() - sent) * 1000)
        await conn.response.cancel()
        await until(conn, "response.done")
    return cancels, restarts


async def measure(args: argparse.Namespace) -> list[Goal]:
    rounds = 5 if args.quick else 15
    with tempfile.TemporaryDirectory() as path:
        save_long_reply_peer(Path(path))
        flags = dict(model_path=path, replicas=1, threads=1, max_sessions=64,
                     kv_tokens=64 * 1024, max_context=2048, page_size=16)  # fmt: skip
        async with local_cluster(**flags) as cluster:
            client = openai.AsyncOpenAI(
                base_url=cluster.server.front.http_url, api_key="unused", max_retries=0
            )
            model = (await client.models.list()).data[0].id
            cancel_p50s, restart_p50s, cancels, restarts = [], [], [], []
            for _ in range(args.repeats):
                runs = await asyncio.gather(
                    *(one_socket(client, model, rounds) for _ in range(SOCKETS))
                )
                rep_c = [v for c, _ in runs for v in c]
                rep_r = [v for _, r in runs for v in r]
                cancel_p50s.append(p50(rep_c))
                restart_p50s.append(p50(rep_r))
                cancels += rep_c
                restarts += rep_r
    print(f"\nRealtime barge-in, {SOCKETS} sockets at once, {rounds} rounds each per repetition")
    table = Table("from -> to", "p50 ms", "p99 ms", "samples")
    table.add("response.cancel -> response.done", Spread.of(cancel_p50s).format(),
              number(p99(cancels)), len(cancels))  # fmt: skip
    table.add("response.create -> first delta", Spread.of(restart_p50s).format(),
              number(p99(restarts)), len(restarts))  # fmt: skip
    table.print()
    print("  p50: median (min–max) over repetitions; p99 pooled over them")
    return [
        Goal("cancel -> response.done, p50", Spread.of(cancel_p50s), GOAL_CANCEL_MS, False, " ms"),
        Goal(
            "next response -> first delta, p50",
            Spread.of(restart_p50s),
            GOAL_RESTART_MS,
            False,
            " ms",
        ),  # fmt: skip
    ]


def main() -> None:
    args = cli.parse(cli.parser(__doc__))
    t0 = time.perf_counter()
    print_goals(asyncio.run(measure(args)))
    print(f"\ntotal run time {time.perf_counter() - t0:.0f}s")


if __name__ == "__main__":
    main()
