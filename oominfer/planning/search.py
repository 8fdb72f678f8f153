"""The search: every configuration on the lever grid, each at the longest context it fits.

Pure. A configuration is a layout (tensor x pipeline parallel), a weight format, a KV-cache
dtype, CUDA graphs or not, a max_num_seqs and a prefill chunk; the estimator gives each the
longest context it holds (up to the cap), and the objective (``objective``) picks among them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

from oominfer.base.errors import InvalidSettingError
from oominfer.base.units import GiB, MiB
from oominfer.hardware.hardware import Hardware
from oominfer.memory.breakdown import MemoryBreakdown
from oominfer.memory.estimate import estimate
from oominfer.memory.profile import utilization_for_capture, utilization_for_startup, vllm_defaults
from oominfer.model.spec import ModelSpec
from oominfer.planning.constraints import Constraints
from oominfer.planning.costs import WEIGHT_ONLY_FP8
from oominfer.planning.layout import Layout, idle_gpus, layouts, on_layout, replicas
from oominfer.rules import kv_cache as kv_cache_rules
from oominfer.rules import quantization as quantization_rules
from oominfer.rules.dtypes import compute_dtype
from oominfer.settings import EngineSettings, KvCacheDtype, Quantization

SEQ_STEPS: Final = (1024, 512, 256, 128, 64, 32, 16, 8, 4, 2, 1)
CHUNK_STEPS: Final = (1024, 512)
"""Prefill chunks (max_num_batched_tokens) tried below vLLM's default."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    """One configuration that fits, at the longest context it holds."""

    settings: EngineSettings
    breakdown: MemoryBreakdown
    replicas: int = 1
    """Replicas the given GPUs serve with this layout."""
    idle_gpus: int = 0
    """GPUs given that neither the layout nor its replicas use."""
    typical_length: int
    """Tokens of a typical request (the concurrency is counted in these)."""

    @property
    def context(self) -> int:
        """The context this candidate serves."""
        return self.settings.max_model_len or self.breakdown.max_model_len

    @property
    def running(self) -> int:
        """Requests of a typical length one replica runs at once."""
        return self.breakdown.running_at(min(self.typical_length, self.context))

    @property
    def total_running(self) -> int:
        """Requests of a typical length all replicas run at once."""
        return self.replicas * self.running


def weight_formats(
    spec: ModelSpec, hardware: Hardware, c: Constraints
) -> list[Quantization | None]:
    """Weight formats to try: the checkpoint's own, then in-flight ones the engine accepts
    here (rules/quantization.py)."""
    if spec.quantization is not None or not c.quantizes_weights:
        return [None]
    online: tuple[Quantization, ...] = (
        ("int8", "bitsandbytes") if c.engine == "transformers" else ("fp8_per_tensor",)
    )
    if c.engine == "vllm" and (
        hardware.is_cpu or (not hardware.gpu.supports_fp8 and c.prefer not in WEIGHT_ONLY_FP8)
    ):
        return [None]
    dtype = compute_dtype(spec, hardware.gpu, c.dtype)
    return [None] + [
        q
        for q in online
        if quantization_rules.refusal(
            q,
            gpu=hardware.gpu,
            dtype=dtype,
            engine=c.engine,
            device=hardware.device,
            release=c.vllm_version.release,
        )
        is None
    ]


def kv_cache_dtypes(spec: ModelSpec, hardware: Hardware, c: Constraints) -> list[KvCacheDtype]:
    """KV-cache dtypes to try: the model's, then FP8 where vLLM runs it
    (rules/kv_cache.py)."""
    if hardware.is_cpu or c.engine != "vllm" or not c.quantizes_kv:
        return ["auto"]
    refused = kv_cache_rules.refusal(
        "fp8",
        gpu=hardware.gpu,
        model_dtype=compute_dtype(spec, hardware.gpu, c.dtype),
        device=hardware.device,
        version=c.vllm_version,
    )
    return ["auto"] if refused else ["auto", "fp8"]


