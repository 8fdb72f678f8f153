"""Connections: idle and slow ones are closed, and a cap keeps ``/health`` reachable.

uvicorn's h11 protocol, with three additions uvicorn has no setting for:

- ``timeout_keep_alive`` (uvicorn's own setting) closes a connection idle between requests;
  here it also closes one that connects and never sends a request (uvicorn arms the timer only
  after a first response, so 300 silent sockets stayed open for good).
- A request's headers and body must arrive within ``timeout_request`` of its first byte, or
  the client gets 408 and the connection is closed (slow-loris clients).
- At most ``max_connections`` are open. A new connection beyond the cap closes the one idle
  the longest (no request in progress); when every one has a request in progress, the new one
  gets 503 with Retry-After to its first request and is closed. The cap sits below the
  open-file limit: at that limit ``accept`` fails and nothing, ``/health`` included, can
  connect. uvicorn's ``limit_concurrency`` is not used: it answers 503 to every request,
  ``/health`` included, once the cap is reached, and keeps the idle connections that caused it.

h11 is used whether or not httptools is installed, so the behaviour does not depend on an
optional package; h11 also bounds the request line and headers
(``h11_max_incomplete_event_size``, 16 KiB), answering 400 beyond.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import Any, ClassVar, Final

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from oominfer.edge.errors import ApiError, busy
from oominfer.edge.limits import ClientLimits

log = logging.getLogger("oominfer.edge")

_TIMED_OUT_HEAD: Final = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
    b"content-length: %d\r\n\r\n"
)
_WARN_EVERY_S: Final = 60.0


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the connection cap and the request timeout."""

    limits: ClassVar[ClientLimits]
    _warned_at: ClassVar[float] = float("-inf")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """As uvicorn's; ``limits`` comes from the class (see ``protocol_class``)."""
        super().__init__(*args, **kwargs)
        self.last_active = time.monotonic()
        self.request_timer: asyncio.TimerHandle | None = None

    @classmethod
    def _warn(cls, message: str, *args: object) -> None:
        now = time.monotonic()
        if now - cls._warned_at >= _WARN_EVERY_S:
            cls._warned_at = now
            log.warning(message, *args)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Admit the connection under the cap, and time it out if it never sends a request."""
        super().connection_made(transport)
        cap = self.limits.max_connections
        open_ = [c for c in self.connections if not c.transport.is_closing()]
        if len(open_) > cap:
            idle = [
                c for c in open_ if isinstance(c, GuardedH11Protocol) and c.idle() and c is not self
            ]
            if idle:
                min(idle, key=lambda c: c.last_active).close_idle()
                self._warn("%d connections open (--max-connections %d): closing the ones idle "
                           "longest to admit new ones.", len(open_), cap)  # fmt: skip
            else:
                self._warn("%d connections open (--max-connections %d), each with a request "
                           "in progress: answering new ones 503.", len(open_), cap)  # fmt: skip
                self.app = _Refuse(cap)
        self._arm_keep_alive()

    def connection_lost(self, exc: Exception | None) -> None:
        """As uvicorn's, and the request timer goes."""
        self._cancel_request_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        """As uvicorn's; then a request that has begun must arrive within ``timeout_request``,
        and a connection left idle (say, after the rest of a refused body) times out."""
        self.last_active = time.monotonic()
        super().data_received(data)
        if self.transport.is_closing():
            return
        if self._receiving_request():
            if self.request_timer is None:
                self.request_timer = self.loop.call_later(
                    self.limits.timeout_request_s, self._request_timed_out
                )
            return
        self._cancel_request_timer()
        if self.idle() and self.timeout_keep_alive_task is None:
            self._arm_keep_alive()

    def on_response_complete(self) -> None:
        """As uvicorn's (which arms the keep-alive timer); the connection is idle from now."""
        self.last_active = time.monotonic()
        super().on_response_complete()

    def idle(self) -> bool:
        """No request in progress: none begun, or the last one answered."""
        return self.cycle is None or self.cycle.response_complete

    def close_idle(self) -> None:
        """Close this idle connection, as uvicorn's keep-alive timeout does."""
        with contextlib.suppress(h11.LocalProtocolError):
            self.conn.send(h11.ConnectionClosed())
        self.transport.close()

    def _arm_keep_alive(self) -> None:
        """uvicorn's keep-alive timer, where uvicorn would not set it."""
        self.timeout_keep_alive_task = self.loop.call_later(
            self.timeout_keep_alive, self.timeout_keep_alive_handler
        )

    def _receiving_request(self) -> bool:
        """Part of a request has arrived, not all of it."""
        if self.conn.their_state is h11.SEND_BODY:
            return True
        return self.conn.their_state is h11.IDLE and bool(self.conn.trailing_data[0])

    def _cancel_request_timer(self) -> None:
        if self.request_timer is not None:
            self.request_timer.cancel()
            self.request_timer = None

    def _request_timed_out(self) -> None:
        self.request_timer = None
        if self.transport.is_closing() or not self._receiving_request():
            return
        cycle = self.cycle
        if cycle is None or not cycle.response_started:  # h11 cannot answer half a request
            error = ApiError(
                408,
                f"The request did not arrive within {self.limits.timeout_request_s:g} s "
                "(--timeout-request).",
                code="request_timeout",
            )
            body = json.dumps(error.body()).encode()
            self.transport.write(_TIMED_OUT_HEAD % len(body) + body)
        if cycle is not None:  # the route waiting for the body sees a disconnect
            cycle.disconnected = True
            cycle.message_event.set()
        self.transport.close()


def protocol_class(limits: ClientLimits) -> type[GuardedH11Protocol]:
    """The protocol class uvicorn instantiates per connection, bound to ``limits``."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"limits": limits})


class _Refuse:
    """The ASGI app of a connection over the cap: 503 with Retry-After, then the close.

    Answering the request, rather than closing the socket unread, lets the client read why (a
    socket closed with unread data resets, and the client sees only "connection reset").
    """

    def __init__(self, cap: int) -> None:
        self.error = busy(
            f"This server has {cap} connections open, each with a request in progress "
            "(--max-connections); retry shortly.",
            503,
        )

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        response = self.error.response()
        response.headers["connection"] = "close"
        await response(scope, receive, send)
