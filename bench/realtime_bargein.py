"""Barge-in on the Realtime WebSocket: how fast a cancel lands and the next response starts.

``--sockets`` sockets at once (default 32), each through the ``openai`` SDK's async
``client.realtime.connect`` on a chat checkpoint whose replies run to their length: a user
message and a long ``response.create``; after its second delta ``response.cancel`` is sent, and
the time to its ``response.done`` (status cancelled, the turn interrupted on the replica, its
tokens kept) is the cancel latency; then a new message and ``response.create`` are sent, and
the time to the first delta of that response (render-diff on a replica, a fork of the session
for its rollback, the new tokens prefilled, the first token) is the restart latency. That
response is the next round's long one. The clients share this process's event loop with the
gateway (what a client adds is in the figures).

The yardstick is the engine step at the same batch, measured two ways: in the run, the time
between a response's first two deltas (one decode step of the whole batch as a socket sees it),
and directly, one decode-only step of an in-process engine built as the replica is, with as
many sessions (``bench.realtime_steps``). Each latency is also printed divided by the step,
and beside them how late the shared event loop wakes a 10 ms sleep (the wait every hop through
the gateway pays on top of its own work) and the round trip of an actor call that does no work
(``ping``) from the gateway's process to the replica, sampled through the run: the floor of
each hop a cancel (one call, then the turn's end on the output stream) or a restart (the
prompt rendered in the fork-and-submit) makes. Two more floors (``bench.realtime_floors``): an
actor that answers a call and puts an item of a turn's end's shape on a long-lived stream, no
engine (a cancel's replica hops and nothing else), and a WebSocket round trip through the
gateway that no replica answers (``conversation.item.retrieve``). Goal: both latencies under 2
engine steps at p50.

Run: ``python -m bench.realtime_bargein [--quick] [--sockets N] [--no-checkpoints]``
(``--no-checkpoints``: without session checkpoints, so a turn's last chunk is not held until
its checkpoint is stored: what that hold adds to a cancel).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import tempfile
import time
from pathlib import Path

import openai

from bench.harness import cli
from bench.harness.cluster import local_cluster
from bench.harness.report import Goal, Table, number, print_goals
from bench.harness.stats import Spread, p50, p99
from bench.realtime_floors import echo_floor, ws_round_trip
from bench.realtime_steps import direct_decode_step_ms
from replica.actor.client import ReplicaClient
from tests.support.chat_peer import save_long_reply_peer

SOCKETS = 32
LONG = 400
GOAL_STEPS = 2.0


@dataclasses.dataclass
class Samples:
    """One socket's (or all sockets') milliseconds: cancel -> done, create -> first delta, and
    the gap between a response's first two deltas (one engine step as the socket sees it)."""

    cancels: list[float] = dataclasses.field(default_factory=list)
    restarts: list[float] = dataclasses.field(default_factory=list)
    steps: list[float] = dataclasses.field(default_factory=list)
    lags: list[float] = dataclasses.field(default_factory=list)
    pings: list[float] = dataclasses.field(default_factory=list)
    echo_calls: list[float] = dataclasses.field(default_factory=list)
    echo_items: list[float] = dataclasses.field(default_factory=list)
    ws: list[float] = dataclasses.field(default_factory=list)

    def extend(self, other: Samples) -> None:
        for field in dataclasses.fields(self):
            getattr(self, field.name).extend(getattr(other, field.name))


async def loop_lag(lags: list[float], tick_s: float = 0.01) -> None:
    """How late the event loop wakes a 10 ms sleep (ms), until cancelled: what every callback
    of the gateway (and of the clients, which share its loop) waits on top of its own work."""
    loop = asyncio.get_running_loop()
    while True:
        start = loop.time()
        await asyncio.sleep(tick_s)
        lags.append((loop.time() - start - tick_s) * 1000)


async def actor_pings(replica: ReplicaClient, pings: list[float], tick_s: float = 0.02) -> None:
    """The round trip of an actor call that does no work (``ping``) from the gateway's process
    to the replica (ms), every ``tick_s``, until cancelled: the floor of every hop a cancel or
    a restart makes to the replica, in the same run."""
    while True:
        start = time.perf_counter()
        await replica.ping()
        pings.append((time.perf_counter() - start) * 1000)
        await asyncio.sleep(tick_s)


def message(text: str) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


async def until(conn, kind: str):
    async for event in conn:
        if event.type == "error":
            raise RuntimeError(event.error.message)
        if event.type == kind:
            return event
    raise RuntimeError("the socket closed")


async def one_socket(client: openai.AsyncOpenAI, model: str, rounds: int) -> Samples:
    samples = Samples()
    async with client.realtime.connect(model=model) as conn:
        await until(conn, "session.created")
        await conn.session.update(session={"type": "realtime", "max_output_tokens": LONG})
        await conn.conversation.item.create(item=message("tell me a story"))
        await conn.response.create()
        for i in range(rounds):
            await until(conn, "response.output_text.delta")
            first = time.perf_counter()
            await until(conn, "response.output_text.delta")
            sent = time.perf_counter()
            samples.steps.append((sent - first) * 1000)
            await conn.response.cancel()
            done = await until(conn, "response.done")
            samples.cancels.append((time.perf_counter() - sent) * 1000)
            assert done.response.status == "cancelled", done.response.status
            if done.response.output:  # the cut reply: retrieved, a round trip of the socket alone
                samples.ws.append(await ws_round_trip(conn, done.response.output[0].id))
            sent = time.perf_counter()
            await conn.conversation.item.create(item=message(f"and then {i}?"))
            await conn.response.create()
            await until(conn, "response.output_text.delta")
            samples.restarts.append((time.perf_counter() - sent) * 1000)
        await conn.response.cancel()
        await until(conn, "response.done")
    return samples


