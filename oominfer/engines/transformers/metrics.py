"""The engine's ``/metrics``: the edge's request counters, the scheduler's tokens, out-of-memory
recoveries and gauges, the process's memory, through ``prometheus_client``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from prometheus_client import Counter, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from oominfer.edge.metrics import RequestMetrics


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


class Metrics(RequestMetrics):
    """The request counters, plus what the scheduler counts and the gauges it reports."""

    def __init__(self) -> None:
        """Start at zero; the scheduler's gauges join once ``watch`` names them."""
        super().__init__(prefix="oominfer")
        r = self.registry
        self.prompt_tokens = Counter("oominfer_prompt_tokens", "Prompt tokens admitted.",
                                     registry=r)  # fmt: skip
        self.generation_tokens = Counter("oominfer_generation_tokens", "Tokens generated.",
                                         registry=r)  # fmt: skip
        self.oom_recoveries = Counter(
            "oominfer_oom_recoveries",
            "Out-of-memory errors recovered by splitting the batch.",
            registry=r,
        )
        self.oom_failures = Counter(
            "oominfer_oom_failures",
            "Requests failed because they alone did not fit in memory.",
            registry=r,
        )
        # process_resident_memory_bytes and the rest of the process_* family (Linux /proc).
        ProcessCollector(registry=r)

    def watch(self, stats: Callable[[], SchedulerStats]) -> None:
        """Report the scheduler's gauges, read from ``stats`` at each scrape."""
        self.registry.register(_SchedulerCollector(stats))


class _SchedulerCollector(Collector):
    """The scheduler's snapshot as metric families, taken when ``/metrics`` is read."""

    def __init__(self, stats: Callable[[], SchedulerStats]) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        s = self.stats()
        yield CounterMetricFamily(
            "oominfer_forward_passes", "Model forward passes.", value=s.forward_passes
        )
        gauges = (
            ("oominfer_queue_depth", "Requests waiting for a batch slot.", s.queue_depth),
            ("oominfer_batch_size", "Sequences in the running batch.", s.batch_size),
            ("oominfer_max_num_seqs", "Batch size limit.", s.max_num_seqs),
            ("oominfer_batch_cap", "Batch size limit after out-of-memory errors.", s.cap),
            ("oominfer_kv_cache_bytes", "Bytes held by the running batch's KV cache.",
             s.kv_cache_bytes),
            ("oominfer_model_weights_bytes", "The model's memory footprint.", s.weights_bytes),
        )  # fmt: skip
        for name, help_, value in gauges:
            yield GaugeMetricFamily(name, help_, value=value)
        if torch.cuda.is_available():
            yield GaugeMetricFamily(
                "oominfer_torch_cuda_allocated_bytes",
                "Bytes allocated by torch on the GPU.",
                value=torch.cuda.memory_allocated(),
            )
            yield GaugeMetricFamily(
                "oominfer_torch_cuda_reserved_bytes",
                "Bytes reserved by torch's caching allocator.",
                value=torch.cuda.memory_reserved(),
            )
