"""What clients may hold and send: connections, their idle and slow time, body size."""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass
from typing import Final

from oominfer.base.units import parse_size

DEFAULT_MAX_BODY: Final = "10MiB"
"""A 131,072-token prompt is about 0.5 MiB of text, about 1 MiB as token ids: 10 MiB leaves
room for long chats and JSON escapes (up to 6 bytes a character) and refuses what no context
holds (a 20 MB body took seconds of tokenizing to be refused)."""
DEFAULT_TIMEOUT_KEEP_ALIVE_S: Final = 5
"""uvicorn's and vLLM's ``--timeout-keep-alive`` default."""
DEFAULT_TIMEOUT_REQUEST_S: Final = 30.0
MAX_CONNECTIONS_CEILING: Final = 1024
FD_RESERVE: Final = 64
"""File descriptors kept free of connections: model files, logs, pipes, the listening socket."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientLimits:
    """What clients may hold and send: connections, their idle and slow time, body size."""

    max_connections: int
    """Open connections at most; the longest-idle one is closed to admit a new one."""
    timeout_keep_alive_s: int = DEFAULT_TIMEOUT_KEEP_ALIVE_S
    """A connection with no request in progress is closed after this long."""
    timeout_request_s: float = DEFAULT_TIMEOUT_REQUEST_S
    """A request's headers and body must arrive within this long of its first byte."""
    max_body_bytes: int = parse_size(DEFAULT_MAX_BODY)
    """A request body above this is refused with 413."""


def default_max_connections() -> int:
    """What the open-file limit leaves for connections, at most ``MAX_CONNECTIONS_CEILING``.

    Each connection holds a descriptor; at the limit, ``accept`` fails and nothing (``/health``
    included) can connect, so the cap stays below it.
    """
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS_CEILING
    try:
        in_use = len(os.listdir("/proc/self/fd"))
    except OSError:
        in_use = FD_RESERVE
    return max(1, min(MAX_CONNECTIONS_CEILING, soft - in_use - FD_RESERVE))


def default_limits() -> ClientLimits:
    """The limits when none are given: the defaults, under this process's open-file limit."""
    return ClientLimits(max_connections=default_max_connections())
