"""How a gateway's RPC bodies end: ``Refused`` mapped to its status code and message, any other
error to INTERNAL (logged: a bug), and every call counted in the metrics with its code."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable

from replica.api import StatusCode
from router.gateway.convert import Refused, status_code
from router.gateway.gateway import Gateway

log = logging.getLogger(__name__)


def unexpected(method: str, exc: Exception) -> Refused:
    """An error no step mapped to a status (a bug): INTERNAL with a message, never UNKNOWN."""
    log.error("%s failed unexpectedly", method, exc_info=exc)
    return Refused(
        StatusCode.INTERNAL,
        f"internal error in {method} ({type(exc).__name__}); retry, and report it if it persists",
    )


async def run_rpc(gateway: Gateway, method: str, context, body):
    """Run a unary body, mapping ``Refused`` to its status and counting the call."""
    started, code = time.perf_counter(), StatusCode.OK
    try:
        return await body()
    except Refused as exc:
        code = exc.code
        await context.abort(status_code(exc.code), str(exc))
    except Exception as exc:  # noqa: BLE001 - mapped, logged
        refused = unexpected(method, exc)
        code = refused.code
        await context.abort(status_code(code), str(refused))
    finally:
        gateway.metrics.observe_rpc(method, code, time.perf_counter() - started)


async def run_stream(
    gateway: Gateway,
    method: str,
    context,
    stream: AsyncGenerator,
    on_end: Callable[[StatusCode], None] | None = None,
) -> AsyncIterator:
    """Relay a streaming body, mapping ``Refused`` to its status; the body is closed (its own
    cleanup runs) and ``on_end(code)`` runs however the call ends (also when the client
    cancels), then the call is counted."""
    started, code = time.perf_counter(), StatusCode.OK
    try:
        async for item in stream:
            yield item
    except Refused as exc:
        code = exc.code
        await context.abort(status_code(exc.code), str(exc))
    except asyncio.CancelledError:
        code = StatusCode.CANCELLED
        raise
    except Exception as exc:  # noqa: BLE001 - mapped, logged
        refused = unexpected(method, exc)
        code = refused.code
        await context.abort(status_code(code), str(refused))
    finally:
        await stream.aclose()  # a body left at a yield (the call closed) ends here, not when GC'd
        if on_end is not None:
            on_end(code)
        gateway.metrics.observe_rpc(method, code, time.perf_counter() - started)
