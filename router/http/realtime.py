"""``GET /v1/realtime?model=…``: the OpenAI Realtime protocol (text) over a WebSocket, one live
session per connection (``router.http.realtime_connection``).

The caller's key comes as ``Authorization: Bearer KEY`` or, from browsers, as the subprotocol
token ``openai-insecure-api-key.KEY``; a missing or unknown key, or another model, is refused
at the handshake (HTTP 401 / 404 in the API's error shape). The session is opened with a
stream lease (its idle timeout does not apply while the socket is open) and released when the
socket closes, whichever side closes it. Close codes: 1000 normal; 1003 a binary frame; 1008
a client past a per-connection bound (a burst of events not taken yet,
``router.http.websocket_protocol``; events it does not read, ``router.http.realtime_outbox``);
1009 an event over 1 MiB; 1011 the server could not open a session (no room, no replica), or
the keepalive ping went unanswered.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from starlette.responses import JSONResponse
from starlette.websockets import WebSocket

from router.gateway.auth import ApiKeys, Unauthenticated
from router.http.errors import ApiError
from router.http.realtime_connection import RealtimeConnection
from router.http.realtime_conversation import LiveConversation
from router.http.realtime_events import error_event
from router.http.realtime_metrics import RealtimeMetrics
from router.http.turns import Turns

log = logging.getLogger(__name__)

KEY_PROTOCOL = "openai-insecure-api-key."
PROTOCOL = "realtime"


def caller_headers(websocket: WebSocket) -> tuple[tuple[str, str], ...]:
    """The handshake's headers, with a browser's subprotocol key as its Authorization."""
    headers = tuple((k.decode("latin-1").lower(), v.decode("latin-1"))
                    for k, v in websocket.scope["headers"])  # fmt: skip
    for protocol in websocket.scope.get("subprotocols", ()):
        if protocol.startswith(KEY_PROTOCOL):
            key = protocol[len(KEY_PROTOCOL) :]
            headers = (*(h for h in headers if h[0] != "authorization"),
                       ("authorization", f"Bearer {key}"))  # fmt: skip
    return headers


class Realtime:
    def __init__(
        self, keys: ApiKeys, turns: Turns, metrics: RealtimeMetrics, model: Callable[[], str]
    ) -> None:
        self.keys, self.turns, self.metrics, self.model = keys, turns, metrics, model

    async def endpoint(self, websocket: WebSocket) -> None:
        try:
            tenant = self.keys.caller_of(caller_headers(websocket)).tenant
        except Unauthenticated as exc:
            return await refuse(websocket, ApiError(401, str(exc), code="invalid_api_key"))
        model = websocket.query_params.get("model")
        if model is not None and model != self.model():
            why = f"the model {model!r} is not served here; this server serves {self.model()!r}"
            return await refuse(websocket, ApiError(404, why, "model", "model_not_found"))
        offered = websocket.scope.get("subprotocols", ())
        await websocket.accept(subprotocol=PROTOCOL if PROTOCOL in offered else None)
        try:
            conversation = await LiveConversation.open(self.turns, tenant)
        except ApiError as exc:
            await websocket.send_json(error_event(exc, None))
            return await close(websocket, 1011, "no session could be opened")
        self.metrics.sessions.inc()
        code = None
        try:
            connection = RealtimeConnection(
                websocket, self.turns, self.metrics, self.model(), conversation
            )
            code = await connection.serve()
        except Exception:  # noqa: BLE001 - a bug: logged, the socket closed with 1011
            log.exception("realtime connection failed")
            code = 1011
        finally:
            self.metrics.sessions.dec()
        if code is not None:
            self.metrics.dropped.labels(str(code)).inc()
        await close(websocket, code or 1000, "")


async def refuse(websocket: WebSocket, error: ApiError) -> None:
    """Refuse the handshake with an HTTP error where the server can send one, else 403."""
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        response = JSONResponse(error.body(), status_code=error.status)
        await websocket.send_denial_response(response)
    else:
        await websocket.close(code=1008)


async def close(websocket: WebSocket, code: int, reason: str) -> None:
    try:
        await websocket.close(code=code, reason=reason)
    except Exception:  # noqa: BLE001 - closed already, or the peer is gone
        pass
