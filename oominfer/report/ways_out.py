"""Ways out of an estimate that does not fit: single flag changes, each proven by estimating
again. Pure."""

from __future__ import annotations

import dataclasses

from oominfer.base.errors import InvalidSettingError
from oominfer.hardware.hardware import Hardware
from oominfer.memory.breakdown import MemoryBreakdown
from oominfer.memory.estimate import estimate
from oominfer.memory.profile import utilization_for_capture, utilization_for_startup
from oominfer.model.spec import ModelSpec
from oominfer.rules.parallel import tensor_parallel_refusal
from oominfer.rules.versions import EngineVersion
from oominfer.settings import Engine, EngineSettings, compact_json, declared, flag

_PARALLEL = (2, 4, 8)


def _tries(
    spec: ModelSpec, hardware: Hardware, s: EngineSettings, b: MemoryBreakdown, engine: Engine
) -> list[tuple[str, EngineSettings, Hardware]]:
    """The changes worth estimating, cheapest in quality first: on the transformers engine
    only what it takes (a shorter context, int8 or nf4 weights, fewer sequences)."""
    gpu = hardware.gpu
    tries = []
    if b.max_model_len_that_fits > 0:
        fits = b.max_model_len_that_fits
        tries.append(
            (f"{flag('max_model_len')} {fits}", dataclasses.replace(s, max_model_len=fits))
        )
    if engine == "transformers":
        if s.quantization is None and spec.quantization is None:
            for method in ("int8", "bitsandbytes"):
                tries.append((f"-q {method}", dataclasses.replace(s, quantization=method)))
        if (s.max_num_seqs or 2) > 1:
            tries.append((f"{flag('max_num_seqs')} 1", dataclasses.replace(s, max_num_seqs=1)))
        return [(change, settings, hardware) for change, settings in tries]
    if b.startup_short_bytes > 0:
        # A budget that is free beside the CUDA context (and NCCL's buffers) at start.
        util = utilization_for_startup(b)
        tries.append(
            (
                f"{flag('gpu_memory_utilization')} {util:.2f}",
                dataclasses.replace(s, gpu_memory_utilization=util),
            )
        )
    if b.post_capture_short_bytes > 0:
        # More room above the budget for the graphs captured after the KV cache is sized.
        util = utilization_for_capture(b)
        tries.append(
            (
                f"{flag('gpu_memory_utilization')} {util:.2f}",
                dataclasses.replace(s, gpu_memory_utilization=util),
            )
        )
    if s.kv_cache_dtype == "auto":  # estimate() refuses it where vLLM does
        tries.append(
            (f"{flag('kv_cache_dtype')} fp8", dataclasses.replace(s, kv_cache_dtype="fp8"))
        )
    if not s.enforce_eager and b.cuda_graph_bytes:
        tries.append((flag("enforce_eager"), dataclasses.replace(s, enforce_eager=True)))
    tries.extend(_operator_tries(s, b))
    if s.quantization is None and spec.quantization is None and gpu.supports_fp8:
        tries.append(("-q fp8_per_tensor", dataclasses.replace(s, quantization="fp8_per_tensor")))
    out = [(change, settings, hardware) for change, settings in tries]
    if hardware.is_cpu:
        return out
    pp = s.pipeline_parallel_size
    for n in _PARALLEL:
        if n <= s.tensor_parallel_size or tensor_parallel_refusal(spec, n):
            continue
        need = n * pp
        more = hardware if hardware.count >= need else dataclasses.replace(hardware, count=need)
        change = f"-tp {n}" + ("" if more is hardware else f" --gpus {need}")
        out.append((change, dataclasses.replace(s, tensor_parallel_size=n), more))
    return out


def _operator_tries(s: EngineSettings, b: MemoryBreakdown) -> list[tuple[str, EngineSettings]]:
    """Smaller operator additions, tried before quantizing (README: what operators add): no
    videos where vLLM profiles a dummy video (images kept), fewer LoRA slots, a lower rank,
    a prompt-lookup (ngram) draft instead of a model's."""
    tries = []
    if b.additions.encoder_modality == "video":
        limits = compact_json({**s.mm_limits, "video": 0})
        tries.append((f"{flag('limit_mm_per_prompt')} '{limits}'",
                      dataclasses.replace(s, limit_mm_per_prompt=limits)))  # fmt: skip
    if b.additions.lora_bytes and s.max_loras > 1:
        fewer = max(1, s.max_loras // 2)
        tries.append((f"{flag('max_loras')} {fewer}", dataclasses.replace(s, max_loras=fewer)))
    lower = [r for r in declared("max_lora_rank").choices if r < s.max_lora_rank]
    if b.additions.lora_bytes and lower:
        rank = lower[-1]
        tries.append((f"{flag('max_lora_rank')} {rank}",
                      dataclasses.replace(s, max_lora_rank=rank)))  # fmt: skip
    if b.additions.speculative_weights_bytes:
        tokens = s.speculative.get("num_speculative_tokens") or 1
        ngram = compact_json({"method": "ngram", "num_speculative_tokens": tokens,
                              "prompt_lookup_max": 4})  # fmt: skip
        tries.append((f"{flag('speculative_config')} '{ngram}'",
                      dataclasses.replace(s, speculative_config=ngram)))  # fmt: skip
    return tries


def ways_out(
    spec: ModelSpec,
    hardware: Hardware,
    settings: EngineSettings,
    b: MemoryBreakdown,
    *,
    engine: Engine = "vllm",
    version: EngineVersion,
) -> list[str]:
    """The single flag changes that make ``b`` fit, each checked by estimating it; more
    GPUs only at the smallest tensor-parallel size that fits. Empty when it fits."""
    if b.fits:
        return []
    found: list[str] = []
    parallel_found = False
    for change, s, hw in _tries(spec, hardware, settings, b, engine):
        if change.startswith("-tp") and parallel_found:
            continue
        try:
            fits = estimate(spec, hardware=hw, settings=s, engine=engine, version=version).fits
        except InvalidSettingError:
            continue
        if fits:
            found.append(change)
            parallel_found = parallel_found or change.startswith("-tp")
    return found
