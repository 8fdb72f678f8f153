"""The planner: search the levers jointly with the estimator and pick by an objective. Pure.

Levers, cheapest in quality first (DESIGN.md): inference mode (always), the GPU's best
16-bit dtype, fewer concurrent sequences and a smaller prefill chunk, a shorter context,
no CUDA graphs, an FP8 KV cache, weight quantization, more GPUs (tensor, then pipeline
parallel), and CPU offload of weights only when allowed. Every candidate is scored by the
estimator (``search``); the objective orders them (``objective``); the chosen plan names
each lever turned, why, and the bytes it saved (``levers``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from oominfer.errors import InvalidSettingError
from oominfer.hardware.hardware import Hardware
from oominfer.memory.breakdown import MemoryBreakdown
from oominfer.memory.estimate import estimate
from oominfer.model.spec import ModelSpec
from oominfer.planning.constraints import Constraints
from oominfer.planning.document import Lever
from oominfer.planning.levers import explain
from oominfer.planning.no_fit import does_not_fit
from oominfer.planning.objective import sort_key
from oominfer.planning.search import Candidate, candidates, with_offload
from oominfer.settings import Dtype, VllmSettings


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanResult:
    """The chosen configuration, its breakdown, the levers turned, and vLLM's defaults."""

    settings: VllmSettings
    breakdown: MemoryBreakdown
    levers: tuple[Lever, ...]
    baseline: MemoryBreakdown | None
    """vLLM's defaults on the same hardware (None when they cannot even be estimated)."""
    candidates: int


def plan(
    spec: ModelSpec,
    hardware: Hardware,
    constraints: Constraints,
) -> PlanResult:
    """The best configuration under ``constraints``, with the levers it turned.

    Raises:
        DoesNotFitError: nothing fits; the message gives the shortfall and the ways out.
    """
    engine, dtype = constraints.engine, constraints.dtype
    found = list(candidates(spec, hardware, constraints))
    if not found and constraints.allow_offload and not hardware.is_cpu:
        found = with_offload(spec, hardware, constraints)
    if not found:
        raise does_not_fit(spec, hardware, constraints)
    best = min(found, key=lambda cand: sort_key(cand, constraints.prefer))
    # Record the dtype the engine will run (bf16 needs compute capability 8.0).
    chosen: Dtype = dtype if dtype != "auto" else best.breakdown.dtype  # type: ignore[assignment]
    best_settings = dataclasses.replace(best.settings, dtype=chosen)
    best = Candidate(
        settings=best_settings,
        breakdown=estimate(spec, hardware=hardware, settings=best_settings, engine=engine),
    )
    baseline = _baseline(spec, hardware, constraints)
    levers = explain(spec, hardware, best, engine=engine)
    return PlanResult(
        settings=best.settings,
        breakdown=best.breakdown,
        levers=levers,
        baseline=baseline,
        candidates=len(found),
    )


def _baseline(spec: ModelSpec, hardware: Hardware, c: Constraints) -> MemoryBreakdown | None:
    """What vLLM's defaults would do on this hardware."""
    settings = VllmSettings(
        gpu_memory_utilization=c.gpu_memory_utilization or VllmSettings().gpu_memory_utilization,
        kv_cache_memory_bytes=c.kv_cache_memory_bytes,
    )
    try:
        return estimate(spec, hardware=hardware, settings=settings, engine=c.engine)
    except InvalidSettingError:
        return None
