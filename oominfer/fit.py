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
import datetime as dt
import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oominfer.backends import ProbeStatus
from oominfer.dtypes import Dtype, Engine
from oominfer.errors import DoesNotFitError, OominferError, ProbeFailedError
from oominfer.estimate import Hardware
from oominfer.plan import Lever, Plan, Verification, plan_from_json
from oominfer.planner import Constraints, PlanResult, plan
from oominfer.probe import Prober, ProbeResult
from oominfer.report import breakdown_json
from oominfer.settings import VllmSettings
from oominfer.spec import ModelSpec
from oominfer.units import GiB, format_bytes

MAX_LAUNCHES = 3


@dataclass(frozen=True, slots=True, kw_only=True)
class FitResult:
    """The plan, and every launch it took to prove it."""

    plan: Plan
    planned: PlanResult | None
    probes: tuple[ProbeResult, ...] = ()
    cached: bool = False


def architecture_facts(spec: ModelSpec) -> dict[str, Any]:
    """The facts of the model the estimate used, recorded in the plan."""
    return {
        "architecture": spec.architecture,
        "model_type": spec.model_type,
        "num_layers": spec.num_layers,
        "hidden_size": spec.hidden_size,
        "num_attention_heads": spec.num_attention_heads,
        "num_kv_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "vocab_size": spec.vocab_size,
        "max_position_embeddings": spec.max_position_embeddings,
        "parameters": spec.checkpoint.float_params or spec.params.total,
        "checkpoint_bytes": spec.checkpoint.tensor_bytes,
        "quantization": spec.quantization.method if spec.quantization else None,
        "mla": spec.is_mla,
        "moe_experts": spec.num_experts,
        "layer_kinds": sorted(set(spec.layer_kinds)),
        "source": spec.source,
    }


def hardware_facts(hardware: Hardware, device: str) -> dict[str, Any]:
    """The hardware as the plan records it."""
    gpu = hardware.gpu
    return {
        "name": gpu.name,
        "count": hardware.count,
        "memory_bytes": gpu.memory_bytes,
        "cuda_total_bytes": gpu.cuda_total_bytes,
        "compute_capability": list(gpu.compute_capability),
        "product_label": gpu.product_label,
        "device": device,
    }


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def make_plan(
    spec: ModelSpec,
    hardware: Hardware,
    constraints: Constraints,
    result: PlanResult,
    *,
    engine: Engine,
    device: str,
    engine_version: str | None,
    verification: Verification | None = None,
    extra_levers: tuple[Lever, ...] = (),
) -> Plan:
    """The plan document for a planner result."""
    return Plan(
        model_id=spec.model_id,
        architecture=architecture_facts(spec),
        device=device,
        gpu=hardware_facts(hardware, device),
        engine=engine,
        engine_version=engine_version,
        settings=result.settings,
        predicted=breakdown_json(spec, hardware, result.settings, result.breakdown)["per_gpu"],
        # A lever the engine's measurement turned replaces the planner's lever of that name.
        levers=tuple(lv for lv in result.levers if lv.name not in {e.name for e in extra_levers})
        + extra_levers,
        constraints=dataclasses.asdict(constraints),
        verification=verification,
        created_at=_now(),
    )


def cache_key(spec: ModelSpec, hardware: Hardware, constraints: Constraints, **inputs: Any) -> str:
    """Verified plans are cached by model revision, hardware, engine version, constraints and
    every other input of the fit (engine, device, dtype, estimate or not)."""
    data = json.dumps(
        [architecture_facts(spec), spec.model_id,
         hardware_facts(hardware, str(inputs.get("device"))),
         dataclasses.asdict(constraints), sorted(inputs.items())],
        sort_keys=True, default=str,
    )  # fmt: skip
    return hashlib.sha256(data.encode()).hexdigest()[:24]