def estimate_for(
    spec: ModelSpec, hardware: Hardware, settings: EngineSettings, c: Constraints
) -> MemoryBreakdown:
    """The estimate with the constraints' engine and vLLM release."""
    return estimate(
        spec, hardware=hardware, settings=settings, engine=c.engine, version=c.vllm_version
    )


OPERATOR_SETTINGS: Final = (
    "speculative_config", "enable_lora", "max_loras", "max_lora_rank", "max_cpu_loras",
    "limit_mm_per_prompt", "enable_prefix_caching", "enable_expert_parallel",
    "data_parallel_size",
)  # fmt: skip
"""What the operator adds to the deployment (memory/additions.py): no lever turns them, every
candidate carries them as given."""


def operator_settings(c: Constraints) -> dict[str, object]:
    """The operator additions the user named, for every candidate's settings."""
    return {name: c.requested[name] for name in OPERATOR_SETTINGS if name in c.requested}


def _utilization(c: Constraints) -> float:
    return c.gpu_memory_utilization or c.vllm_version.default_gpu_memory_utilization


def default_settings(spec: ModelSpec, hardware: Hardware, c: Constraints) -> EngineSettings:
    """vLLM's defaults for this hardware, with the plan's fixed inputs (utilization, a KV
    budget, a cap on the context) and the max_num_seqs vLLM would take written out."""
    _, seqs = vllm_defaults(hardware, version=c.vllm_version)
    trained = spec.max_position_embeddings
    return EngineSettings(
        gpu_memory_utilization=_utilization(c),
        max_model_len=min(trained, spec.context(c.max_model_len)),
        max_num_seqs=seqs,
        kv_cache_memory_bytes=c.kv_cache_memory_bytes,
        allow_deprecated_quantization=_deprecated(spec),
        **operator_settings(c),  # type: ignore[arg-type]
    )


def _deprecated(spec: ModelSpec) -> bool:
    """The checkpoint's method is one vLLM deprecated: it loads only with the flag."""
    method = spec.quantization.method if spec.quantization else None
    return "--allow-deprecated-quantization" in quantization_rules.flags_for(method)


def required(settings: EngineSettings, c: Constraints) -> EngineSettings:
    """``settings`` with every engine setting the user named (``Constraints.requested``):
    each is a requirement, as it is to vLLM, so no lever turns it. A prefill chunk asked
    for below max_num_seqs takes max_num_seqs down with it (vLLM: a step holds a token of
    every running sequence), unless max_num_seqs was asked for too."""
    if not c.requested:
        return settings
    fields = dict(c.requested)
    chunk = fields.get("max_num_batched_tokens")
    if chunk is not None and "max_num_seqs" not in fields and settings.max_num_seqs:
        fields["max_num_seqs"] = min(settings.max_num_seqs, chunk)
    return dataclasses.replace(settings, **fields)


