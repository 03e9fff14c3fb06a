"""Router overhead: what the gateway and Ray cost on top of the engine, measured side by side.

One session lifecycle (OpenSession, one turn of 8 new tokens, greedy, CloseSession) three ways in
ONE run, at concurrency 1, 16 and 64 (closed loop: each worker starts a new lifecycle when its
last one ends):

  (a) gateway     AsyncSessionClient over loopback gRPC (in a child process, as a real client
                  would be) -> gateway -> router actor (open, close) -> replica actor
  (b) direct      the same calls straight to the replica actors from this process, with one
                  long-lived ``stream_outputs`` generator per replica kept open as a gateway does
  (c) in-process  the Engine on this thread, stepping until the turn finishes

plus (d) raw async actor calls/s (``ping``, many in flight), the yardstick for lifecycles/s;
(e) tokens/s delivered to gRPC clients, 64 concurrent sessions on ONE replica each generating 64
tokens, vs. the same workload straight on the actor and on the engine in-process (goal: gRPC /
in-process >= 0.8); (f) the gateway's added latency per RPC at p50: GetSession through gRPC vs.
``get_session`` straight on the replica actor (goal < 1 ms).

The in-process engine runs with as many torch threads as each replica gets: 1 by default
(``--threads``; ``--threads 0`` keeps what ``serve`` gives a CPU replica, cpu_count // replicas,
which on a small box makes OpenMP fight the gateway, router and client for the cores).
Run: ``.venv/bin/python bench/router_overhead.py [--quick]``; ``--profile-gateway FILE`` writes a
cProfile of this process (the gateway's event loop) during the gRPC measurements and prints its
top entries.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import itertools
import multiprocessing as mp
import os
import secrets
import time
from collections import Counter
from collections.abc import Awaitable, Callable

PROMPT = [72, 101, 108, 108, 111, 44, 32, 119]  # 8 tokens ("Hello, w" in the byte tokenizer)
LIFECYCLE_TOKENS = 8
CONCURRENCY = (1, 16, 64)
GOAL_TOKENS_RATIO = 0.8
GOAL_ADDED_MS = 1.0

Record = tuple[float, float, float, float, int]  # start, opened, turn done, closed, tokens


# ----- statistics ------------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


class Window:
    """Which lifecycles count: the window opens ``warmup`` seconds after every worker has
    finished its first lifecycle and lasts ``seconds``, or at least two first-lifecycle
    latencies (at most twice ``seconds``), so slow cells still have whole lifecycles."""

    def __init__(self, concurrency: int, seconds: float, warmup: float) -> None:
        self.concurrency, self.seconds, self.warmup = concurrency, seconds, warmup
        self.started = time.perf_counter()
        self.firsts: list[float] = []
        self.lo: float | None = None
        self.hi: float | None = None
        self.data = {
            "n": 0,
            "span": 0.0,
            "lat": [],
            "open": [],
            "turn": [],
            "close": [],
            "tokens": set(),
            "errors": Counter(),
        }

    def running(self) -> bool:
        now = time.perf_counter()
        if self.lo is None and now - self.started > 60:  # workers keep failing: give up
            self._open(now)
        return self.hi is None or now < self.hi

    def _open(self, now: float) -> None:
        span = min(max(self.seconds, 2 * max(self.firsts, default=0.0)), 2 * self.seconds)
        self.lo = now + self.warmup
        self.hi = self.lo + span
        self.data["span"] = span

    def add(self, record: Record, first: bool) -> None:
        t0, t1, t2, t3, tokens = record
        if first:
            self.firsts.append(t3 - t0)
            if len(self.firsts) == self.concurrency and self.lo is None:
                self._open(t3)
        if self.lo is not None and self.lo <= t3 <= self.hi:
            d = self.data
            d["n"] += 1
            d["lat"].append((t3 - t0) * 1e3)
            d["open"].append((t1 - t0) * 1e3)
            d["turn"].append((t2 - t1) * 1e3)
            d["close"].append((t3 - t2) * 1e3)
            d["tokens"].add(tokens)

    def error(self, exc: Exception) -> None:
        self.data["errors"][error_name(exc)] += 1


def merge(results: list[dict]) -> dict:
    """Passes of one cell, pooled: rate over the summed windows, percentiles over all."""
    out = {
        "n": 0,
        "span": 0.0,
        "lat": [],
        "open": [],
        "turn": [],
        "close": [],
        "tokens": set(),
        "errors": Counter(),
    }
    for r in results:
        for key in ("n", "span"):
            out[key] += r[key]
        for key in ("lat", "open", "turn", "close"):
            out[key].extend(r[key])
        out["tokens"] |= set(r["tokens"])
        out["errors"].update(r["errors"])
    lat = out["lat"]
    return {
        "n": out["n"],
        "rate": out["n"] / out["span"] if out["span"] else 0.0,
        "p50": pct(lat, 50),
        "p99": pct(lat, 99),
        "open": pct(out["open"], 50),
        "turn": pct(out["turn"], 50),
        "close": pct(out["close"], 50),
        "tokens": sorted(out["tokens"]),
        "errors": dict(out["errors"]),
    }


async def closed_loop(
    one: Callable[[], Awaitable[Record]], concurrency: int, seconds: float, warmup: float
) -> dict:
    """``concurrency`` workers run ``one`` back to back until the window closes; each finishes
    the lifecycle it is in (so every session is closed)."""
    window = Window(concurrency, seconds, warmup)

    async def worker() -> None:
        first = True
        while window.running():
            try:
                record = await one()
            except Exception as exc:  # noqa: BLE001 - counted and shown in the table
                window.error(exc)
                await asyncio.sleep(0.01)
                continue
            window.add(record, first)
            first = False

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return window.data


def error_name(exc: Exception) -> str:
    code = getattr(exc, "code", None)  # grpc.aio.AioRpcError
    return code().name if callable(code) else str(exc) or type(exc).__name__


# ----- (a) the gRPC client, in a child process --------------------------------------------------


def client_process(conn, address: str) -> None:
    asyncio.run(_client_loop(conn, address))


async def _client_loop(conn, address: str) -> None:
    from router.client import AsyncSessionClient

    client = AsyncSessionClient(address)
    loop = asyncio.get_running_loop()
    handlers = {
        "lifecycles": _gw_lifecycles,
        "tokens": _gw_tokens,
        "rpc": _gw_rpc_latency,
        "close": _gw_close,
    }
    try:
        while True:
            cmd, kwargs = await loop.run_in_executor(None, conn.recv)
            if cmd == "stop":
                break
            try:
                conn.send(("ok", await handlers[cmd](client, **kwargs)))
            except Exception as exc:  # noqa: BLE001 - reported to the parent
                conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        await client.close()


async def _gw_lifecycle(client, max_new_tokens: int) -> Record:
    t0 = time.perf_counter()
    session = await client.open()
    t1 = time.perf_counter()
    tokens = 0
    try:
        async for chunk in client.generate(
            session.session_id, tokens=PROMPT, max_new_tokens=max_new_tokens
        ):
            tokens += len(chunk.token_ids)
    finally:
        t2 = time.perf_counter()
        await client.close_session(session.session_id)
    return t0, t1, t2, time.perf_counter(), tokens


async def _gw_lifecycles(client, concurrency: int, seconds: float, warmup: float) -> dict:
    return await closed_loop(
        lambda: _gw_lifecycle(client, LIFECYCLE_TOKENS), concurrency, seconds, warmup
    )


async def _gw_tokens(client, sessions: int, max_new_tokens: int, rounds: int) -> dict:
    opened = await asyncio.gather(*(client.open() for _ in range(sessions)))

    async def turn(session_id: str) -> int:
        n = 0
        async for chunk in client.generate(
            session_id, tokens=PROMPT, max_new_tokens=max_new_tokens
        ):
            n += len(chunk.token_ids)
        return n

    results = []
    try:
        for _ in range(rounds):
            t0 = time.perf_counter()
            counts = await asyncio.gather(*(turn(s.session_id) for s in opened))
            results.append((sum(counts), time.perf_counter() - t0))
    finally:
        await asyncio.gather(*(client.close_session(s.session_id) for s in opened))
    return {"replicas": sorted({s.replica_id for s in opened}), "rounds": results}


async def _gw_rpc_latency(client, n: int) -> dict:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from protos import session_router_pb2 as pb

    session = await client.open()
    health = health_pb2_grpc.HealthStub(client.channel)
    get_req = pb.GetSessionRequest(session_id=session.session_id)
    health_req = health_pb2.HealthCheckRequest(service="")
    get, check = [], []
    for i in range(n + n // 10):  # the first tenth warms up
        t0 = time.perf_counter()
        await client.sessions.GetSession(get_req, metadata=client.metadata)
        t1 = time.perf_counter()
        await health.Check(health_req)
        t2 = time.perf_counter()
        if i >= n // 10:
            get.append((t1 - t0) * 1e3)
            check.append((t2 - t1) * 1e3)
    return {
        "session_id": session.session_id,
        "replica_id": session.replica_id,
        "get": get,
        "health": check,
    }


async def _gw_close(client, session_id: str) -> bool:
    return await client.close_session(session_id)


class ClientProcess:
    def __init__(self, address: str) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=client_process, args=(child, address), daemon=True)
        self.proc.start()

    async def call(self, cmd: str, **kwargs):
        self.conn.send((cmd, kwargs))
        status, result = await asyncio.get_running_loop().run_in_executor(None, self.conn.recv)
        if status != "ok":
            raise RuntimeError(f"client process: {result}")
        return result

    def stop(self) -> None:
        try:
            self.conn.send(("stop", {}))
        except OSError:
            pass
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.terminate()


# ----- (b) straight to the replica actors -----------------------------------------------------


class DirectGateway:
    """What the gateway does, minus gRPC and the router: one output stream per replica, events
    handed to per-session queues, replicas taken round robin."""

    def __init__(self, handles: list) -> None:
        self.handles = handles
        self.gateway_id = f"bench-direct-{secrets.token_hex(4)}"
        self.inboxes: dict[str, asyncio.Queue] = {}
        self._next = itertools.cycle(range(len(handles)))
        loop = asyncio.get_running_loop()
        self._pumps = [loop.create_task(self._pump(h)) for h in handles]

    async def _pump(self, handle) -> None:
        async for ref in handle.stream_outputs.remote(self.gateway_id):
            for event in await ref:
                inbox = self.inboxes.get(event.session_id)
                if inbox is not None:
                    inbox.put_nowait(event)

    def pick(self):
        return self.handles[next(self._next)]

    async def open(self, handle) -> str:
        from replica.api import ActorError

        session_id = secrets.token_hex(16)
        self.inboxes[session_id] = asyncio.Queue()
        info = await handle.open_session.remote(session_id, 0.0, self.gateway_id)
        if isinstance(info, ActorError):
            self.inboxes.pop(session_id)
            raise RuntimeError(info.code)
        return session_id

    async def turn(self, handle, session_id: str, max_new_tokens: int) -> int:
        from replica.api import ActorError, SamplingParams

        inbox = self.inboxes[session_id]
        turn_id = await handle.submit_turn.remote(
            self.gateway_id, session_id, None, PROMPT, SamplingParams(max_new_tokens=max_new_tokens)
        )
        if isinstance(turn_id, ActorError):
            raise RuntimeError(turn_id.code)
        tokens = 0
        while True:
            event = await inbox.get()
            if event.turn_id != turn_id:
                continue
            if event.error_code is not None:
                raise RuntimeError(event.error_code)
            tokens += len(event.token_ids)
            if event.finished:
                return tokens

    async def close(self, handle, session_id: str) -> None:
        await handle.close_sessions.remote([session_id], "closed")
        self.inboxes.pop(session_id, None)

    async def lifecycle(self) -> Record:
        handle = self.pick()
        t0 = time.perf_counter()
        session_id = await self.open(handle)
        t1 = time.perf_counter()
        try:
            tokens = await self.turn(handle, session_id, LIFECYCLE_TOKENS)
        finally:
            t2 = time.perf_counter()
            await self.close(handle, session_id)
        return t0, t1, t2, time.perf_counter(), tokens

    async def tokens(self, handle, sessions: int, max_new_tokens: int, rounds: int) -> dict:
        ids = await asyncio.gather(*(self.open(handle) for _ in range(sessions)))
        results = []
        try:
            for _ in range(rounds):
                t0 = time.perf_counter()
                counts = await asyncio.gather(*(self.turn(handle, s, max_new_tokens) for s in ids))
                results.append((sum(counts), time.perf_counter() - t0))
        finally:
            await asyncio.gather(*(self.close(handle, s) for s in ids))
        return {"rounds": results}

    def stop(self) -> None:
        for pump in self._pumps:
            pump.cancel()


# ----- (c) the engine in-process ----------------------------------------------------------------


class InProcess:
    def __init__(self, server) -> None:
        from replica.engine.engine import Engine
        from replica.model import load

        cfg = server.config
        _, net, tokenizer = load(cfg.model, cfg.model_path)
        config = dataclasses.replace(server.replica_config, model=net.cfg)
        self.engine = Engine(config, net, tokenizer, "in-process")
        self._ids = itertools.count()

    def _start(self, max_new_tokens: int, session_id: str | None = None) -> str:
        from replica.api import SamplingParams

        if session_id is None:
            session_id = f"inproc-{next(self._ids)}"
            self.engine.open_session(session_id)
        self.engine.submit(session_id, PROMPT, SamplingParams(max_new_tokens=max_new_tokens))
        return session_id

    def lifecycles(self, concurrency: int, seconds: float, warmup: float) -> dict:
        """The same closed loop as (a) and (b), on one thread: open + submit between steps,
        step, close each session whose turn ended and start the next one."""
        eng = self.engine
        window = Window(concurrency, seconds, warmup)
        active: dict[str, list] = {}

        def begin(first: bool) -> None:
            t0 = time.perf_counter()
            session_id = f"inproc-{next(self._ids)}"
            eng.open_session(session_id)
            t1 = time.perf_counter()
            self._start(LIFECYCLE_TOKENS, session_id)
            active[session_id] = [t0, t1, 0, first]

        for _ in range(concurrency):
            begin(True)
        while active:
            if not eng.has_work:
                raise RuntimeError("engine idle with turns outstanding")
            for event in eng.step():
                entry = active.get(event.session_id)
                if entry is None:
                    continue
                if event.error_code is not None:
                    raise RuntimeError(f"{event.error_code}: {event.error}")
                entry[2] += len(event.token_ids)
                if event.finished:
                    t2 = time.perf_counter()
                    eng.close_session(event.session_id)
                    del active[event.session_id]
                    t0, t1, tokens, first = entry
                    window.add((t0, t1, t2, time.perf_counter(), tokens), first)
                    if window.running():
                        begin(False)
        return window.data

    def tokens(self, sessions: int, max_new_tokens: int, rounds: int) -> dict:
        eng = self.engine
        ids = [f"inproc-{next(self._ids)}" for _ in range(sessions)]
        for session_id in ids:
            eng.open_session(session_id)
        results = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            for session_id in ids:
                self._start(max_new_tokens, session_id)
            n = 0
            while eng.has_work:
                n += sum(len(e.token_ids) for e in eng.step())
            results.append((n, time.perf_counter() - t0))
        for session_id in ids:
            eng.close_session(session_id)
        return {"rounds": results}


# ----- (d) raw actor calls ----------------------------------------------------------------------


async def ping_rate(handle, inflight: int, total: int) -> float:
    per_worker = max(1, total // inflight)

    async def worker() -> None:
        for _ in range(per_worker):
            await handle.ping.remote()

    await asyncio.gather(*(handle.ping.remote() for _ in range(inflight)))  # warm up
    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(inflight)))
    return per_worker * inflight / (time.perf_counter() - t0)


async def sequential_ms(call: Callable[[], Awaitable], n: int) -> list[float]:
    samples = []
    for i in range(n + n // 10):
        t0 = time.perf_counter()
        await call()
        if i >= n // 10:
            samples.append((time.perf_counter() - t0) * 1e3)
    return samples


# ----- the run ----------------------------------------------------------------------------------


def rounds_rate(result: dict) -> float:
    measured = result["rounds"][1:] or result["rounds"]  # the first round warms up
    return sum(n for n, _ in measured) / sum(dt for _, dt in measured)


class _CpuCountShim:
    """``os`` as router.ops.serve sees it, with ``cpu_count`` giving ``threads * replicas``."""

    def __init__(self, real, cpus: int) -> None:
        self._real, self._cpus = real, cpus

    def cpu_count(self) -> int:
        return self._cpus

    def __getattr__(self, name: str):
        return getattr(self._real, name)


@contextlib.contextmanager
def replica_threads(threads: int | None, replicas: int):
    """``--threads``: Server gives each CPU replica cpu_count // replicas torch threads; this
    makes it give ``threads`` (router.ops.serve's view of ``os`` only, while it starts)."""
    if not threads:
        yield
        return
    import router.ops.serve as server_module

    real = server_module.os
    server_module.os = _CpuCountShim(real, threads * replicas)
    try:
        yield
    finally:
        server_module.os = real


class CpuMeter:
    """CPU seconds (user + system) of this run's processes, from /proc: this process (the
    gateway and the driver), the gRPC client process, the replica and router actors, and the
    rest of Ray (raylet, GCS, agents, idle workers). Linux only; empty elsewhere."""

    GROUPS = ("gateway", "client", "replica", "router", "ray")

    def __init__(self, client_pid: int) -> None:
        self.client_pid = client_pid
        self.tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def _procs(self) -> dict[int, tuple[int, float]]:
        procs = {}
        for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            procs[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / self.tick)
        return procs

    def sample(self) -> dict[str, float]:
        procs = self._procs()
        children: dict[int, list[int]] = {}
        for pid, (ppid, _) in procs.items():
            children.setdefault(ppid, []).append(pid)
        out = dict.fromkeys(self.GROUPS, 0.0)
        me = os.getpid()
        stack = [me]
        while stack:
            pid = stack.pop()
            stack.extend(children.get(pid, ()))
            if pid not in procs:
                continue
            if pid == me:
                group = "gateway"
            elif pid == self.client_pid:
                group = "client"
            else:
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        cmd = f.read(64)
                except OSError:
                    continue
                group = (
                    "replica"
                    if cmd.startswith(b"ray::ReplicaActor")
                    else "router"
                    if cmd.startswith(b"ray::SessionRouter")
                    else "ray"
                )
            out[group] += procs[pid][1]
        return out

    @staticmethod
    def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
        return {k: after[k] - before[k] for k in before}


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b and a == a and b == b else "-"


def fmt_ms(v: float) -> str:
    return f"{v:8.2f}" if v == v else f"{'-':>8}"


async def run(args) -> None:
    import torch

    from router.ops.serve import ServeConfig, Server

    quick = args.quick
    seconds = args.seconds or (1.5 if quick else 2.5)
    warmup = 0.3 if quick else 0.5
    passes = 1 if quick else 2
    rounds = 2 if quick else 3
    n_rpc = 200 if quick else 500
    # Room for 64 concurrent sessions plus the sessions the router reserves between two
    # snapshots (a closed session frees room only at the replica's next report, ~1 s).
    max_sessions = args.max_sessions
    cfg = ServeConfig(
        replicas=args.replicas,
        max_sessions=max_sessions,
        kv_tokens=max_sessions * 128,
        max_context=512,
        page_size=16,
        grpc_port=0,
        metrics_port=0,
        host="127.0.0.1",
    )
    # what ``Server`` gives each CPU replica, unless --threads says otherwise
    threads = args.threads or max(1, (os.cpu_count() or 1) // cfg.replicas)
    torch.set_num_threads(threads)

    t_start = time.perf_counter()
    server = Server(cfg)
    with replica_threads(args.threads, cfg.replicas):
        await server.start()
    print(
        f"\nstarted {cfg.replicas} replica(s) in {time.perf_counter() - t_start:.1f}s; "
        f"max_sessions={max_sessions}/replica, torch threads per replica and in-process: "
        f"{threads}{'' if args.threads else ' (as serve sets them)'}, cpus: {os.cpu_count()}"
    )
    if threads * cfg.replicas >= (os.cpu_count() or 1):
        print(
            "note: the replicas' torch threads take every core, so the gateway, router, client "
            "and Ray compete with\n      their OpenMP barriers (try --threads 1)"
        )
    load = os.getloadavg()[0]
    if load > (os.cpu_count() or 1):
        print(
            f"note: the machine is busy (load average {load:.1f} on {os.cpu_count()} cpus): "
            "absolute numbers are noisy; the side-by-side ratios less so"
        )
    client = ClientProcess(server.grpc_address)
    handles = [server.replicas[r] for r in sorted(server.replicas)]
    direct = DirectGateway(handles)
    inproc = InProcess(server)
    profiler = None
    if args.profile_gateway:
        import cProfile

        profiler = cProfile.Profile()

    def profiled(on: bool) -> None:
        if profiler is not None:
            profiler.enable() if on else profiler.disable()

    try:
        await asyncio.gather(*(h.ping.remote() for h in handles))
        # warm every path once (channels, streams, the model)
        await client.call("lifecycles", concurrency=1, seconds=0.3, warmup=0.0)
        await closed_loop(direct.lifecycle, 1, 0.3, 0.0)
        inproc.lifecycles(1, 0.3, 0.0)

        # (d) first: the yardstick
        ping_c1 = await sequential_ms(lambda: handles[0].ping.remote(), n_rpc)
        ping_rates = {c: await ping_rate(handles[0], c, 1000 if quick else 3000) for c in (16, 64)}

        # (a) (b) (c) interleaved per concurrency level, in passes, so that load from
        # elsewhere on the machine falls on all three alike
        cells: dict[tuple[str, int], list[dict]] = {}
        for _ in range(passes):
            for conc in CONCURRENCY:
                profiled(True)
                cells.setdefault(("gateway", conc), []).append(
                    await client.call(
                        "lifecycles", concurrency=conc, seconds=seconds, warmup=warmup
                    )
                )
                profiled(False)
                cells.setdefault(("direct", conc), []).append(
                    await closed_loop(direct.lifecycle, conc, seconds, warmup)
                )
                cells.setdefault(("in-process", conc), []).append(
                    inproc.lifecycles(conc, seconds, warmup)
                )
        life = {key: merge(results) for key, results in cells.items()}

        # (e) 64 sessions on ONE replica, 64 tokens each
        others = [r for r in sorted(server.replicas)[1:]]
        for r in others:  # keep the gateway's sessions on the first replica
            await server.router.drain.remote(r, True)
        cpu = CpuMeter(client.proc.pid)
        try:
            profiled(True)
            before = cpu.sample()
            tok_gw = await client.call("tokens", sessions=64, max_new_tokens=64, rounds=rounds)
            tok_gw["cpu"] = cpu.delta(before, cpu.sample())
            profiled(False)
        finally:
            for r in others:
                await server.router.drain.remote(r, False)
        before = cpu.sample()
        tok_direct = await direct.tokens(handles[0], 64, 64, rounds)
        tok_direct["cpu"] = cpu.delta(before, cpu.sample())
        before = cpu.sample()
        tok_inproc = inproc.tokens(64, 64, rounds)
        tok_inproc["cpu"] = cpu.delta(before, cpu.sample())

        # (f) per-RPC latency, concurrency 1
        profiled(True)
        rpc = await client.call("rpc", n=n_rpc)
        profiled(False)
        handle = server.replicas[rpc["replica_id"]]
        direct_get = await sequential_ms(
            lambda: handle.get_session.remote(rpc["session_id"]), n_rpc
        )
        await client.call("close", session_id=rpc["session_id"])
    finally:
        client.stop()
        direct.stop()
        await server.stop()

    report(
        life,
        ping_c1,
        ping_rates,
        tok_gw,
        tok_direct,
        tok_inproc,
        rpc,
        direct_get,
        time.perf_counter() - t_start,
    )
    if profiler is not None:
        import pstats

        profiler.dump_stats(args.profile_gateway)
        print(f"\ncProfile of the gateway process during (a), (e), (f): {args.profile_gateway}")
        pstats.Stats(profiler).sort_stats("tottime").print_stats(30)


def report(
    life, ping_c1, ping_rates, tok_gw, tok_direct, tok_inproc, rpc, direct_get, elapsed
) -> None:
    print(
        f"\n(a/b/c) session lifecycle: open, one turn ({len(PROMPT)}-token prompt, "
        f"{LIFECYCLE_TOKENS} new tokens, greedy), close — closed loop"
    )
    head = (
        f"{'conc':>4}  {'mode':<10} {'sessions/s':>10} {'p50 ms':>8} {'p99 ms':>8}  "
        f"{'open p50':>8} {'turn p50':>8} {'close p50':>9} {'n':>5}  notes"
    )
    print(head)
    print("-" * len(head))
    for conc in CONCURRENCY:
        for mode in ("gateway", "direct", "in-process"):
            s = life[mode, conc]
            notes = []
            if s["tokens"] != [LIFECYCLE_TOKENS]:
                notes.append(f"tokens/turn {s['tokens']}")
            if s["errors"]:
                notes.append(f"errors {s['errors']}")
            print(
                f"{conc:>4}  {mode:<10} {s['rate']:>10.1f} {fmt_ms(s['p50'])} "
                f"{fmt_ms(s['p99'])}  {fmt_ms(s['open'])} {fmt_ms(s['turn'])} "
                f" {fmt_ms(s['close'])} {s['n']:>5}  {'; '.join(notes)}"
            )
    print("  (open/turn/close p50: the phases; the turn is submit -> last token)")
    print("\nratios (sessions/s; p50 latency)")
    print(
        f"{'conc':>4}  {'gateway/direct':>14} {'direct/in-process':>17} "
        f"{'gateway/in-process':>18}   {'p50 gateway/direct':>18} {'p50 direct/in-proc':>18}"
    )
    for conc in CONCURRENCY:
        g, d, e = (life[m, conc] for m in ("gateway", "direct", "in-process"))
        print(
            f"{conc:>4}  {ratio(g['rate'], d['rate']):>14} {ratio(d['rate'], e['rate']):>17} "
            f"{ratio(g['rate'], e['rate']):>18}   {ratio(g['p50'], d['p50']):>18} "
            f"{ratio(d['p50'], e['p50']):>18}"
        )

    print("\n(d) raw async actor calls (ping on a replica actor, from this process)")
    print(
        f"  round trip at concurrency 1: p50 {pct(ping_c1, 50):.2f} ms, "
        f"p99 {pct(ping_c1, 99):.2f} ms"
    )
    for c, rate in ping_rates.items():
        print(f"  {c:>3} in flight: {rate:,.0f} calls/s")
    best = max(ping_rates.values())
    print(
        "  yardstick: a gateway lifecycle is 5 actor calls (open and close each go "
        "gateway->router->replica, submit 1)\n  plus >=1 stream item per engine step; "
        "a direct lifecycle is 3 calls."
    )
    for conc in CONCURRENCY:
        g, d = life["gateway", conc], life["direct", conc]
        print(
            f"  conc {conc:>2}: gateway {g['rate']:.1f}/s = {g['rate'] * 5 / best:.0%} of the "
            f"actor-call ceiling ({best / 5:,.0f}/s); direct {d['rate']:.1f}/s = "
            f"{d['rate'] * 3 / best:.0%} of {best / 3:,.0f}/s"
        )

    gw_rate, d_rate, e_rate = (rounds_rate(t) for t in (tok_gw, tok_direct, tok_inproc))
    print(
        f"\n(e) tokens/s, 64 concurrent sessions on ONE replica ({tok_gw['replicas']}), "
        f"64 new tokens each, {len(tok_gw['rounds'])} rounds (first is warm-up)"
    )
    for name, result, rate in (
        ("gRPC clients", tok_gw, gw_rate),
        ("direct actor", tok_direct, d_rate),
        ("in-process engine", tok_inproc, e_rate),
    ):
        per_round = ", ".join(f"{n} in {dt:.2f}s" for n, dt in result["rounds"])
        print(f"  {name:<18} {rate:>9,.0f} tokens/s   ({per_round})")

    print(
        "\n    CPU seconds per 1,000 tokens, by process, all rounds (wall: seconds per 1,000 "
        "tokens; 2 cores = 2 CPU s per wall s)"
    )
    groups = CpuMeter.GROUPS
    print(f"    {'':<18}" + "".join(f"{g:>9}" for g in groups) + f"{'total':>9}{'wall':>8}")
    for name, result in (
        ("gRPC clients", tok_gw),
        ("direct actor", tok_direct),
        ("in-process engine", tok_inproc),
    ):
        k = sum(n for n, _ in result["rounds"]) / 1000
        use = result["cpu"]
        wall = sum(dt for _, dt in result["rounds"])
        print(
            f"    {name:<18}"
            + "".join(f"{use[g] / k:>9.2f}" for g in groups)
            + f"{sum(use.values()) / k:>9.2f}{wall / k:>8.2f}"
        )

    get_p50, direct_p50 = pct(rpc["get"], 50), pct(direct_get, 50)
    added = get_p50 - direct_p50
    print(f"\n(f) per-RPC latency at concurrency 1 ({len(direct_get)} calls each)")
    print(f"  {'call':<52} {'p50 ms':>8} {'p99 ms':>8}")
    for name, samples in (
        ("GetSession via gRPC (client -> gateway -> actor)", rpc["get"]),
        ("get_session straight on the replica actor", direct_get),
        ("grpc.health Check (gRPC floor, no actor call)", rpc["health"]),
        ("ping straight on the replica actor (actor floor)", ping_c1),
    ):
        print(f"  {name:<52} {fmt_ms(pct(samples, 50))} {fmt_ms(pct(samples, 99))}")
    print(f"  gateway added latency (p50 GetSession - p50 get_session): {added:.2f} ms")

    tok_ratio = gw_rate / e_rate
    print("\ngoals")
    rows = [
        (
            "(e) gRPC tokens/s / in-process tokens/s",
            f"{tok_ratio:.2f}",
            f">= {GOAL_TOKENS_RATIO}",
            tok_ratio >= GOAL_TOKENS_RATIO,
        ),
        (
            "(f) gateway added latency per RPC, p50",
            f"{added:.2f} ms",
            f"< {GOAL_ADDED_MS:g} ms",
            added < GOAL_ADDED_MS,
        ),
    ]
    print(f"  {'':<42} {'measured':>10} {'goal':>9}  met")
    for name, value, goal, met in rows:
        print(f"  {name:<42} {value:>10} {goal:>9}  {'yes' if met else 'NO'}")
    print(
        f"\n  (direct actor / in-process tokens/s: {d_rate / e_rate:.2f}; "
        f"gRPC / direct: {gw_rate / d_rate:.2f})"
    )
    print(f"\ntotal run time {elapsed:.0f}s")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer and shorter measurements")
    parser.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="replica actors (sessions spread over them; (e) uses one)",
    )
    parser.add_argument(
        "--seconds",
        type=float,
        default=None,
        help="measured seconds per lifecycle cell and pass "
        "(default 2.5 x 2 passes, --quick 1.5 x 1)",
    )
    parser.add_argument(
        "--max-sessions",
        type=int,
        default=512,
        help="sessions per replica (>= 64, plus what the router reserves between snapshots)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads per replica and for the in-process engine "
        "(default 1; 0: what serve gives a CPU replica, cpu_count // "
        "replicas, whose OpenMP barriers then fight the gateway, router "
        "and client for the cores)",
    )
    parser.add_argument(
        "--profile-gateway",
        metavar="FILE",
        help="cProfile this process (the gateway) during the gRPC runs",
    )
    args = parser.parse_args()
    if args.max_sessions < 64:
        parser.error("--max-sessions must be >= 64 (concurrency 64 on one replica)")
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