async def measure(args: argparse.Namespace) -> tuple[list[Spread], Samples, float]:
    """Per repetition the p50s (cancel, restart, in-run step), all samples pooled, and the
    direct engine step (ms) at the same batch."""
    rounds = 5 if args.quick else 15
    p50s: list[list[float]] = [[], [], []]
    pooled = Samples()
    with tempfile.TemporaryDirectory() as path:
        save_long_reply_peer(Path(path))
        sessions = args.replica_sessions or 2 * args.sockets + 16
        flags = dict(model_path=path, replicas=1, threads=1, max_sessions=sessions,
                     kv_tokens=64 * 1024, max_context=2048, page_size=16,
                     session_checkpoints=not args.no_checkpoints)  # fmt: skip
        async with local_cluster(**flags) as cluster:
            client = openai.AsyncOpenAI(
                base_url=cluster.server.front.http_url, api_key="unused", max_retries=0
            )
            model = (await client.models.list()).data[0].id
            replica = ReplicaClient(cluster.handles[0])
            for _ in range(args.repeats):
                rep = Samples()
                lag = asyncio.ensure_future(loop_lag(rep.lags))
                ping = asyncio.ensure_future(actor_pings(replica, rep.pings))
                echo = asyncio.ensure_future(echo_floor(rep.echo_calls, rep.echo_items))
                runs = await asyncio.gather(
                    *(one_socket(client, model, rounds) for _ in range(args.sockets))
                )
                for task in (lag, ping, echo):
                    task.cancel()
                await asyncio.gather(echo, return_exceptions=True)
                for run in runs:
                    rep.extend(run)
                for i, values in enumerate((rep.cancels, rep.restarts, rep.steps)):
                    p50s[i].append(p50(values))
                pooled.extend(rep)
            config = cluster.replica_config
        step = direct_decode_step_ms(config, args.sockets)
    return [Spread.of(v) for v in p50s], pooled, step


def report(args: argparse.Namespace, spreads: list[Spread], pooled: Samples, step: float):
    cancel, restart, seen_step = spreads
    rounds = 5 if args.quick else 15
    print(f"\nRealtime barge-in, {args.sockets} sockets at once, {rounds} rounds each per "
          "repetition")  # fmt: skip
    table = Table("from -> to", "p50 ms", "p99 ms", "samples", "p50 / step (in run)",
                  "p50 / step (direct)")  # fmt: skip
    for name, spread, values in (
        ("response.cancel -> response.done", cancel, pooled.cancels),
        ("response.create -> first delta", restart, pooled.restarts),
    ):
        in_run, direct = spread.median / seen_step.median, spread.median / step
        table.add(name, spread.format(".1f"), number(p99(values), ".1f"), len(values),
                  number(in_run), number(direct))  # fmt: skip
    table.add("engine step, in the run (delta -> delta)", seen_step.format(".1f"),
              number(p99(pooled.steps), ".1f"), len(pooled.steps), "1.00", "-")  # fmt: skip
    table.add(f"engine step, direct (batch {args.sockets})", number(step, ".1f"), "-", "-", "-",
              "1.00")  # fmt: skip
    table.add("gateway event loop lag (10 ms sleep overshoot)", number(p50(pooled.lags), ".1f"),
              number(p99(pooled.lags), ".1f"), len(pooled.lags), "-", "-")  # fmt: skip
    table.add("actor ping round trip, gateway -> replica", number(p50(pooled.pings), ".1f"),
              number(p99(pooled.pings), ".1f"), len(pooled.pings),
              number(p50(pooled.pings) / seen_step.median), number(p50(pooled.pings) / step),
              )  # fmt: skip
    for name, values in (
        ("floor: actor call, no engine (EchoStream.poke)", pooled.echo_calls),
        ("floor: actor call -> stream item, no engine", pooled.echo_items),
        ("floor: websocket round trip, no replica", pooled.ws),
    ):
        table.add(name, number(p50(values), ".1f"), number(p99(values), ".1f"), len(values),
                  number(p50(values) / seen_step.median), number(p50(values) / step))  # fmt: skip
    table.print()
    print("  p50: median (min–max) over repetitions; p99 pooled over them")
    return [
        Goal(
            "cancel -> response.done, p50, in steps",
            Spread.of([cancel.median / step]),
            GOAL_STEPS,
            False,
            " steps",
        ),  # fmt: skip
        Goal(
            "next response -> first delta, p50, in steps",
            Spread.of([restart.median / step]),
            GOAL_STEPS,
            False,
            " steps",
        ),  # fmt: skip
    ]


def main() -> None:
    p = cli.parser(__doc__)
    p.add_argument("--sockets", type=int, default=SOCKETS, help=f"sockets at once ({SOCKETS})")
    p.add_argument(
        "--max-sessions",
        dest="replica_sessions",
        type=int,
        default=0,
        help="sessions the replica holds (default: room for each socket's two and 16 more; "
        "2 x --sockets: exactly at capacity)",
    )
    p.add_argument(
        "--no-checkpoints",
        action="store_true",
        help="serve without --session-checkpoints: a turn's end is not held for its checkpoint "
        "(what that hold adds to a cancel)",
    )
    args = cli.parse(p)
    t0 = time.perf_counter()
    spreads, pooled, step = asyncio.run(measure(args))
    print_goals(report(args, spreads, pooled, step))
    print(f"\ntotal run time {time.perf_counter() - t0:.0f}s")


if __name__ == "__main__":
    main()
