"""The plan document made from a planner result: the facts it records and the prediction."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from oominfer.hardware.hardware import Hardware
from oominfer.model.spec import ModelSpec
from oominfer.planning.constraints import Constraints
from oominfer.planning.document import Lever, Plan, Prediction, Verification
from oominfer.planning.planner import PlanResult
from oominfer.speed import Measured


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


def hardware_facts(hardware: Hardware) -> dict[str, Any]:
    """The hardware as the plan records it."""
    gpu = hardware.gpu
    return {
        "name": gpu.name,
        "count": hardware.count,
        "memory_bytes": gpu.memory_bytes,
        "cuda_total_bytes": gpu.cuda_total_bytes,
        "compute_capability": list(gpu.compute_capability),
        "product_label": gpu.product_label,
        "device": hardware.device,
    }


def now() -> str:
    """The current UTC time, to the second (ISO 8601)."""
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def make_plan(
    spec: ModelSpec,
    hardware: Hardware,
    constraints: Constraints,
    result: PlanResult,
    *,
    engine_version: str | None,
    verification: Verification | None = None,
    extra_levers: tuple[Lever, ...] = (),
    measured: Measured | None = None,
) -> Plan:
    """The plan document for a planner result."""
    return Plan(
        model_id=spec.model_id,
        architecture=architecture_facts(spec),
        revision=spec.revision,
        device=hardware.device,
        gpu=hardware_facts(hardware),
        engine=result.engine,
        engine_version=engine_version,
        settings=result.settings,
        predicted=Prediction.of(result.breakdown),
        baseline=Prediction.of(result.baseline) if result.baseline else None,
        replicas=result.replicas,
        idle_gpus=result.idle_gpus,
        idle_reason=result.idle_reason,
        concurrency=result.concurrency,
        performance=result.performance,
        measured=measured,
        alternatives=result.alternatives,
        # A lever the engine's measurement turned replaces the planner's lever of that name.
        levers=tuple(lv for lv in result.levers if lv.name not in {e.name for e in extra_levers})
        + extra_levers,
        constraints=dataclasses.asdict(constraints),
        verification=verification,
        created_at=now(),
    )
