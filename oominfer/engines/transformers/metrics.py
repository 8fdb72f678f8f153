"""Counters and gauges for ``/metrics``, in the Prometheus text format."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulerStats:
    """A snapshot of the scheduler's gauges, taken when ``/metrics`` is read."""

    forward_passes: int
    queue_depth: int
    batch_size: int
    max_num_seqs: int
    cap: int
    kv_cache_bytes: int
    weights_bytes: int


class Metrics:
    """Counters and gauges in the Prometheus text format, without a client library."""

    def __init__(self) -> None:
        """Start at zero."""
        self.requests: dict[tuple[str, int], int] = {}
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.oom_recoveries = 0
        self.oom_failures = 0
        self.lock = threading.Lock()

    def count_request(self, path: str, status: int) -> None:
        """One finished HTTP response."""
        with self.lock:
            key = (path, status)
            self.requests[key] = self.requests.get(key, 0) + 1

    def render(self, stats: SchedulerStats) -> str:
        """The exposition text."""
        lines: list[str] = []

        def metric(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
            lines.append(f"# HELP {name} {help_}")
            lines.append(f"# TYPE {name} {kind}")
            lines.extend(f"{name}{labels} {_number(value)}" for labels, value in samples)

        with self.lock:
            requests = sorted(self.requests.items())
        metric(
            "oominfer_requests_total",
            "counter",
            "HTTP responses by path and status code.",
            [(f'{{path="{p}",status="{s}"}}', n) for (p, s), n in requests],
        )
        counters = (
            ("oominfer_prompt_tokens_total", "Prompt tokens admitted.", self.prompt_tokens),
            ("oominfer_generation_tokens_total", "Tokens generated.", self.generation_tokens),
            (
                "oominfer_oom_recoveries_total",
                "Out-of-memory errors recovered by splitting the batch.",
                self.oom_recoveries,
            ),
            (
                "oominfer_oom_failures_total",
                "Requests failed because they alone did not fit in memory.",
                self.oom_failures,
            ),
            (
                "oominfer_forward_passes_total",
                "Model forward passes.",
                stats.forward_passes,
            ),
        )
        for name, help_, value in counters:
            metric(name, "counter", help_, [("", value)])
        gauges = (
            ("oominfer_queue_depth", "Requests waiting for a batch slot.", stats.queue_depth),
            ("oominfer_batch_size", "Sequences in the running batch.", stats.batch_size),
            ("oominfer_max_num_seqs", "Batch size limit.", stats.max_num_seqs),
            ("oominfer_batch_cap", "Batch size limit after out-of-memory errors.", stats.cap),
            ("oominfer_kv_cache_bytes", "Bytes held by the running batch's KV cache.",
             stats.kv_cache_bytes),
            ("oominfer_model_weights_bytes", "The model's memory footprint.",
             stats.weights_bytes),
            ("process_resident_memory_bytes", "Resident set size of this process.", _rss_bytes()),
        )  # fmt: skip
        for name, help_, value in gauges:
            metric(name, "gauge", help_, [("", value)])
        if torch.cuda.is_available():
            metric(
                "oominfer_torch_cuda_allocated_bytes",
                "gauge",
                "Bytes allocated by torch on the GPU.",
                [("", torch.cuda.memory_allocated())],
            )
            metric(
                "oominfer_torch_cuda_reserved_bytes",
                "gauge",
                "Bytes reserved by torch's caching allocator.",
                [("", torch.cuda.memory_reserved())],
            )
        return "\n".join(lines) + "\n"


def _number(value: float) -> str:
    """Integers in full (byte counts), other numbers as Python writes them."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _rss_bytes() -> int:
    """The process's resident set size (Linux /proc; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
