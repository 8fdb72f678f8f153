"""The levers a plan turned: each with why, the bytes it saved and what it costs."""

from __future__ import annotations

import dataclasses
from typing import Any

from oominfer.base.errors import InvalidSettingError
from oominfer.base.units import GiB, format_bytes
from oominfer.hardware.hardware import Hardware
from oominfer.memory.estimate import estimate
from oominfer.memory.profile import vllm_defaults
from oominfer.model.spec import ModelSpec
from oominfer.planning.constraints import PRACTICAL_CONTEXT
from oominfer.planning.costs import why
from oominfer.planning.document import Lever
from oominfer.planning.search import Candidate
from oominfer.rules.versions import EngineVersion
from oominfer.settings import Engine, EngineSettings, flag


def explain(
    spec: ModelSpec,
    hardware: Hardware,
    best: Candidate,
    *,
    engine: Engine,
    version: EngineVersion,
    asked: frozenset[str] = frozenset(),
    longest: bool = False,
    latency: str = "",
) -> tuple[Lever, ...]:
    """Each lever the chosen plan turned, why, the bytes it saved and what it costs.

    A setting in ``asked`` (one the user named: ``max_model_len``, ``max_num_seqs``...) is
    reported as set by its flag, not as a lever the planner chose. Inference mode, always on,
    is no lever and is not listed. ``longest``: the plan already seeks the longest context
    (``--prefer context``), so a shorter one is not offered that flag as the way back.
    ``latency``: the latency requirement the plan was picked for (``--max-tpot 0.03``), which
    fewer sequences at once serve.
    """
    s, b = best.settings, best.breakdown
    levers = [
        Lever(name="dtype", value=b.dtype,
              reason="bf16 needs compute capability 8.0" if b.dtype == "float16"
              else "the hardware runs the checkpoint's 16-bit dtype", cost="none"),
    ]  # fmt: skip
    # vLLM's own defaults for this release (0.9 of the GPU before 0.20, 0.92 since).
    defaults = EngineSettings(gpu_memory_utilization=version.default_gpu_memory_utilization)
    default_tokens, default_seqs = vllm_defaults(hardware, version=version)

    def saved(other: EngineSettings) -> int:
        """Non-KV bytes the chosen plan saves over ``other`` (itself with a lever put back)."""
        try:
            o = estimate(spec, hardware=hardware, settings=other, engine=engine, version=version)
        except InvalidSettingError:
            return 0
        return max(0, o.non_kv_bytes - b.non_kv_bytes)

    def add(name: str, value: object, reason: str, cost: str, saved_bytes: int = 0) -> None:
        if name in asked:
            reason = f"set by {flag(name)}"
        levers.append(Lever(name=name, value=value, reason=reason, saved_bytes=saved_bytes,
                            cost=cost))  # fmt: skip

    def without(**fields: Any) -> int:
        return saved(dataclasses.replace(s, **fields))

    if (s.max_num_seqs or default_seqs) < default_seqs:
        held = (
            "each request batched at once holds its float32 logits over the vocabulary"
            if engine == "transformers"
            else why("fewer_seqs")
        )
        # vLLM's default for the GPU; the transformers server takes the plan's value.
        owner = "the" if engine == "transformers" else "vLLM's"
        below = f"below {owner} default {default_seqs}"
        reason = (
            f"{below}: no more requests at once than meet {latency}"
            if latency
            else f"{below}, the last lever before giving up: {held}"
        )
        add("max_num_seqs", s.max_num_seqs, reason, "fewer requests served at once",
            without(max_num_seqs=None))  # fmt: skip
    if s.max_num_batched_tokens is not None and s.max_num_batched_tokens < default_tokens:
        add("max_num_batched_tokens", s.max_num_batched_tokens,
            why("smaller_chunk"), "slower prefill of long prompts",
            without(max_num_batched_tokens=None))  # fmt: skip
    if best.context < spec.max_position_embeddings:
        trained = f"the model's {spec.max_position_embeddings:,} tokens"
        if longest:
            reason = f"the longest context this plan fits ({trained} do not)"
        elif best.context < PRACTICAL_CONTEXT:
            reason = (f"below the practical {PRACTICAL_CONTEXT:,} tokens, the longest context "
                      f"that fits with every other lever turned: {why('below_floor')}")  # fmt: skip
        else:
            reason = (f"a practical context (whole 8k steps) within what fits without "
                      f"costlier levers ({trained}: --prefer context): "
                      f"{why('shorter_context')}")  # fmt: skip
        kv_saved = b.seq_kv_bytes(spec.max_position_embeddings) - b.seq_kv_bytes(best.context)
        add("max_model_len", best.context, reason,
            f"prompts + outputs limited to {best.context:,} tokens", kv_saved)  # fmt: skip
    if s.enforce_eager:
        graphs = without(enforce_eager=False)
        add("enforce_eager", True, f"frees {format_bytes(graphs)} of CUDA graphs",
            why("eager"), graphs)  # fmt: skip
    if s.kv_cache_dtype != defaults.kv_cache_dtype:
        # Not "bytes saved": the pool is the same size, it holds twice the tokens.
        add("kv_cache_dtype", s.kv_cache_dtype,
            f"{why('kv_quantization')}: the pool holds {b.kv_cache_tokens:,} tokens instead "
            f"of {b.kv_cache_tokens // 2:,}",
            "slight accuracy loss on long contexts")  # fmt: skip
    if s.quantization is not None:
        add("quantization", s.quantization,
            "the 16-bit weights leave too little room for the context asked for",
            why("weight_quantization"), without(quantization=None))  # fmt: skip
    if s.tensor_parallel_size > 1:
        add("tensor_parallel_size", s.tensor_parallel_size,
            f"the weights are split over {s.tensor_parallel_size} GPUs of a node",
            why("gpus"),
            without(tensor_parallel_size=1))  # fmt: skip
    if s.pipeline_parallel_size > 1:
        add("pipeline_parallel_size", s.pipeline_parallel_size,
            "the layers are split into stages across nodes", why("pipeline"))  # fmt: skip
    if s.cpu_offload_gb:
        add("cpu_offload_gb", s.cpu_offload_gb,
            "the weights do not fit even quantized; part stays in host memory",
            why("cpu_offload"), int(s.cpu_offload_gb * GiB))  # fmt: skip
    captured_after = (
        "gpu_memory_utilization" not in asked
        and version.graphs_after_kv_cache and not s.enforce_eager
        and s.gpu_memory_utilization < defaults.gpu_memory_utilization
    )  # fmt: skip
    lowered = f"lowered from {defaults.gpu_memory_utilization:g}"
    if s.gpu_memory_utilization != defaults.gpu_memory_utilization:
        if _short_at_start(spec, hardware, s, defaults, engine=engine, version=version):
            reason = (f"{lowered}: that budget is not free when vLLM starts, beside the CUDA "
                      "context and NCCL's buffers")  # fmt: skip
        elif captured_after:
            reason = (f"{lowered} to leave room above the budget for the "
                      f"{format_bytes(b.cuda_graph_bytes)} of CUDA graphs this vLLM release "
                      "captures after sizing the KV cache")  # fmt: skip
        else:
            reason = f"set to what is free on the GPU ({flag('gpu_memory_utilization')})"
        add("gpu_memory_utilization", s.gpu_memory_utilization, reason,
            "a smaller KV cache" if s.gpu_memory_utilization < defaults.gpu_memory_utilization
            else "less headroom for other processes")  # fmt: skip
    return tuple(levers)


def _short_at_start(
    spec: ModelSpec,
    hardware: Hardware,
    s: EngineSettings,
    defaults: EngineSettings,
    *,
    engine: Engine,
    version: EngineVersion,
) -> bool:
    """Whether the release's default utilization would ask for more than is free at start."""
    at_default = dataclasses.replace(s, gpu_memory_utilization=defaults.gpu_memory_utilization)
    try:
        b = estimate(spec, hardware=hardware, settings=at_default, engine=engine, version=version)
    except InvalidSettingError:
        return False
    return b.startup_short_bytes > 0
