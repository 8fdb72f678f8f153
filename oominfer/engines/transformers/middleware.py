"""The ASGI middleware in front of every route: API key, draining, in-flight count, metrics."""

from __future__ import annotations

import hmac
from dataclasses import dataclass, field
from typing import Final

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from oominfer.engines.transformers.metrics import Metrics
from oominfer.engines.transformers.protocol import ApiError, shutting_down

_ROUTES: Final = frozenset(
    {"/v1/models", "/v1/completions", "/v1/chat/completions", "/health", "/metrics"}
)


@dataclass(slots=True, kw_only=True)
class GateState:
    """What the gate reads and keeps: the key, the draining flag, the in-flight count."""

    api_key: str | None
    metrics: Metrics = field(default_factory=Metrics)
    draining: bool = False
    in_flight: int = 0


class Gate:
    """ASGI middleware: API key, draining, in-flight count, per-status metrics.

    Only ``/v1/*`` needs the bearer token, counts as in flight and is refused while draining.
    """

    def __init__(self, app: ASGIApp, *, state: GateState) -> None:
        """Wrap ``app``; ``state`` holds the key, the draining flag and the metrics."""
        self.app = app
        self.state = state

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
        if guarded and self.state.draining:
            error = shutting_down()
        elif guarded and self.state.api_key and not self._authorized(scope):
            error = ApiError(
                401,
                "Missing or wrong API key: send the header 'Authorization: Bearer <key>'.",
                code="invalid_api_key",
            )
        if error is not None:
            await error.response()(scope, receive, send_counting)
        else:
            self.state.in_flight += guarded
            try:
                await self.app(scope, receive, send_counting)
            finally:
                self.state.in_flight -= guarded
        metric_path = path if path in _ROUTES else "other"
        self.state.metrics.count_request(metric_path, status)

    def _authorized(self, scope: Scope) -> bool:
        expected = f"Bearer {self.state.api_key}".encode()
        for name, value in scope.get("headers", []):
            if name == b"authorization":
                return hmac.compare_digest(value, expected)
        return False
