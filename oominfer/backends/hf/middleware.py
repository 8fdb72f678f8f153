"""The ASGI middleware in front of every route: API key, draining, in-flight count, metrics."""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING, Final

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from oominfer.backends.hf.protocol import ApiError, shutting_down

if TYPE_CHECKING:
    from oominfer.backends.hf.server import Server

_ROUTES: Final = frozenset(
    {"/v1/models", "/v1/completions", "/v1/chat/completions", "/health", "/metrics"}
)


class Gate:
    """ASGI middleware: API key, draining, in-flight count, per-status metrics.

    Only ``/v1/*`` needs the bearer token, counts as in flight and is refused while draining.
    """

    def __init__(self, app: ASGIApp, *, server: Server) -> None:
        """Wrap ``app``; ``server`` holds the key, the draining flag and the metrics."""
        self.app = app
        self.server = server

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one ASGI call."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        guarded = path.startswith("/v1/") or path == "/v1"
        status = 500

        async def send_counting(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        error: ApiError | None = None
        if guarded and self.server.draining:
            error = shutting_down()
        elif guarded and self.server.config.api_key and not self._authorized(scope):
            error = ApiError(
                401,
                "Missing or wrong API key: send the header 'Authorization: Bearer <key>'.",
                code="invalid_api_key",
            )
        if error is not None:
            await error.response()(scope, receive, send_counting)
        else:
            self.server.in_flight += guarded
            try:
                await self.app(scope, receive, send_counting)
            finally:
                self.server.in_flight -= guarded
        metric_path = path if path in _ROUTES else "other"
        self.server.metrics.count_request(metric_path, status)

    def _authorized(self, scope: Scope) -> bool:
        expected = f"Bearer {self.server.config.api_key}".encode()
        for name, value in scope.get("headers", []):
            if name == b"authorization":
                return hmac.compare_digest(value, expected)
        return False
