"""The OpenAI error shape ``{"error": {message, type, param, code}}``, as the edge answers it."""

from __future__ import annotations

import json
from typing import Any, Final

from starlette.responses import JSONResponse

RETRY_AFTER_S: Final = 1
CLIENT_CLOSED_REQUEST: Final = 499
"""nginx's status for a request whose client went away first; only /metrics sees it."""


class ApiError(Exception):
    """An error answered in the OpenAI shape ``{"error": {message, type, param, code}}``."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        """Create the error; ``status`` is the HTTP status code."""
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        """The JSON body."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def encoded(self) -> bytes:
        """The JSON body as bytes, ASCII only (``\\u`` escapes), so any message encodes."""
        return json.dumps(self.body(), separators=(",", ":")).encode()

    def response(self) -> JSONResponse:
        """The HTTP response (an ASGI app)."""
        return _AsciiJSONResponse(self.body(), status_code=self.status, headers=self.headers)


class _AsciiJSONResponse(JSONResponse):
    """JSON with ``\\u`` escapes: a message that quotes a client's invalid text still encodes."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, separators=(",", ":")).encode()


def busy(message: str, status: int = 429) -> ApiError:
    """429 (queue full) or 503 (stopping, starting, too many connections), with Retry-After."""
    kind = "rate_limit_exceeded" if status == 429 else "service_unavailable"
    return ApiError(
        status,
        message,
        type_=kind,
        code=kind,
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


def shutting_down() -> ApiError:
    """503 for a request that arrives after SIGTERM."""
    return busy("The server is shutting down; retry on another replica.", 503)
