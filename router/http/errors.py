"""``ApiError``: an HTTP error in the OpenAI API's shape, and the status each refusal maps to.

Every error a client can cause is one of these (``{"error": {"message", "type", "param",
"code"}}``); nothing a client sends is answered with a 500.
"""

from __future__ import annotations

from typing import Any

from replica.api import StatusCode

# the gRPC-style codes of the replicas and the router, as the HTTP status a client is given
HTTP_STATUS = {
    StatusCode.INVALID_ARGUMENT: 400,
    StatusCode.OUT_OF_RANGE: 400,
    StatusCode.FAILED_PRECONDITION: 409,
    StatusCode.UNAUTHENTICATED: 401,
    StatusCode.PERMISSION_DENIED: 403,
    StatusCode.NOT_FOUND: 404,
    StatusCode.RESOURCE_EXHAUSTED: 429,
    StatusCode.UNAVAILABLE: 503,
    StatusCode.ABORTED: 503,
    StatusCode.CANCELLED: 499,
}
TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    499: "invalid_request_error",
    503: "server_error",
    504: "server_error",
}
RETRY_AFTER_S = 1


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        type_: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type = type_ or TYPES.get(status, "server_error")

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(RETRY_AFTER_S)} if self.status in (429, 503) else {}

    @classmethod
    def of(cls, code: StatusCode, message: str) -> ApiError:
        """The HTTP error of a refusal (``Refused`` or ``ActorError``) with ``code``."""
        code = StatusCode(code)
        status = HTTP_STATUS.get(code, 500)
        if code == StatusCode.OUT_OF_RANGE:
            return cls(400, message, "messages", "context_length_exceeded")
        if code == StatusCode.NOT_FOUND:
            return cls(404, message, code="not_found")
        if code == StatusCode.RESOURCE_EXHAUSTED:
            return cls(429, message, code="no_capacity")
        if code in (StatusCode.UNAVAILABLE, StatusCode.ABORTED):
            return cls(503, message, code="replica_lost")
        return cls(status, message)


def invalid(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param, code)
