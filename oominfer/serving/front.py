"""The public side of ``oominfer serve``: a thin streaming reverse proxy in front of the engine.

The engine listens on a private port of 127.0.0.1 and oominfer owns the public one, so that
stopping is oominfer's to do well whatever the engine does: from the first SIGTERM, SIGINT or
SIGHUP ``/health`` answers 503 and new requests get 503 with Retry-After; requests in flight
may finish for the grace period; then streams still open end with an error event and
``[DONE]``, and requests not yet answered get 503. Until the engine is healthy every request
gets 503 too.

Bodies pass through as bytes, both ways, unparsed; server-sent events are forwarded whole
(one event per write), so an error event can always be appended cleanly. A client that
disconnects closes its upstream connection, so the engine aborts its request.

The front stands behind the same edge as the transformers engine's own server
(``oominfer.edge``), whichever engine is behind it: the API key (``/v1/*``; 401 before the
engine sees the request), the body limit (413), at most ``max_connections`` open (a new one
closes the longest-idle one, or gets 503 when every one has a request in progress), a request
must arrive within ``timeout_request_s`` of its first byte (else 408), idle connections close
after ``timeout_keep_alive_s``. ``/metrics`` is the engine's (vLLM's ``vllm:*``, which
autoscalers read) followed by the front's own request counters (``oominfer_front_*``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, MutableMapping
from dataclasses import dataclass, field
from typing import Any, Final

import httpx
import uvicorn

from oominfer.edge.connections import protocol_class
from oominfer.edge.errors import ApiError
from oominfer.edge.gate import OPENAI_ROUTES, Gate, GateState
from oominfer.edge.limits import ClientLimits, default_limits
from oominfer.edge.metrics import CONTENT_TYPE, RequestMetrics

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

RETRY_AFTER_S: Final = 1
CUT_WAIT_S: Final = 1.0
"""Seconds the cut requests have to send their error and close."""
_HOP_BY_HOP: Final = frozenset(
    {b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te",
     b"trailer", b"transfer-encoding", b"upgrade", b"host"}
)  # fmt: skip
_SSE_SPLIT: Final = b"\n\n"
_SSE_MAX_HELD: Final = 1 << 20
"""Bytes of one unfinished event held back before they are forwarded anyway."""


def error_body(status: int, message: str) -> bytes:
    """The OpenAI error shape, as the engines answer it."""
    kind = {502: "bad_gateway", 503: "service_unavailable"}.get(status, "server_error")
    return ApiError(status, message, type_=kind, code=kind).encoded()


async def _answer(send: Send, status: int, message: str) -> None:
    headers = [(b"content-type", b"application/json")]
    if status == 503:
        headers.append((b"retry-after", str(RETRY_AFTER_S).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": error_body(status, message)})


@dataclass(eq=False)
class _Flight:
    """One proxied request, as far as it got."""

    cut: asyncio.Event = field(default_factory=asyncio.Event)
    reason: str = ""
    started: bool = False
    sse: bool = False
    ended_event: bool = True
    """The bytes sent so far end on an event boundary (nothing half-sent)."""
    answered: bool = False
    """The whole answer was sent (the request only has to close)."""


class Front:
    """The ASGI app: answers while the engine starts and while oominfer stops, proxies between."""

    def __init__(
        self,
        upstream_port: int,
        *,
        api_key: str | None = None,
        limits: ClientLimits | None = None,
    ) -> None:
        """Proxy to the engine on 127.0.0.1:``upstream_port``, behind the edge: ``api_key``
        required on ``/v1/*`` when given, ``limits`` on what clients hold and send."""
        self.limits = limits or default_limits()
        self.metrics = RequestMetrics(prefix="oominfer_front")
        self.gate = GateState(
            api_key=api_key,
            max_body_bytes=self.limits.max_body_bytes,
            metrics=self.metrics,
            routes=OPENAI_ROUTES,
        )
        self.app = Gate(self._serve, state=self.gate)
        """The ASGI app to listen with: the edge, then the proxy."""
        self.client = httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{upstream_port}",
            timeout=httpx.Timeout(None, connect=10.0),
            # Idle connections are let go before the engine closes them (uvicorn: after 5 s).
            limits=httpx.Limits(
                max_connections=None, max_keepalive_connections=512, keepalive_expiry=2.0
            ),
        )
        self.ready = False
        self.draining = False
        self.flights: set[_Flight] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one ASGI connection scope, through the edge."""
        await self.app(scope, receive, send)

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Past the edge: answer while starting and stopping, proxy between."""
        if scope["type"] != "http":
            return
        if scope["path"] == "/metrics" and scope["method"] == "GET":
            await self._metrics(send)
            return
        if self.draining:
            await _answer(send, 503, "The server is shutting down; retry on another replica.")
            return
        if not self.ready:
            await _answer(send, 503, "The engine is starting; retry shortly.")
            return
        flight = _Flight()
        self.flights.add(flight)
        try:
            await self._proxy(scope, receive, send, flight)
        finally:
            self.flights.discard(flight)

    async def _metrics(self, send: Send) -> None:
        """The engine's metrics (when it answers), then the front's own."""
        engine = b""
        if self.ready and not self.draining:
            with contextlib.suppress(httpx.HTTPError):
                response = await self.client.get("/metrics", timeout=5.0)
                if response.status_code == 200:
                    engine = response.content
                    if engine and not engine.endswith(b"\n"):
                        engine += b"\n"
        headers = [(b"content-type", CONTENT_TYPE.encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": engine + self.metrics.render()})

    @property
    def in_flight(self) -> int:
        """Requests not answered in full yet."""
        return sum(not flight.answered for flight in self.flights)

    def cut(self, reason: str) -> int:
        """End every request not answered yet with an error; returns how many there were."""
        unanswered = [flight for flight in self.flights if not flight.answered]
        for flight in unanswered:
            flight.reason = reason
            flight.cut.set()
        return len(unanswered)

    async def wait_idle(
        self, seconds: float = CUT_WAIT_S, until: asyncio.Event | None = None
    ) -> None:
        """Until every request is answered, ``seconds`` have passed, or ``until`` is set."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while self.in_flight and loop.time() < deadline and not (until and until.is_set()):
            await asyncio.sleep(0.05)

    async def _proxy(self, scope: Scope, receive: Receive, send: Send, flight: _Flight) -> None:
        first = await receive()
        if first["type"] == "http.disconnect":
            return
        body_done = asyncio.Event()
        content: bytes | AsyncIterator[bytes]
        if first.get("more_body"):
            content = _rest_of_body(first.get("body", b""), receive, body_done)
        else:
            content = first.get("body", b"")
            body_done.set()
        relay = asyncio.ensure_future(self._relay(scope, content, send, flight))
        gone = asyncio.ensure_future(_disconnected(receive, body_done))
        cut = asyncio.ensure_future(flight.cut.wait())
        try:
            await asyncio.wait({relay, gone, cut}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (relay, gone, cut):
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await relay
        if flight.answered:
            return
        if cut.done() and not cut.cancelled():
            await _end_with_error(send, flight, 503, flight.reason)
        elif relay.done() and not relay.cancelled() and relay.exception() is not None:
            said = f"The engine did not answer: {relay.exception()}"
            await _end_with_error(send, flight, 502, said)

    async def _relay(
        self, scope: Scope, content: bytes | AsyncIterator[bytes], send: Send, flight: _Flight
    ) -> None:
        path = scope.get("raw_path") or scope["path"].encode()
        query = scope.get("query_string", b"")
        url = path.decode("latin-1") + ("?" + query.decode("latin-1") if query else "")
        headers = [_canonical(k, v) for k, v in scope["headers"] if k.lower() not in _HOP_BY_HOP]
        request = self.client.build_request(scope["method"], url, headers=headers, content=content)
        response = await self.client.send(request, stream=True)
        try:
            out = [(k.lower(), v) for k, v in response.headers.raw if k.lower() not in _HOP_BY_HOP]
            kind = response.headers.get("content-type", "")
            flight.sse = kind.startswith("text/event-stream") and not any(
                k == b"content-encoding" for k, _ in out
            )
            await send({"type": "http.response.start", "status": response.status_code,
                        "headers": out})  # fmt: skip
            flight.started = True
            held = b""
            async for chunk in response.aiter_raw():
                if flight.sse:
                    held += chunk
                    end = held.rfind(_SSE_SPLIT)
                    if end < 0 and len(held) < _SSE_MAX_HELD:
                        continue
                    cut_at = end + len(_SSE_SPLIT) if end >= 0 else len(held)
                    chunk, held = held[:cut_at], held[cut_at:]
                    flight.ended_event = end >= 0  # else an overlong event goes out in parts
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": held, "more_body": False})
            flight.answered = True
        finally:
            await response.aclose()


def _canonical(name: bytes, value: bytes) -> tuple[bytes, bytes]:
    """The header as the engine expects it: vLLM compares ``Authorization`` to ``Bearer <key>``
    exactly, while the edge (RFC 9110) takes the scheme in any case."""
    if name.lower() == b"authorization" and value[:7].lower() == b"bearer ":
        return name, b"Bearer " + value[7:].strip()
    return name, value


async def _rest_of_body(
    first: bytes, receive: Receive, done: asyncio.Event
) -> AsyncIterator[bytes]:
    yield first
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ConnectionResetError("the client disconnected while sending its request")
        yield message.get("body", b"")
        if not message.get("more_body"):
            done.set()
            return


async def _disconnected(receive: Receive, body_done: asyncio.Event) -> None:
    """Returns when the client disconnects (after its request body has been read)."""
    await body_done.wait()
    while (await receive())["type"] != "http.disconnect":
        pass


async def _end_with_error(send: Send, flight: _Flight, status: int, message: str) -> None:
    """End a request that cannot be answered in full: a 503/502 if nothing was sent yet, an
    error event and [DONE] on an event stream, else just the end of the body."""
    with contextlib.suppress(Exception):
        if not flight.started:
            await _answer(send, status, message)
            return
        tail = b""
        if flight.sse:
            lead = b"" if flight.ended_event else _SSE_SPLIT
            tail = lead + b"data: " + error_body(status, message) + b"\n\ndata: [DONE]\n\n"
        await send({"type": "http.response.body", "body": tail, "more_body": False})


class Listener(uvicorn.Server):
    """uvicorn on a socket oominfer bound, leaving the signals to oominfer."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        """oominfer's loop handles SIGTERM, SIGINT and SIGHUP itself."""
        yield


def listener(front: Front) -> Listener:
    """The HTTP server for ``front`` (quiet: the engine's log is what the user reads), with
    the edge's connection cap, request timeout and keep-alive timeout."""
    config = uvicorn.Config(
        front.app, lifespan="off", log_level="warning", access_log=False,
        timeout_graceful_shutdown=int(CUT_WAIT_S) + 1,
        http=protocol_class(front.limits),
        timeout_keep_alive=front.limits.timeout_keep_alive_s,
    )  # fmt: skip
    return Listener(config)
