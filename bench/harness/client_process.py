"""A gRPC client in a child process, as a real client would be: its CPU is not the gateway's, and
the gateway's event loop (in the benchmark's process) does not run the client's work.

The child connects once (``connect(address)``, by default ``AsyncSessionClient``) and then runs
the async functions it is sent, ``fn(client, **kwargs)``, one at a time, returning their results.
``fn`` and ``connect`` travel by reference (pickle), so they must be module-level names in an
importable module (``bench.harness.grpc_driver`` holds the session workloads); results must
pickle too. ``connect`` may return any object with an async ``close()``, such as a
``grpc.aio`` channel for a benchmark against a bare gRPC server.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
from collections.abc import Awaitable, Callable
from typing import Any

from router.client import AsyncSessionClient

STOP_WAIT_S = 10.0


def _child(conn: Any, address: str, connect: Callable[[str], Any]) -> None:
    asyncio.run(_serve(conn, address, connect))


async def _serve(conn: Any, address: str, connect: Callable[[str], Any]) -> None:
    client = connect(address)
    loop = asyncio.get_running_loop()
    conn.send((True, None))  # ready
    try:
        while (message := await loop.run_in_executor(None, conn.recv)) is not None:
            fn, kwargs = message
            try:
                conn.send((True, await fn(client, **kwargs)))
            except Exception as exc:  # noqa: BLE001 - raised again in the parent
                conn.send((False, f"{type(exc).__name__}: {exc}"))
    finally:
        await client.close()


class ClientProcess:
    """A child process (spawned, so it shares no state with this one) holding one client of
    ``address``; ``await call(fn, **kwargs)`` runs ``fn(client, **kwargs)`` there. Start it with
    ``await ClientProcess.start(address)``, which returns once the child has imported what it
    needs and connected, so that its start-up is in no measurement."""

    def __init__(self, address: str, connect: Callable[[str], Any] = AsyncSessionClient) -> None:
        ctx = mp.get_context("spawn")
        self._conn, child_conn = ctx.Pipe()
        self._proc = ctx.Process(target=_child, args=(child_conn, address, connect), daemon=True)
        self._proc.start()

    @classmethod
    async def start(
        cls, address: str, connect: Callable[[str], Any] = AsyncSessionClient
    ) -> ClientProcess:
        client = cls(address, connect)
        await client._reply()
        return client

    @property
    def pid(self) -> int:
        return self._proc.pid

    async def _reply(self) -> Any:
        ok, result = await asyncio.get_running_loop().run_in_executor(None, self._conn.recv)
        if not ok:
            raise RuntimeError(f"client process: {result}")
        return result

    async def call(self, fn: Callable[..., Awaitable[Any]], **kwargs: Any) -> Any:
        """``fn(client, **kwargs)`` in the child; its result, or ``RuntimeError`` if it raised."""
        self._conn.send((fn, kwargs))
        return await self._reply()

    def stop(self) -> None:
        try:
            self._conn.send(None)
        except OSError:
            pass
        self._proc.join(STOP_WAIT_S)
        if self._proc.is_alive():
            self._proc.terminate()

    def __enter__(self) -> ClientProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
