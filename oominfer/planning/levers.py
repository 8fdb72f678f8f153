"""The levers a plan turned: each with why, the bytes it saved and what it costs."""

from __future__ import annotations

import dataclasses
from typing import Any

from oominfer.errors import InvalidSettingError
from oominfer.hardware.hardware import Hardware
from oominfer.memory.estimate import estimate
from oominfer.memory.profile import vllm_defaults
from oominfer.model.spec import ModelSpec
from oominfer.planning.document import Lever
from oominfer.planning.search import Candidate
from oominfer.settings import Engine, VllmSettings
from oominfer.units import GiB, format_bytes


def explain(
    spec: ModelSpec,
    hardware: Hardware,
    best: Candidate,
    *,
    engine: Engine,
) -> tuple[Lever, ...]:
    """Each lever the chosen plan turned, why, the bytes it saved and what it costs."""
    s, b = best.settings, best.breakdown
    levers = [
        Lever(name="inference_mode", value=True, reason="no autograd buffers are kept",
              cost="none"),
        Lever(name="dtype", value=b.dtype,
              reason="bf16 needs compute capability 8.0" if b.dtype == "float16"
              else "the hardware runs the checkpoint's 16-bit dtype", cost="none"),
    ]  # fmt: skip
    defaults = VllmSettings()
    default_tokens, default_seqs = vllm_defaults(hardware)

    def saved(other: VllmSettings) -> int:
        """Non-KV bytes the chosen plan saves over ``other`` (itself with a lever put back)."""
        try:
            o = estimate(spec, hardware=hardware, settings=other, engine=engine)
        except InvalidSettingError:
            return 0
        return max(0, o.non_kv_bytes - b.non_kv_bytes)

    def add(name: str, value: object, reason: str, cost: str, saved_bytes: int = 0) -> None:
        levers.append(Lever(name=name, value=value, reason=reason, saved_bytes=saved_bytes,
                            cost=cost))  # fmt: skip

    def without(**fields: Any) -> int:
        return saved(dataclasses.replace(s, **fields))

    if (s.max_num_seqs or default_seqs) < default_seqs:
        add("max_num_seqs", s.max_num_seqs,
            f"fewer concurrent sequences than vLLM's {default_seqs}: a smaller sampler peak "
            "and fewer CUDA graphs", "fewer requests served at once",
            without(max_num_seqs=None))  # fmt: skip
    if s.max_num_batched_tokens is not None and s.max_num_batched_tokens < default_tokens:
        add("max_num_batched_tokens", s.max_num_batched_tokens,
            "a smaller prefill chunk lowers the activation peak",
            "slower prefill of long prompts", without(max_num_batched_tokens=None))  # fmt: skip
    if best.context < spec.max_position_embeddings:
        add("max_model_len", best.context,
            f"the model's {spec.max_position_embeddings:,} tokens do not fit (or were capped); "
            "this is the longest that does",
            f"prompts + outputs limited to {best.context:,} tokens",
            b.kv_bytes_per_token * (spec.max_position_embeddings - best.context))  # fmt: skip
    if s.enforce_eager:
        graphs = without(enforce_eager=False)
        add("enforce_eager", True, f"frees {format_bytes(graphs)} of CUDA graphs",
            "decode is slower", graphs)  # fmt: skip
    if s.kv_cache_dtype != defaults.kv_cache_dtype:
        add("kv_cache_dtype", s.kv_cache_dtype, "an FP8 KV cache holds twice the tokens",
            "slight accuracy loss on long contexts",
            b.kv_cache_tokens * b.kv_bytes_per_token)  # fmt: skip
    if s.quantization is not None:
        add("quantization", s.quantization, "the 16-bit weights leave too little room",
            "some accuracy loss", without(quantization=None))  # fmt: skip
    if s.tensor_parallel_size > 1:
        add("tensor_parallel_size", s.tensor_parallel_size,
            f"the weights are split over {s.tensor_parallel_size} GPUs", "more GPUs",
            without(tensor_parallel_size=1))  # fmt: skip
    if s.pipeline_parallel_size > 1:
        add("pipeline_parallel_size", s.pipeline_parallel_size,
            "the layers are split into stages", "more GPUs; pipeline bubbles")  # fmt: skip
    if s.cpu_offload_gb:
        add("cpu_offload_gb", s.cpu_offload_gb,
            "the weights do not fit even quantized; part stays in host memory",
            "every forward pass copies them in", int(s.cpu_offload_gb * GiB))  # fmt: skip
    if s.gpu_memory_utilization != defaults.gpu_memory_utilization:
        add("gpu_memory_utilization", s.gpu_memory_utilization,
            "set by --gpu-memory-utilization, or to what is free on the GPU",
            "a smaller KV cache" if s.gpu_memory_utilization < defaults.gpu_memory_utilization
            else "less headroom for other processes")  # fmt: skip
    return tuple(levers)
