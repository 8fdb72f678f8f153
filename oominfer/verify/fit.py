"""fit: plan, prove with the real engine, correct from what it measured, and certify.

The loop takes its engine as a parameter (a ``Prober``), so tests replay scripted outcomes
and the CLI passes real engines. Each launch costs minutes on a GPU, so every failure is
turned into a measured correction, never blind halving:

- KV_CACHE_TOO_SMALL: the engine's own "estimated maximum model length" caps the context;
- NO_KV_MEMORY / OUT_OF_MEMORY: the memory the engine used beyond the estimate is set aside
  (at least a tenth of the budget) and the levers are searched again;
- INSUFFICIENT_FREE_MEMORY: another process holds memory; the budget shrinks to what is free;
- UNSUPPORTED / CRASHED / TIMEOUT: no smaller configuration helps; exit 4 with the log.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from oominfer.base.errors import DoesNotFitError, OominferError, ProbeFailedError
from oominfer.hardware.hardware import Hardware
from oominfer.model.spec import ModelSpec
from oominfer.planning.constraints import Constraints
from oominfer.planning.document import Lever, Plan, Verification
from oominfer.planning.planner import PlanResult, plan
from oominfer.planning.record import make_plan, now
from oominfer.runtime.load_test import CONCURRENT_PROMPT_TOKENS
from oominfer.runtime.status import ProbeStatus
from oominfer.speed import Measured, Workload, predict
from oominfer.verify.cache import cache_key, cached_plan, store_plan
from oominfer.verify.correct import correct
from oominfer.verify.memory_store import MeasuredMemory, memory_layout, remember_memory
from oominfer.verify.prober import Prober, ProbeResult
from oominfer.verify.speed_store import remember

MAX_LAUNCHES = 3


@dataclass(frozen=True, slots=True, kw_only=True)
class FitResult:
    """The plan, and every launch it took to prove it."""

    plan: Plan
    planned: PlanResult | None
    probes: tuple[ProbeResult, ...] = ()
    cached: bool = False


def fit(
    spec: ModelSpec,
    hardware: Hardware,
    constraints: Constraints,
    *,
    prober: Prober | None = None,
    engine_version: str | None = None,
    use_estimate: bool = True,
    max_launches: int = MAX_LAUNCHES,
    use_cache: bool = True,
) -> FitResult:
    """Plan a configuration and, with a prober, prove it with the real engine.

    Args:
        spec: the model.
        hardware: the GPU kind and count (for ``device="cpu"``, the memory it may use).
        constraints: what the user asks (engine, objective, context floor and cap, ...).
        prober: launches the engine; None plans without verifying.
        engine_version: the installed engine's version (recorded, and part of the cache key).
        use_estimate: False starts from the requested context and lets the engine's own
            messages guide (for models the estimator may misjudge).
        max_launches: the most launches to spend.
        use_cache: answer from a cached verified plan with the same inputs.

    Raises:
        DoesNotFitError: nothing fits, or the engine proved the plan cannot.
        ProbeFailedError: the engine failed for a reason other than memory.
    """
    key = cache_key(
        spec, hardware, constraints, version=engine_version or "unknown", use_estimate=use_estimate
    )
    if prober is not None and use_cache:
        found = cached_plan(key)
        if found is not None:
            return FitResult(plan=found, planned=None, cached=True)

    c = constraints

    def planned_for(c: Constraints) -> PlanResult:
        """The plan; with --no-estimate at the length asked for (or measured), which the
        engine, not the estimate, judges."""
        if use_estimate:
            return plan(spec, hardware, c)
        result = plan(spec, hardware, dataclasses.replace(c, max_model_len=None))
        wanted = c.context_cap(spec.max_position_embeddings)
        settings = dataclasses.replace(result.settings, max_model_len=wanted)
        return dataclasses.replace(result, settings=settings)

    result = planned_for(c)
    settings = result.settings
    if prober is None:
        return FitResult(
            plan=make_plan(spec, hardware, c, result, engine_version=engine_version),
            planned=result,
        )

    probes: list[ProbeResult] = []
    extra: list[Lever] = []
    model = spec.model_id  # a Hub id, or a local folder's own path
    for _ in range(max_launches):
        outcome = prober(model, settings, engine=c.engine, device=hardware.device)
        probes.append(outcome)
        if outcome.status is ProbeStatus.READY:
            verification = _verification(outcome, len(probes))
            version = outcome.engine_version or engine_version or ""
            measured = _measured(spec, hardware, result, outcome, version)
            if measured is not None:
                remember(spec.model_id, hardware.gpu.name, measured)
            memory = _measured_memory(result, outcome, version)
            if memory is not None:
                remember_memory(spec.model_id, hardware.gpu.name, memory)
            final = make_plan(spec, hardware, c, result, engine_version=version or None,
                              verification=verification, extra_levers=tuple(extra),
                              measured=measured)  # fmt: skip
            store_plan(key, final)
            return FitResult(plan=final, planned=result, probes=tuple(probes))
        if not outcome.status.is_memory:
            raise ProbeFailedError(
                f"the engine failed ({outcome.status.value}): {outcome.detail}",
                hint=f"Its log is {outcome.log_path}.",
            )
        c, lever = correct(spec, hardware, c, settings, result, outcome)
        extra.append(lever)
        result = planned_for(c)
        settings = result.settings
    last = probes[-1]
    raise DoesNotFitError(
        f"{len(probes)} launches did not find a configuration the engine accepts; the last "
        f"failed with {last.status.value}: {last.detail}",
        hint=f"Its log is {last.log_path}.",
    )


def _measured(
    spec: ModelSpec, hardware: Hardware, result: PlanResult, outcome: ProbeResult, version: str
) -> Measured | None:
    """The load test's output tokens/s beside the speed model's prediction for exactly
    those requests (their prompt and output lengths, as many at once)."""
    load = outcome.load
    if load is None or load.output_tokens_per_s is None or load.concurrency < 1:
        return None
    output_len = max(load.output_tokens // max(load.concurrency, 1), 1)
    workload = Workload(
        input_len=CONCURRENT_PROMPT_TOKENS, output_len=output_len, concurrency=load.concurrency
    )
    try:
        perf = predict(spec, gpu=hardware.gpu, settings=outcome.settings,
                       breakdown=result.breakdown, workload=workload)  # fmt: skip
    except OominferError:
        perf = None
    return Measured(
        output_tokens_per_s=round(load.output_tokens_per_s, 2),
        predicted_output_tokens_per_s=round(perf.output_tokens_per_s, 2) if perf else None,
        concurrency=load.concurrency,
        input_len=CONCURRENT_PROMPT_TOKENS,
        output_len=output_len,
        engine_version=version,
        measured_at=now(),
    )


def _measured_memory(
    result: PlanResult, outcome: ProbeResult, version: str
) -> MeasuredMemory | None:
    """The engine's "Available KV cache memory" beside the model's for the same settings
    (None when its log did not print it)."""
    measured = outcome.facts.kv_cache_bytes
    if measured is None or result.engine != "vllm":
        return None
    return MeasuredMemory(
        kv_cache_bytes=measured,
        predicted_kv_cache_bytes=result.breakdown.kv_cache_bytes,
        layout=memory_layout(outcome.settings, result.breakdown),
        engine_version=version,
        measured_at=now(),
    )


def _verification(outcome: ProbeResult, launches: int) -> Verification:
    """What the engine reported on the launch that served the plan at its limits."""
    facts = outcome.facts
    return Verification(
        status=outcome.status.value,
        engine_version=outcome.engine_version,
        verified_at=now(),
        launches=launches,
        weights_bytes=facts.weights_bytes,
        kv_cache_bytes=facts.kv_cache_bytes,
        kv_cache_tokens=facts.kv_cache_tokens,
        peak_bytes=outcome.peak_rss_bytes,
        load_seconds=round(outcome.seconds, 1),
        requests_ok=outcome.requests_ok,
        log_path=str(outcome.log_path),
    )
