"""SIGTERM or SIGINT: drain, then exit 0.

New ``/v1`` requests get 503 and ``/health`` turns 503; requests in flight finish (up to
``--grace-period`` seconds, after which they end with an error); then the process exits 0. A
second signal exits at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from types import FrameType
from typing import Any

import uvicorn

from oominfer.engines.transformers.server import Server

log = logging.getLogger("oominfer.transformers")


async def drain(server: Server, uv: uvicorn.Server) -> None:
    """Stop accepting, let in-flight requests finish within the grace period, then stop."""
    grace = server.config.grace_period_s
    scheduler = server.scheduler
    log.info("Shutting down: refusing new requests; waiting up to %g s for %d in flight.",
             grace, server.gate.in_flight)  # fmt: skip
    server.gate.draining = True
    scheduler.stop_accepting()
    deadline = time.monotonic() + grace
    while (server.gate.in_flight or not scheduler.idle()) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    if server.gate.in_flight or not scheduler.idle():
        log.warning("Grace period of %g s is over: ending %d requests.", grace,
                    server.gate.in_flight)  # fmt: skip
        await asyncio.to_thread(
            scheduler.abort_all, "The server stopped before this request finished."
        )
        await asyncio.sleep(0.2)  # let the aborted streams send their error and [DONE]
    uv.should_exit = True


class DrainingUvicorn(uvicorn.Server):
    """uvicorn whose first SIGTERM/SIGINT drains instead of closing the socket at once.

    uvicorn re-raises a captured signal after shutting down, which would end the process with
    -SIGTERM; the drain exits 0 instead, as a graceful stop should.
    """

    def __init__(self, config: uvicorn.Config, server: Server) -> None:
        """Serve ``server``'s app per ``config``."""
        super().__init__(config)
        self.oominfer = server
        self.loop: asyncio.AbstractEventLoop | None = None
        self.signalled = False
        self.drain_task: asyncio.Task[None] | None = None

    async def startup(self, sockets: list[Any] | None = None) -> None:
        """Remember the event loop that the signal handler schedules the drain on."""
        self.loop = asyncio.get_running_loop()
        await super().startup(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """First signal: drain. Second: exit now."""
        loop = self.loop
        if self.signalled or loop is None:
            log.warning("Signal %d: exiting now.", sig)
            self.should_exit = True
            self.force_exit = self.signalled
            return
        self.signalled = True

        def begin() -> None:
            self.drain_task = loop.create_task(drain(self.oominfer, self))

        loop.call_soon_threadsafe(begin)