def candidates(spec: ModelSpec, hardware: Hardware, c: Constraints) -> Iterator[Candidate]:
    """Every configuration on the lever grid that fits at least the hard floor; a lever the
    user set (``max_num_seqs``, ``quantization``, ``enforce_eager``) stays where it was set."""
    cap = c.context_cap(spec.max_position_embeddings)
    default_chunk, default_seqs = vllm_defaults(hardware, version=c.vllm_version)
    seq_steps = sorted({s for s in (default_seqs, *SEQ_STEPS) if s <= default_seqs}, reverse=True)
    eager_options = [False, True] if not hardware.is_cpu and c.engine == "vllm" else [False]
    chunks: list[int | None] = [None]
    if not hardware.is_cpu:
        chunks += [n for n in CHUNK_STEPS if n < default_chunk]
    if "max_num_seqs" in c.requested:
        seq_steps = [c.requested["max_num_seqs"]]
    if "max_num_batched_tokens" in c.requested:
        chunks = [c.requested["max_num_batched_tokens"]]
    if "enforce_eager" in c.requested:
        eager_options = [bool(c.requested["enforce_eager"])]
    variants = [
        (eager, seqs, chunk)
        for eager in eager_options
        for seqs in seq_steps
        for chunk in chunks
        if chunk is None or chunk >= seqs  # vLLM: batched tokens >= max_num_seqs
    ]
    formats = c.wants_list("quantization", weight_formats(spec, hardware, c))
    kv_dtypes = c.wants_list("kv_cache_dtype", kv_cache_dtypes(spec, hardware, c))
    base = required(dataclasses.replace(default_settings(spec, hardware, c), max_model_len=cap), c)
    for layout in layouts(spec, hardware, c):
        laid = on_layout(base, layout, c)
        for quant in formats:
            for kv in kv_dtypes:
                for eager, seqs, chunk in variants:
                    settings = dataclasses.replace(
                        laid,
                        quantization=quant,
                        kv_cache_dtype=kv,
                        max_num_seqs=seqs,
                        max_num_batched_tokens=chunk,
                        enforce_eager=eager,
                    )
                    found = settle(spec, hardware, c, settings, layout)
                    if found is not None:
                        yield found
                        if found.context == cap and seqs == seq_steps[0] and chunk == chunks[0]:
                            # Graphs, vLLM's concurrency cap and prefill chunk already reach
                            # the cap: every other variant only pays more for the same.
                            break