def cache_dir() -> Path:
    """Where verified plans are kept (OOMINFER_CACHE_DIR, else the user's cache folder)."""
    if os.environ.get("OOMINFER_CACHE_DIR"):
        return Path(os.environ["OOMINFER_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "oominfer" / "plans"


def cached_plan(key: str) -> Plan | None:
    """A verified plan from an earlier fit with the same inputs."""
    path = cache_dir() / f"{key}.json"
    try:
        found = plan_from_json(path.read_text(), source=str(path))
    except (OSError, ValueError, OominferError):  # a stale or foreign entry is just a miss
        return None
    return found if found.verified else None


def store_plan(key: str, plan_: Plan) -> None:
    """Keep a verified plan for the next fit with the same inputs."""
    folder = cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{key}.json").write_text(plan_.to_json())
    except OSError:
        pass  # a cache that cannot be written is not an error


def _free_fraction(detail: str) -> float | None:
    """The free fraction from vLLM's "Free memory on device (X/Y GiB)" message."""
    m = re.search(r"\(([\d.]+)/([\d.]+) GiB\)", detail)
    return float(m.group(1)) / float(m.group(2)) if m else None


def fit(
    spec: ModelSpec,
    hardware: Hardware,
    constraints: Constraints,
    *,
    engine: Engine = "vllm",
    device: str = "cuda",
    dtype: Dtype = "auto",
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
        constraints: what the user asks (objective, context floor and cap, ...).
        engine: ``vllm`` or ``transformers``.
        device: ``cuda`` or ``cpu``.
        dtype: the compute dtype; ``auto`` picks the GPU's best 16-bit type.
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
    version = engine_version or "unknown"
    key = cache_key(spec, hardware, constraints, engine=engine, version=version, device=device,
                    dtype=dtype, use_estimate=use_estimate)  # fmt: skip
    if prober is not None and use_cache:
        found = cached_plan(key)
        if found is not None:
            return FitResult(plan=found, planned=None, cached=True)

    c = constraints
    result = plan(spec, hardware, c, engine=engine, device=device, dtype=dtype)
    settings = result.settings
    if not use_estimate:
        wanted = c.max_model_len or spec.max_position_embeddings
        settings = dataclasses.replace(settings, max_model_len=wanted)
        result = dataclasses.replace(result, settings=settings)
    if prober is None:
        return FitResult(
            plan=make_plan(
                spec,
                hardware,
                c,
                result,
                engine=engine,
                device=device,
                engine_version=engine_version,
            ),
            planned=result,
        )

    probes: list[ProbeResult] = []
    extra: list[Lever] = []
    model = spec.model_id  # a Hub id, or a local folder's own path
    for _ in range(max_launches):
        outcome = prober(model, settings, engine=engine, device=device)
        probes.append(outcome)
        if outcome.status is ProbeStatus.READY:
            verification = _verification(outcome, len(probes))
            final = make_plan(spec, hardware, c, result, engine=engine, device=device,
                              engine_version=outcome.engine_version or engine_version,
                              verification=verification, extra_levers=tuple(extra))  # fmt: skip
            store_plan(key, final)
            return FitResult(plan=final, planned=result, probes=tuple(probes))
        if not outcome.status.is_memory:
            raise ProbeFailedError(
                f"the engine failed ({outcome.status.value}): {outcome.detail}",
                hint=f"Its log is {outcome.log_path}.",
            )
        c, lever = _correct(spec, hardware, c, settings, result, outcome, device=device)
        extra.append(lever)
        result = plan(spec, hardware, c, engine=engine, device=device, dtype=dtype)
        settings = result.settings
    last = probes[-1]
    raise DoesNotFitError(
        f"{len(probes)} launches did not find a configuration the engine accepts; the last "
        f"failed with {last.status.value}: {last.detail}",
        hint=f"Its log is {last.log_path}.",
    )


def _correct(
    spec: ModelSpec,
    hardware: Hardware,
    c: Constraints,
    settings: VllmSettings,
    result: PlanResult,
    outcome: ProbeResult,
    *,
    device: str,
) -> tuple[Constraints, Lever]:
    """New constraints from what the failed launch measured, and the lever that records it."""
    facts = outcome.facts
    if outcome.status is ProbeStatus.KV_CACHE_TOO_SMALL and facts.estimated_max_model_len:
        length = facts.estimated_max_model_len
        if length < c.min_context:
            raise DoesNotFitError(
                f"the engine holds at most {length:,} tokens per request, below --min-context "
                f"{c.min_context:,}.",
                hint=f"Lower --min-context to {length} or add GPUs.",
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
            raise DoesNotFitError(f"only {free:.0%} of the GPU is free: {facts.detail}")
        lever = Lever(name="gpu_memory_utilization", value=util, cost="a smaller KV cache",
                      reason="other processes hold GPU memory; the budget shrinks to what is "
                      "free")  # fmt: skip
        return dataclasses.replace(c, gpu_memory_utilization=util), lever
    # Out of memory or no KV memory: set aside what the engine used beyond the estimate.
    b = result.breakdown
    over = 0
    if facts.weights_bytes:
        over = max(0, facts.weights_bytes - b.weights_bytes)
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


def _verification(outcome: ProbeResult, launches: int) -> Verification:
    facts = outcome.facts
    return Verification(
        status=outcome.status.value,
        engine_version=outcome.engine_version,
        verified_at=_now(),
        launches=launches,
        weights_bytes=facts.weights_bytes,
        kv_cache_bytes=facts.kv_cache_bytes,
        kv_cache_tokens=facts.kv_cache_tokens,
        peak_bytes=outcome.peak_rss_bytes,
        load_seconds=round(outcome.seconds, 1),
        requests_ok=outcome.requests_ok,
        log_path=str(outcome.log_path),
    )
