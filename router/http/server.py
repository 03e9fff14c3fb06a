"""``HttpServer``: the front door's app served by uvicorn on the gateway's event loop, beside
its gRPC server (same host, same TLS files). ``serve`` and ``gateway`` handle SIGINT/SIGTERM
themselves and stop this server as part of their shutdown, so uvicorn's own signal handling is
left out. WebSockets use ``BoundedWebSocketProtocol`` (the per-connection bounds) and are pinged
every ``keepalive_s``, a peer that does not answer within as long dropped with 1011, as gRPC's
keepalive drops one."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import Iterator

import uvicorn
from starlette.applications import Starlette

from router.http.websocket_protocol import MAX_MESSAGE_BYTES, BoundedWebSocketProtocol


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # the process that runs the gateway owns its signals


class HttpServer:
    def __init__(
        self,
        app: Starlette,
        host: str,
        port: int,
        tls: tuple[str, str, str | None] | None = None,
        keepalive_s: float = 30.0,
    ) -> None:
        """``tls``: certificate chain, key and optionally the CA that client certificates
        must be signed by (then clients must present one)."""
        self.host = host
        self.sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host.strip("[]"), port))
        self.sock.set_inheritable(True)
        ssl_options = {}
        if tls is not None:
            cert, key, client_ca = tls
            ssl_options = {"ssl_certfile": cert, "ssl_keyfile": key}
            if client_ca:
                ssl_options |= {"ssl_ca_certs": client_ca, "ssl_cert_reqs": ssl.CERT_REQUIRED}
        config = uvicorn.Config(
            app,
            log_level="warning",
            lifespan="off",
            access_log=False,
            timeout_graceful_shutdown=5,
            ws=BoundedWebSocketProtocol,
            ws_max_size=MAX_MESSAGE_BYTES,
            ws_ping_interval=keepalive_s,
            ws_ping_timeout=keepalive_s,
            **ssl_options,
        )
        self.server = _Server(config)
        self.tls = tls is not None
        self._task: asyncio.Task | None = None

    @property
    def port(self) -> int:
        return self.sock.getsockname()[1]

    async def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self.server.serve([self.sock]))
        while not self.server.started:
            if self._task.done():
                self._task.result()  # raises what stopped it
                raise RuntimeError("the HTTP server stopped during start-up")
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        self.server.should_exit = True
        if self._task is not None:
            try:
                await asyncio.wait_for(self._task, timeout=10)
            except (TimeoutError, asyncio.TimeoutError):
                self.server.force_exit = True
        self.sock.close()
