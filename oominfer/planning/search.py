"""The search: every configuration on the lever grid, scored by the estimator. Pure."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

from oominfer.errors import InvalidSettingError
from oominfer.hardware.hardware import Hardware
from oominfer.memory.breakdown import MemoryBreakdown
from oominfer.memory.estimate import estimate
from oominfer.memory.profile import vllm_defaults
from oominfer.model.spec import ModelSpec
from oominfer.planning.constraints import Constraints
from oominfer.settings import KvCacheDtype, Quantization, VllmSettings
from oominfer.units import GiB, MiB

SEQ_STEPS: Final = (1024, 512, 256, 128, 64, 32, 16, 8, 4, 2, 1)
BATCHED_STEPS: Final = (None, 1024, 512)


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    """One scored configuration."""

    settings: VllmSettings
    breakdown: MemoryBreakdown

    @property
    def context(self) -> int:
        """The context this candidate serves."""
        return self.settings.max_model_len or self.breakdown.max_model_len


def divisors(spec: ModelSpec, gpus: int) -> list[int]:
    """Tensor-parallel sizes up to ``gpus`` that divide the attention heads."""
    return [tp for tp in (1, 2, 4, 8, 16) if tp <= gpus and spec.num_attention_heads % tp == 0]


def _quantizations(
    spec: ModelSpec, hardware: Hardware, c: Constraints
) -> list[Quantization | None]:
    """Weight formats to try: the checkpoint's own, then in-flight ones the engine has."""
    if spec.quantization is not None or c.no_quantize:
        return [None]
    if c.engine == "transformers":
        return [None, "int8", "bitsandbytes"]
    return [None, "fp8_per_tensor"] if hardware.gpu.supports_fp8 else [None]


def candidates(spec: ModelSpec, hardware: Hardware, c: Constraints) -> Iterator[Candidate]:
    """Every configuration on the lever grid that fits at least ``min_context``."""
    engine = c.engine
    trained = spec.max_position_embeddings
    cap = min(trained, c.max_model_len or trained)
    _, default_seqs = vllm_defaults(hardware)
    seq_steps = sorted({s for s in (default_seqs, *SEQ_STEPS) if s <= default_seqs}, reverse=True)
    if c.concurrency:
        seq_steps = [s for s in seq_steps if s >= c.concurrency] or [c.concurrency]
    kv_dtypes: list[KvCacheDtype] = ["auto"]
    if not hardware.is_cpu and hardware.gpu.supports_fp8 and engine == "vllm":
        kv_dtypes.append("fp8")
    eager_options = [False, True] if not hardware.is_cpu and engine == "vllm" else [False]
    util = c.gpu_memory_utilization or VllmSettings().gpu_memory_utilization
    tps = [tp for tp in divisors(spec, hardware.count) if tp <= c.gpus_per_node]
    for quant in _quantizations(spec, hardware, c):
        for tp in tps:
            for pp in [
                p for p in (1, 2, 4, 8) if tp * p <= hardware.count and p <= spec.num_layers
            ]:
                for kv in kv_dtypes:
                    for eager in eager_options:
                        for seqs in seq_steps:
                            for batched in BATCHED_STEPS if not hardware.is_cpu else (None,):
                                if batched is not None and batched < seqs:
                                    continue
                                yield from _score(
                                    spec,
                                    hardware,
                                    cap,
                                    c,
                                    VllmSettings(
                                        quantization=quant,
                                        kv_cache_dtype=kv,
                                        gpu_memory_utilization=util,
                                        max_model_len=cap,
                                        max_num_seqs=seqs,
                                        max_num_batched_tokens=batched,
                                        enforce_eager=eager,
                                        tensor_parallel_size=tp,
                                        pipeline_parallel_size=pp,
                                        kv_cache_memory_bytes=(c.kv_cache_memory_bytes),
                                    ),
                                )


def _score(
    spec: ModelSpec, hardware: Hardware, cap: int, c: Constraints, settings: VllmSettings
) -> Iterator[Candidate]:
    """The candidate these settings give at the longest context up to ``cap`` that fits."""
    engine = c.engine
    try:
        b = estimate(spec, hardware=hardware, settings=settings, engine=engine)
    except InvalidSettingError:
        return
    if hardware.is_cpu and engine == "vllm" and settings.kv_cache_memory_bytes is None:
        # On the CPU vLLM sizes the cache from the process's resident memory, which the
        # estimate cannot see; pin it instead to what the budget leaves (whole MiB).
        if b.kv_cache_bytes < MiB:
            return
        settings = dataclasses.replace(
            settings, kv_cache_memory_bytes=b.kv_cache_bytes // MiB * MiB
        )
        b = estimate(spec, hardware=hardware, settings=settings, engine=engine)
    length = min(cap, b.max_model_len_that_fits)
    if c.prefer == "throughput" and c.min_context > 1 and length >= c.min_context:
        length = c.min_context  # the required context; the rest of the cache goes to concurrency
    # The activation peak depends on the length (fewer tokens per step for short contexts),
    # so settle on a length that fits with its own peak.
    for _ in range(4):
        if length < c.min_context or length <= 0:
            return
        settings = dataclasses.replace(settings, max_model_len=length)
        b = estimate(spec, hardware=hardware, settings=settings, engine=engine)
        if b.fits:
            break
        length = min(length - 1, b.max_model_len_that_fits)
    else:
        return
    if c.concurrency and b.max_concurrency < c.concurrency:
        found = _longest_for_concurrency(spec, hardware, c, settings)
        if found is None:
            return
        settings, b = found
    yield Candidate(settings=settings, breakdown=b)


def _longest_for_concurrency(
    spec: ModelSpec, hardware: Hardware, c: Constraints, settings: VllmSettings
) -> tuple[VllmSettings, MemoryBreakdown] | None:
    """The longest context at which ``c.concurrency`` sequences fit at once (bisection)."""
    assert c.concurrency is not None and settings.max_model_len is not None

    def at(length: int) -> tuple[VllmSettings, MemoryBreakdown] | None:
        trial = dataclasses.replace(settings, max_model_len=length)
        b = estimate(spec, hardware=hardware, settings=trial, engine=c.engine)
        return (trial, b) if b.fits and b.max_concurrency >= (c.concurrency or 1) else None

    lo, hi = c.min_context, settings.max_model_len
    best = at(lo)
    if best is None:
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        found = at(mid)
        if found is not None:
            lo, best = mid, found
        else:
            hi = mid - 1
    return best


def with_offload(spec: ModelSpec, hardware: Hardware, c: Constraints) -> list[Candidate]:
    """Candidates with the missing weights kept in host memory (--allow-offload)."""
    cap = min(spec.max_position_embeddings, c.max_model_len or spec.max_position_embeddings)
    for length in dict.fromkeys((cap, min(cap, max(c.min_context, 4096)), c.min_context)):
        settings = VllmSettings(
            gpu_memory_utilization=c.gpu_memory_utilization
            or VllmSettings().gpu_memory_utilization,
            max_model_len=length,
            max_num_seqs=c.concurrency or 1,
            enforce_eager=True,
        )
        b = estimate(spec, hardware=hardware, settings=settings, engine=c.engine)
        offload = math.ceil(b.shortfall_bytes / GiB) + 1  # a GiB of headroom
        if offload * GiB >= b.weights_bytes:
            continue
        settings = dataclasses.replace(settings, cpu_offload_gb=float(offload))
        found = list(_score(spec, hardware, length, c, settings))
        if found:
            return found
    return []