def settle(
    spec: ModelSpec,
    hardware: Hardware,
    c: Constraints,
    settings: EngineSettings,
    layout: Layout | None = None,
) -> Candidate | None:
    """These settings at the longest context up to theirs that fits; None when that is
    below the hard floor or short of the concurrency asked for."""
    engine = c.engine
    try:
        b = estimate_for(spec, hardware, settings, c)
    except InvalidSettingError:
        return None
    if b.startup_short_bytes > 0 and c.gpu_memory_utilization is None:
        # The budget must be free when vLLM starts, beside the CUDA context and (0.11+)
        # NCCL's buffers: the largest utilization that is.
        settings = dataclasses.replace(settings, gpu_memory_utilization=utilization_for_startup(b))
        b = estimate_for(spec, hardware, settings, c)
    if b.post_capture_short_bytes > 0 and c.gpu_memory_utilization is None:
        # A release that captures its CUDA graphs after sizing the KV cache (V1 before 0.20)
        # needs that room above the budget: a slightly smaller budget keeps the graphs. (A
        # utilization given, or set to what is free on the GPU, is kept: eager mode then.)
        settings = dataclasses.replace(settings, gpu_memory_utilization=utilization_for_capture(b))
        b = estimate_for(spec, hardware, settings, c)
    if hardware.is_cpu and engine == "vllm" and settings.kv_cache_memory_bytes is None:
        # On the CPU vLLM sizes the cache from the process's resident memory, which the
        # estimate cannot see; pin it instead to what the budget leaves (whole MiB).
        if b.kv_cache_bytes < MiB:
            return None
        settings = dataclasses.replace(
            settings, kv_cache_memory_bytes=b.kv_cache_bytes // MiB * MiB
        )
        b = estimate_for(spec, hardware, settings, c)
    floor = c.hard_floor(spec.max_position_embeddings)
    cap = settings.max_model_len or b.max_model_len

    def at(length: int) -> MemoryBreakdown:
        return estimate_for(spec, hardware, dataclasses.replace(settings, max_model_len=length), c)

    # The activation peak depends on the length (vLLM: fewer tokens per step for short
    # contexts; transformers: the prefill of one whole prompt), so settle on a length that
    # fits with its own peak: from the length the cache holds, then by bisection.
    length = min(cap, b.max_model_len_that_fits)
    found_b: MemoryBreakdown | None = None
    for _ in range(4):
        if length < floor:
            break
        trial = at(length)
        if trial.fits:
            found_b = trial
            break
        length = min(length - 1, trial.max_model_len_that_fits)
    if found_b is None:
        found_b = at(floor)
        if not found_b.fits:
            return None
        lo, hi = floor, cap
        while lo < hi:  # found_b: the breakdown at lo
            mid = (lo + hi + 1) // 2
            trial = at(mid)
            if trial.fits:
                lo, found_b = mid, trial
            else:
                hi = mid - 1
        length = lo
    b = found_b
    settings = dataclasses.replace(settings, max_model_len=length)
    layout = layout or Layout(settings.tensor_parallel_size, settings.pipeline_parallel_size)
    found = Candidate(
        settings=settings,
        breakdown=b,
        # Data parallel engines live inside one server: a replica is the whole server.
        replicas=max(1, replicas(layout, hardware, c.gpus_per_node) // settings.data_parallel_size),
        idle_gpus=idle_gpus(layout, hardware, c.gpus_per_node),
        typical_length=c.typical_length,
    )
    if c.concurrency and found.total_running < c.concurrency:
        return None
    return found


def anything_fits(spec: ModelSpec, hardware: Hardware, c: Constraints) -> bool:
    """True when some configuration holds the floor context: for each layout, every lever
    turned at once (the smallest formats, no graphs, one sequence, the smallest chunk)."""
    floor = c.floor(spec.max_position_embeddings)
    eager = not hardware.is_cpu and c.engine == "vllm"
    for layout in layouts(spec, hardware, c):
        kv = c.wants_list("kv_cache_dtype", kv_cache_dtypes(spec, hardware, c))[-1]
        for quant in c.wants_list("quantization", weight_formats(spec, hardware, c))[-1:]:
            settings = EngineSettings(
                quantization=quant,
                kv_cache_dtype=kv,
                gpu_memory_utilization=_utilization(c),
                max_model_len=floor,
                max_num_seqs=c.concurrency or 1,
                max_num_batched_tokens=max(CHUNK_STEPS[-1], c.concurrency or 1) if eager else None,
                enforce_eager=eager,
                tensor_parallel_size=layout.tp,
                pipeline_parallel_size=layout.pp,
                kv_cache_memory_bytes=c.kv_cache_memory_bytes,
                **operator_settings(c),  # type: ignore[arg-type]
            )
            found = settle(spec, hardware, c, required(settings, c), layout)
            if found is not None and found.context >= floor:
                return True
    return False


def roomiest(spec: ModelSpec, hardware: Hardware, c: Constraints) -> EngineSettings:
    """vLLM's defaults on the widest layout without CUDA graphs: the most room for weights
    and cache one layout of these GPUs has."""
    widest = max(layouts(spec, hardware, c), key=lambda layout: layout.world_size)
    eager = not hardware.is_cpu and c.engine == "vllm"
    return required(
        on_layout(
            dataclasses.replace(default_settings(spec, hardware, c), enforce_eager=eager),
            widest,
            c,
        ),
        c,
    )


def with_offload(spec: ModelSpec, hardware: Hardware, c: Constraints) -> list[Candidate]:
    """A candidate with the missing weights kept in host memory (--allow-offload), on the
    widest layout, at most half of the weights offloaded (beyond that, every forward pass
    is mostly a copy over PCIe)."""
    cap = c.context_cap(spec.max_position_embeddings)
    base = roomiest(spec, hardware, c)
    for length in dict.fromkeys((cap, c.floor(spec.max_position_embeddings))):
        settings = dataclasses.replace(base, max_model_len=length)
        b = estimate_for(spec, hardware, settings, c)
        offload = math.ceil(b.shortfall_bytes / GiB) + 1  # a GiB of headroom
        if offload * GiB > b.weights_bytes // 2:
            continue
        settings = dataclasses.replace(settings, cpu_offload_gb=float(offload))
        found = settle(spec, hardware, c, settings)  # on the layout roomiest() picked
        if found is not None:
            return [found]
    return []
