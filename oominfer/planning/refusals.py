"""What the engine cannot run at all, found before searching: the engine a checkpoint
needs, and the architectures, checkpoints and dtypes vLLM refuses (rules/)."""

from __future__ import annotations

import dataclasses

from oominfer.base.errors import InvalidSettingError
from oominfer.hardware.hardware import Hardware
from oominfer.model.spec import ModelSpec
from oominfer.planning.constraints import Constraints
from oominfer.planning.document import Lever
from oominfer.rules import architectures as architecture_rules
from oominfer.rules import kv_cache as kv_cache_rules
from oominfer.rules import quantization as quantization_rules
from oominfer.rules.dtypes import compute_dtype
from oominfer.rules.parallel import tensor_parallel_refusal
from oominfer.settings import flag


def engine_for(spec: ModelSpec, c: Constraints) -> tuple[Constraints, Lever | None]:
    """The constraints with the engine that can load the checkpoint: vLLM 0.32/0.33 has no
    bitsandbytes loader, so such a checkpoint goes to the transformers engine."""
    method = spec.quantization.method if spec.quantization else None
    rule = quantization_rules.rule_for(method) if method else None
    if rule is None or c.engine in rule.engines:
        return c, None
    engine = sorted(rule.engines)[0]
    lever = Lever(
        name="engine",
        value=engine,
        reason=f"{c.engine} cannot load a {method} checkpoint ({rule.source})",
        cost="the transformers engine: no paged KV cache, simpler batching",
    )
    return dataclasses.replace(c, engine=engine), lever


def check_checkpoint(spec: ModelSpec, hardware: Hardware, c: Constraints) -> None:
    """Refuse a checkpoint or dtype the engine cannot run on this GPU, before searching.

    Raises:
        InvalidSettingError: the dtype is refused, or the checkpoint's quantization method
            needs another GPU or dtype (rules/quantization.py).
    """
    dtype = compute_dtype(spec, hardware.gpu, c.dtype)
    if c.engine != "vllm":
        return
    checks: list[tuple[str | None, str]] = [
        (
            architecture_rules.refusal(spec, c.vllm_version.release),
            "Serve it with --engine transformers, or plan for an older vLLM (--engine-version).",
        ),
        (
            tensor_parallel_refusal(spec, 1),
            "Pick another checkpoint of the model (oominfer models lists the catalog's).",
        ),
    ]
    if spec.quantization is not None:
        checks += [
            (
                quantization_rules.checkpoint_refusal(spec.quantization),
                "Pick another checkpoint of the model (oominfer models lists the catalog's).",
            ),
            (
                quantization_rules.refusal(
                    spec.quantization.method,
                    gpu=hardware.gpu,
                    dtype=dtype,
                    engine=c.engine,
                    device=hardware.device,
                    release=c.vllm_version.release,
                ),
                "Plan for a GPU that runs it (--gpu), or pick another checkpoint of the model.",
            ),
        ]
    for refused, hint in checks:
        if refused:
            raise InvalidSettingError(
                f"vLLM cannot run {spec.model_id} on {hardware.gpu.name}: {refused}.", hint=hint
            )


def check_requested(spec: ModelSpec, hardware: Hardware, c: Constraints) -> None:
    """Refuse, before searching, a weight format, KV-cache dtype or tensor-parallel size the
    user required that the engine would refuse here (rules/), rather than report that
    nothing fits.

    Raises:
        InvalidSettingError: the setting, and the engine's reason.
    """
    dtype = compute_dtype(spec, hardware.gpu, c.dtype)
    refused: list[tuple[str, object, str | None]] = []
    if c.engine == "vllm" and not hardware.is_cpu:
        q = c.requested.get("quantization")
        if q is not None and spec.quantization is None:
            why = quantization_rules.refusal(
                q, gpu=hardware.gpu, dtype=dtype, engine=c.engine, device=hardware.device,
                release=c.vllm_version.release,
            )  # fmt: skip
            refused.append(("quantization", q, why))
        kv = c.requested.get("kv_cache_dtype")
        if kv is not None and kv != "auto":
            why = kv_cache_rules.refusal(
                kv, gpu=hardware.gpu, model_dtype=dtype, device=hardware.device,
                version=c.vllm_version,
            )  # fmt: skip
            refused.append(("kv_cache_dtype", kv, why))
        tp = c.requested.get("tensor_parallel_size")
        if tp is not None:
            refused.append(("tensor_parallel_size", tp, tensor_parallel_refusal(spec, tp)))
            if tp > min(c.gpus_per_node, hardware.count):
                refused.append(
                    ("tensor_parallel_size", tp,
                     f"a TP group stays inside one node, and {hardware.count} GPUs with "
                     f"--gpus-per-node {c.gpus_per_node} give at most "
                     f"{min(c.gpus_per_node, hardware.count)} per node"),
                )  # fmt: skip
        world = (tp or 1) * c.requested.get("pipeline_parallel_size", 1)
        if world > hardware.count:
            refused.append(
                ("pipeline_parallel_size" if tp is None else "tensor_parallel_size", world,
                 f"tensor x pipeline parallel needs {world} GPUs and --gpus gives "
                 f"{hardware.count}"),
            )  # fmt: skip
    for name, value, why in refused:
        if why:
            raise InvalidSettingError(
                f"{flag(name)} {value} cannot run {spec.model_id} on {hardware.describe()}: {why}.",
                hint=f"Leave {flag(name)} out to let the planner choose, or change it.",
            )
