"""``/metrics``: counters in the Prometheus text format through ``prometheus_client``.

Each server keeps its own registry (not the library's global one), so two servers in one
process, or a test beside a server, never share or double-register a metric.
"""

from __future__ import annotations

from typing import Final

import prometheus_client
from prometheus_client import CollectorRegistry, Counter

CONTENT_TYPE: Final = prometheus_client.CONTENT_TYPE_LATEST

# The ``*_created`` timestamp samples double every counter's lines for no dashboard's use.
prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]


class RequestMetrics:
    """HTTP responses counted by path and status, in a registry of this server's own."""

    def __init__(self, *, prefix: str = "oominfer") -> None:
        """Start at zero; the counter is ``{prefix}_requests_total{path, status}``."""
        self.registry = CollectorRegistry()
        self.requests = Counter(
            f"{prefix}_requests",
            "HTTP responses by path and status code.",
            ["path", "status"],
            registry=self.registry,
        )

    def count_request(self, path: str, status: int) -> None:
        """One finished HTTP response."""
        self.requests.labels(path=path, status=str(status)).inc()

    def render(self) -> bytes:
        """The exposition text."""
        return prometheus_client.generate_latest(self.registry)
