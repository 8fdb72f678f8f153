"""Corrections from a failed launch: what the engine measured becomes the next constraint.

Never blind halving: the engine's own "estimated maximum model length", the memory it used
beyond the estimate, or the fraction of the GPU that is free.
"""

from __future__ import annotations

import dataclasses
import re

from oominfer.base.errors import DoesNotFitError
from oominfer.base.units import GiB, format_bytes
from oominfer.hardware.hardware import Hardware
from oominfer.model.spec import ModelSpec
from oominfer.planning.constraints import Constraints
from oominfer.planning.document import Lever
from oominfer.planning.planner import PlanResult
from oominfer.runtime.status import ProbeStatus
from oominfer.settings import EngineSettings, flag
from oominfer.verify.prober import ProbeResult


def _free_fraction(detail: str) -> float | None:
    """The free fraction from vLLM's "Free memory on device (X/Y GiB)" message."""
    m = re.search(r"\(([\d.]+)/([\d.]+) GiB\)", detail)
    return float(m.group(1)) / float(m.group(2)) if m else None


def correct(
    spec: ModelSpec,
    hardware: Hardware,
    c: Constraints,
    settings: EngineSettings,
    result: PlanResult,
    outcome: ProbeResult,
) -> tuple[Constraints, Lever]:
    """New constraints from what the failed launch measured, and the lever that records it."""
    facts = outcome.facts
    if outcome.status is ProbeStatus.KV_CACHE_TOO_SMALL and facts.estimated_max_model_len:
        length = facts.estimated_max_model_len
        floor = c.hard_floor(spec.max_position_embeddings)
        if length < floor:
            # A --max-model-len given is a requirement, as to vLLM: never silently less.
            name = flag("max_model_len") if c.max_model_len is not None else "--min-context"
            raise DoesNotFitError(
                f"the engine holds at most {length:,} tokens per request, below {name} {floor:,}.",
                hint=f"Pass {name} {length} or less, or add GPUs.",
            )
        lever = Lever(
            name="max_model_len",
            value=length,
            cost="a shorter context",
            reason=f"the engine measured its KV cache: {length:,} tokens fit (its own "
            f"estimate after max_model_len {settings.max_model_len:,} failed)",
        )
        return dataclasses.replace(c, max_model_len=length), lever
    if outcome.status is ProbeStatus.INSUFFICIENT_FREE_MEMORY:
        free = _free_fraction(facts.detail)
        util = round((free or settings.gpu_memory_utilization) - 0.02, 2)
        if util <= 0.05:
            held = f"only {free:.0%} of the GPU is free" if free is not None else (
                "too little of the GPU is free")  # fmt: skip
            raise DoesNotFitError(
                f"{held}: {facts.detail or 'the engine did not say how much'}",
                hint="Stop what else holds the GPU's memory (nvidia-smi lists it), then fit again.",
            )
        lever = Lever(name="gpu_memory_utilization", value=util, cost="a smaller KV cache",
                      reason="other processes hold GPU memory; the budget shrinks to what is "
                      "free")  # fmt: skip
        return dataclasses.replace(c, gpu_memory_utilization=util), lever
    # Out of memory or no KV memory: set aside what the engine used beyond the estimate.
    b = result.breakdown
    over = 0
    if facts.weights_bytes:
        over = max(0, facts.weights_bytes - b.loaded_bytes)
    reserve = max(over, b.budget_bytes // 10, GiB // 4)
    if c.kv_cache_memory_bytes is not None:
        kv = c.kv_cache_memory_bytes - reserve
        if kv <= 0:
            raise DoesNotFitError("the engine ran out of memory with the smallest KV cache.")
        lever = Lever(name="kv_cache_memory_bytes", value=kv, cost="a smaller KV cache",
                      reason=f"the engine ran out of memory ({facts.detail[:120]}); "
                      f"{format_bytes(reserve)} set aside")  # fmt: skip
        return dataclasses.replace(c, kv_cache_memory_bytes=kv), lever
    util = round(settings.gpu_memory_utilization - reserve / hardware.gpu.cuda_total_bytes, 3)
    if util <= 0.05:
        raise DoesNotFitError(f"the engine ran out of memory: {facts.detail}")
    lever = Lever(name="gpu_memory_utilization", value=util, cost="a smaller KV cache",
                  reason=f"the engine ran out of memory ({facts.detail[:120]}); "
                  f"{format_bytes(reserve)} more set aside for activations")  # fmt: skip
    return dataclasses.replace(c, gpu_memory_utilization=util), lever
