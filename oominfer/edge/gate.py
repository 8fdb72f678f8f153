"""The ASGI middleware in front of every route: API key, draining, body size, metrics.

The front of ``oominfer serve`` and the transformers engine's server both stand behind it.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass, field
from typing import Final

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from oominfer.base.units import format_bytes
from oominfer.edge.errors import CLIENT_CLOSED_REQUEST, ApiError, shutting_down
from oominfer.edge.metrics import RequestMetrics

OPENAI_ROUTES: Final = frozenset(
    {"/v1/models", "/v1/completions", "/v1/chat/completions", "/health", "/metrics"}
)
"""The paths counted under their own name in the request metrics; any other is ``other``."""
_BODY_METHODS: Final = frozenset({"POST", "PUT", "PATCH"})


@dataclass(slots=True, kw_only=True)
class GateState:
    """What the gate reads and keeps: the key, the body limit, draining, the in-flight count."""

    api_key: str | None
    max_body_bytes: int
    metrics: RequestMetrics = field(default_factory=RequestMetrics)
    routes: frozenset[str] = OPENAI_ROUTES
    """Paths counted by name in the metrics (a bounded label set); the rest count as other."""
    draining: bool = False
    in_flight: int = 0


class Gate:
    """ASGI middleware: API key, draining, body size, in-flight count, per-status metrics.

    Only ``/v1/*`` needs the bearer token, counts as in flight and is refused while draining.
    A body over ``max_body_bytes`` is refused with 413 before the route sees it.
    """

    def __init__(self, app: ASGIApp, *, state: GateState) -> None:
        """Wrap ``app``; ``state`` holds the key, the limits, the draining flag and metrics."""
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
        elif guarded and self.state.api_key and not _authorized(scope, self.state.api_key):
            error = ApiError(
                401,
                "Missing or wrong API key: send the header 'Authorization: Bearer <key>'.",
                code="invalid_api_key",
            )
        elif scope["method"] in _BODY_METHODS:
            body = await self._read_body(scope, receive)
            if isinstance(body, ApiError):
                error = body
            elif body is not None:
                receive = _replay(body, receive)
            else:  # the client left before sending all of its body
                status = CLIENT_CLOSED_REQUEST
        if error is not None:
            await error.response()(scope, receive, send_counting)
        elif status != CLIENT_CLOSED_REQUEST:
            self.state.in_flight += guarded
            try:
                await self.app(scope, receive, send_counting)
            finally:
                self.state.in_flight -= guarded
        metric_path = path if path in self.state.routes else "other"
        self.state.metrics.count_request(metric_path, status)

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes | ApiError | None:
        """The whole body, 413 when it is over the limit, None when the client left."""
        limit = self.state.max_body_bytes
        for name, value in scope.get("headers", []):
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                return _too_large(int(value), limit)
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk: bytes = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                return _too_large(size, limit, at_least=True)
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def _authorized(scope: Scope, key: str) -> bool:
    """``Authorization: Bearer <key>``; the scheme's case does not matter (RFC 9110)."""
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            scheme, _, token = value.partition(b" ")
            return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), key.encode())
    return False


def _too_large(size: int, limit: int, *, at_least: bool = False) -> ApiError:
    more = "more than " if at_least else ""
    return ApiError(
        413,
        f"The request body is {more}{size:,} bytes; this server takes at most {limit:,} "
        f"({format_bytes(limit)}, --max-body-size).",
        code="request_too_large",
    )  # uvicorn reads and drops the rest (within --timeout-request), so the client sees this


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives ``body`` once, then what the client sends (its disconnect)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay
