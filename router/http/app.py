"""The front door's ASGI app: routes, API keys, body limits and errors in the API's shape.

Every endpoint reads the caller's key (``Authorization: Bearer KEY``; the gateway's keys and
tenants), a JSON body of at most ``MAX_BODY_BYTES`` (413 beyond), and answers a refusal with its
``ApiError``; an unexpected failure is logged and answered 500 without details (a bug, never
something a client sent).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route, WebSocketRoute
from starlette.types import Receive, Scope, Send

from router.gateway.auth import Unauthenticated
from router.http.errors import ApiError, invalid
from router.http.front_door import FrontDoor
from router.http.sse import EventStream

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 8 << 20
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}

Handler = Callable[[Request, str], Awaitable[Any]]


def too_large() -> ApiError:
    return ApiError(413, f"the request body is over {MAX_BODY_BYTES} bytes", code="too_large")


async def read_json(request: Request) -> Any:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise too_large()
    body = bytearray()
    async for piece in request.stream():
        body += piece
        if len(body) > MAX_BODY_BYTES:
            raise too_large()
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise invalid(f"the request body is not valid JSON: {exc}") from None


async def read_object(request: Request) -> dict[str, Any]:
    body = await read_json(request)
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object")
    return body


class EventStreamResponse(StreamingResponse):
    """Server-sent events that are closed however the response ends (sent whole, the client
    gone, a send that failed), so the turn they hold is let go at once."""

    def __init__(self, events: EventStream) -> None:
        super().__init__(events, media_type="text/event-stream", headers=SSE_HEADERS)
        self.events = events

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.events.aclose()


def endpoint(front: FrontDoor, name: str, handler: Handler):
    async def run(request: Request) -> Response:
        started, status = time.perf_counter(), 200
        try:
            headers = tuple((k.decode("latin-1").lower(), v.decode("latin-1"))
                            for k, v in request.scope["headers"])  # fmt: skip
            try:
                tenant = front.keys.caller_of(headers).tenant
            except Unauthenticated as exc:
                raise ApiError(401, str(exc), code="invalid_api_key") from None
            result = await handler(request, tenant)
            if isinstance(result, Response):
                status = result.status_code
                return result
            if isinstance(result, EventStream):
                return EventStreamResponse(result)
            return JSONResponse(result)
        except ApiError as exc:
            status = exc.status
            return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers())
        except Exception:  # noqa: BLE001 - a bug: logged, answered without details
            status = 500
            log.exception("%s failed", name)
            error = ApiError(500, f"internal error in {name}; retry, and report it if it persists")
            return JSONResponse(error.body(), status_code=500)
        finally:
            front.metrics.observe_request(name, status, time.perf_counter() - started)

    return run


def build_app(front: FrontDoor) -> Starlette:
    async def chat(request: Request, tenant: str):
        return await front.completions.chat(await read_object(request), tenant)

    async def complete(request: Request, tenant: str):
        return await front.completions.complete(await read_object(request), tenant)

    async def models(request: Request, tenant: str):
        return await front.models()

    async def model(request: Request, tenant: str):
        return await front.model(request.path_params["model"])

    async def respond(request: Request, tenant: str):
        return await front.responses.create(await read_object(request), tenant)

    async def get_response(request: Request, tenant: str):
        return await front.responses.get(request.path_params["id"], tenant)

    async def delete_response(request: Request, tenant: str):
        return await front.responses.delete(request.path_params["id"], tenant)

    async def input_items(request: Request, tenant: str):
        return await front.responses.input_items(
            request.path_params["id"], tenant, dict(request.query_params)
        )

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    def route(path: str, name: str, handler: Handler, method: str) -> Route:
        return Route(path, endpoint(front, name, handler), methods=[method])

    routes = [
        route("/v1/models", "models", models, "GET"),
        route("/v1/models/{model:path}", "models", model, "GET"),
        route("/v1/chat/completions", "chat_completions", chat, "POST"),
        route("/v1/completions", "completions", complete, "POST"),
        route("/v1/responses", "responses", respond, "POST"),
        route("/v1/responses/{id}", "responses_get", get_response, "GET"),
        route("/v1/responses/{id}", "responses_delete", delete_response, "DELETE"),
        route("/v1/responses/{id}/input_items", "responses_input_items", input_items, "GET"),
        Route("/health", health, methods=["GET"]),
        WebSocketRoute("/v1/realtime", front.realtime.endpoint),
    ]

    async def not_found(request: Request, exc: Exception) -> Response:
        error = ApiError(404, f"no such endpoint: {request.method} {request.url.path}")
        return JSONResponse(error.body(), status_code=404)

    async def not_allowed(request: Request, exc: Exception) -> Response:
        error = ApiError(405, f"{request.method} is not allowed on {request.url.path}")
        return JSONResponse(error.body(), status_code=405)

    return Starlette(routes=routes, exception_handlers={404: not_found, 405: not_allowed})
