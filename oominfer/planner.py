"""The planner: search the levers jointly with the estimator and pick by an objective. Pure.

Levers, cheapest in quality first (DESIGN.md): inference mode (always), the GPU's best
16-bit dtype, fewer concurrent sequences and a smaller prefill chunk, a shorter context,
no CUDA graphs, an FP8 KV cache, weight quantization, more GPUs (tensor, then pipeline
parallel), and CPU offload of weights only when allowed. Every candidate is scored by the
estimator; the objective orders them; the chosen plan names each lever turned, why, and the
bytes it saved.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final, Literal

from oominfer.dtypes import Dtype, Engine, KvCacheDtype, Quantization
from oominfer.errors import DoesNotFitError, InvalidSettingError
from oominfer.estimate import Hardware, MemoryBreakdown, estimate, vllm_defaults
from oominfer.plan import Lever
from oominfer.settings import VllmSettings
from oominfer.spec import ModelSpec, QuantSpec
from oominfer.units import GiB, MiB, format_bytes

Prefer = Literal["context", "throughput", "quality"]
PREFERENCES: Final = ("context", "throughput", "quality")

SEQ_STEPS: Final = (1024, 512, 256, 128, 64, 32, 16, 8, 4, 2, 1)
BATCHED_STEPS: Final = (None, 1024, 512)
# Quality cost of each weight format, lower is better (the planner prefers the cheapest).
_QUANT_RANK: Final = {None: 0, "fp8_per_tensor": 1, "int8": 2, "bitsandbytes": 3}


@dataclass(frozen=True, slots=True, kw_only=True)
class Constraints:
    """What the user asks of the plan."""

    prefer: Prefer = "context"
    min_context: int = 1
    """The shortest context acceptable (--min-context)."""
    concurrency: int | None = None
    """Sequences that must run at once (--concurrency)."""
    max_model_len: int | None = None
    """A cap on the context (--max-model-len)."""
    no_quantize: bool = False
    allow_offload: bool = False
    gpu_memory_utilization: float | None = None
    """Fixed by the user; otherwise vLLM's default."""
    kv_cache_memory_bytes: int | None = None
    """CPU serving: the KV-cache budget (vLLM's --kv-cache-memory-bytes)."""
    gpus_per_node: int = 8
    """GPUs of one node: tensor parallelism stays within a node, pipeline stages span nodes."""

    def __post_init__(self) -> None:
        """Reject constraints that cannot hold together."""
        if self.prefer not in PREFERENCES:
            raise InvalidSettingError(f"--prefer must be one of {', '.join(PREFERENCES)}.")
        if self.min_context < 1:
            raise InvalidSettingError(f"--min-context must be positive, got {self.min_context}.")
        if self.concurrency is not None and self.concurrency < 1:
            raise InvalidSettingError(f"--concurrency must be positive, got {self.concurrency}.")
        if self.gpus_per_node < 1:
            raise InvalidSettingError(
                f"--gpus-per-node must be positive, got {self.gpus_per_node}."
            )
        if self.max_model_len is not None and self.max_model_len < self.min_context:
            raise InvalidSettingError(
                f"--max-model-len {self.max_model_len} is below --min-context {self.min_context}."
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    """One scored configuration."""

    settings: VllmSettings
    breakdown: MemoryBreakdown

    @property
    def context(self) -> int:
        """The context this candidate serves."""
        return self.settings.max_model_len or self.breakdown.max_model_len


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanResult:
    """The chosen configuration, its breakdown, the levers turned, and vLLM's defaults."""

    settings: VllmSettings
    breakdown: MemoryBreakdown
    levers: tuple[Lever, ...]
    baseline: MemoryBreakdown | None
    """vLLM's defaults on the same hardware (None when they cannot even be estimated)."""
    candidates: int


def _divisors(spec: ModelSpec, gpus: int) -> list[int]:
    return [tp for tp in (1, 2, 4, 8, 16) if tp <= gpus and spec.num_attention_heads % tp == 0]


def _quantizations(
    spec: ModelSpec, hardware: Hardware, engine: Engine, c: Constraints
) -> list[Quantization | None]:
    """Weight formats to try: the checkpoint's own, then in-flight ones the engine has."""
    if spec.quantization is not None or c.no_quantize:
        return [None]
    if engine == "transformers":
        return [None, "int8", "bitsandbytes"]
    return [None, "fp8_per_tensor"] if hardware.gpu.supports_fp8 else [None]


def candidates(
    spec: ModelSpec, hardware: Hardware, c: Constraints, *, engine: Engine, device: str
) -> Iterator[Candidate]:
    """Every configuration on the lever grid that fits at least ``min_context``."""
    trained = spec.max_position_embeddings
    cap = min(trained, c.max_model_len or trained)
    _, default_seqs = vllm_defaults(hardware.gpu, device=device)
    seq_steps = sorted({s for s in (default_seqs, *SEQ_STEPS) if s <= default_seqs}, reverse=True)
    if c.concurrency:
        seq_steps = [s for s in seq_steps if s >= c.concurrency] or [c.concurrency]
    kv_dtypes: list[KvCacheDtype] = ["auto"]
    if device == "cuda" and hardware.gpu.supports_fp8 and engine == "vllm":
        kv_dtypes.append("fp8")
    eager_options = [False, True] if device == "cuda" and engine == "vllm" else [False]
    util = c.gpu_memory_utilization or VllmSettings().gpu_memory_utilization
    tps = [tp for tp in _divisors(spec, hardware.count) if tp <= c.gpus_per_node]
    for quant in _quantizations(spec, hardware, engine, c):
        for tp in tps:
            for pp in [
                p for p in (1, 2, 4, 8) if tp * p <= hardware.count and p <= spec.num_layers
            ]:
                for kv in kv_dtypes:
                    for eager in eager_options:
                        for seqs in seq_steps:
                            for batched in BATCHED_STEPS if device == "cuda" else (None,):
                                if batched is not None and batched < seqs:
                                    continue
                                yield from _score(
                                    spec,
                                    hardware,
                                    engine,
                                    device,
                                    cap,
                                    c,
                                    VllmSettings(
                                        quantization=quant,
                                        kv_cache_dtype=kv,
                                        gpu_memory_utilization=util,
                                        max_model_len=cap,
                                        max_num_seqs=seqs,
                                        max_num_batched_tokens=batched,
                                        enforce_eager=eager,
                                        tensor_parallel_size=tp,
                                        pipeline_parallel_size=pp,
                                        kv_cache_memory_bytes=(c.kv_cache_memory_bytes),
                                    ),
                                )


def _score(
    spec: ModelSpec,
    hardware: Hardware,
    engine: Engine,
    device: str,
    cap: int,
    c: Constraints,
    settings: VllmSettings,
) -> Iterator[Candidate]:
    try:
        b = estimate(spec, hardware=hardware, settings=settings, engine=engine, device=device)
    except InvalidSettingError:
        return
    if device == "cpu" and engine == "vllm" and settings.kv_cache_memory_bytes is None:
        # On the CPU vLLM sizes the cache from the process's resident memory, which the
        # estimate cannot see; pin it instead to what the budget leaves (whole MiB).
        if b.kv_cache_bytes < MiB:
            return
        settings = dataclasses.replace(
            settings, kv_cache_memory_bytes=b.kv_cache_bytes // MiB * MiB
        )
        b = estimate(spec, hardware=hardware, settings=settings, engine=engine, device=device)
    length = min(cap, b.max_model_len_that_fits)
    if c.prefer == "throughput" and c.min_context > 1 and length >= c.min_context:
        length = c.min_context  # the required context; the rest of the cache goes to concurrency
    # The activation peak depends on the length (fewer tokens per step for short contexts),
    # so settle on a length that fits with its own peak.
    for _ in range(4):
        if length < c.min_context or length <= 0:
            return
        settings = dataclasses.replace(settings, max_model_len=length)
        b = estimate(spec, hardware=hardware, settings=settings, engine=engine, device=device)
        if b.fits:
            break
        length = min(length - 1, b.max_model_len_that_fits)
    else:
        return
    if c.concurrency and b.max_concurrency < c.concurrency:
        found = _longest_for_concurrency(spec, hardware, engine, device, c, settings)
        if found is None:
            return
        settings, b = found
    yield Candidate(settings=settings, breakdown=b)


def _longest_for_concurrency(
    spec: ModelSpec,
    hardware: Hardware,
    engine: Engine,
    device: str,
    c: Constraints,
    settings: VllmSettings,
) -> tuple[VllmSettings, MemoryBreakdown] | None:
    """The longest context at which ``c.concurrency`` sequences fit at once (bisection)."""
    assert c.concurrency is not None and settings.max_model_len is not None

    def at(length: int) -> tuple[VllmSettings, MemoryBreakdown] | None:
        trial = dataclasses.replace(settings, max_model_len=length)
        b = estimate(spec, hardware=hardware, settings=trial, engine=engine, device=device)
        return (trial, b) if b.fits and b.max_concurrency >= (c.concurrency or 1) else None

    lo, hi = c.min_context, settings.max_model_len
    best = at(lo)
    if best is None:
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        found = at(mid)
        if found is not None:
            lo, best = mid, found
        else:
            hi = mid - 1
    return best


def _key(cand: Candidate, prefer: Prefer) -> tuple[float, ...]:
    """Sort key: smaller is better."""
    s, b = cand.settings, cand.breakdown
    quant = _QUANT_RANK.get(s.quantization, 1)
    kv = 1 if s.kv_cache_dtype != "auto" else 0
    gpus = s.world_size
    pp = s.pipeline_parallel_size  # within a node tensor parallel beats pipeline stages
    seqs = min(s.max_num_seqs or 1, math.floor(max(b.max_concurrency, 0)))
    batched = -(s.max_num_batched_tokens or 1 << 30)
    match prefer:
        case "throughput":
            return (-seqs, int(s.enforce_eager), gpus, pp, quant, kv, batched, -cand.context)
        case "quality":
            return (quant, kv, gpus, pp, -cand.context, int(s.enforce_eager), -seqs, batched)
        case _:
            return (-cand.context, quant, kv, gpus, pp, -seqs, int(s.enforce_eager), batched)


def plan(
    spec: ModelSpec,
    hardware: Hardware,
    constraints: Constraints,
    *,
    engine: Engine = "vllm",
    device: str = "cuda",
    dtype: Dtype = "auto",
) -> PlanResult:
    """The best configuration under ``constraints``, with the levers it turned.

    Raises:
        DoesNotFitError: nothing fits; the message gives the shortfall and the ways out.
    """
    found = list(candidates(spec, hardware, constraints, engine=engine, device=device))
    if not found and constraints.allow_offload and device == "cuda":
        found = _with_offload(spec, hardware, constraints, engine=engine)
    if not found:
        raise _does_not_fit(spec, hardware, constraints, engine=engine, device=device)
    best = min(found, key=lambda cand: _key(cand, constraints.prefer))
    # Record the dtype the engine will run (bf16 needs compute capability 8.0).
    chosen: Dtype = dtype if dtype != "auto" else best.breakdown.dtype  # type: ignore[assignment]
    best_settings = dataclasses.replace(best.settings, dtype=chosen)
    best = Candidate(
        settings=best_settings,
        breakdown=estimate(
            spec, hardware=hardware, settings=best_settings, engine=engine, device=device
        ),
    )
    baseline = _baseline(spec, hardware, constraints, engine=engine, device=device)
    levers = explain(spec, hardware, best, baseline, engine=engine, device=device)
    return PlanResult(
        settings=best.settings,
        breakdown=best.breakdown,
        levers=levers,
        baseline=baseline,
        candidates=len(found),
    )


def _baseline(
    spec: ModelSpec, hardware: Hardware, c: Constraints, *, engine: Engine, device: str
) -> MemoryBreakdown | None:
    """What vLLM's defaults would do on this hardware."""
    settings = VllmSettings(
        gpu_memory_utilization=c.gpu_memory_utilization or VllmSettings().gpu_memory_utilization,
        kv_cache_memory_bytes=c.kv_cache_memory_bytes,
    )
    try:
        return estimate(spec, hardware=hardware, settings=settings, engine=engine, device=device)
    except InvalidSettingError:
        return None


def _with_offload(
    spec: ModelSpec, hardware: Hardware, c: Constraints, *, engine: Engine
) -> list[Candidate]:
    """Candidates with the missing weights kept in host memory (--allow-offload)."""
    cap = min(spec.max_position_embeddings, c.max_model_len or spec.max_position_embeddings)
    for length in dict.fromkeys((cap, min(cap, max(c.min_context, 4096)), c.min_context)):
        settings = VllmSettings(
            gpu_memory_utilization=c.gpu_memory_utilization
            or VllmSettings().gpu_memory_utilization,
            max_model_len=length,
            max_num_seqs=c.concurrency or 1,
            enforce_eager=True,
        )
        b = estimate(spec, hardware=hardware, settings=settings, engine=engine)
        offload = math.ceil(b.shortfall_bytes / GiB) + 1  # a GiB of headroom
        if offload * GiB >= b.weights_bytes:
            continue
        settings = dataclasses.replace(settings, cpu_offload_gb=float(offload))
        found = list(_score(spec, hardware, engine, "cuda", length, c, settings))
        if found:
            return found
    return []


def _does_not_fit(
    spec: ModelSpec, hardware: Hardware, c: Constraints, *, engine: Engine, device: str
) -> DoesNotFitError:
    """The error for a model that cannot fit, with the shortfall and the cheapest ways out."""
    tp = max(_divisors(spec, hardware.count) or [1])
    settings = VllmSettings(
        gpu_memory_utilization=c.gpu_memory_utilization or VllmSettings().gpu_memory_utilization,
        max_model_len=max(c.min_context, 1),
        max_num_seqs=c.concurrency or 1,
        enforce_eager=device == "cuda" and engine == "vllm",
        tensor_parallel_size=tp,
        kv_cache_memory_bytes=c.kv_cache_memory_bytes,
    )
    b = estimate(spec, hardware=hardware, settings=settings, engine=engine, device=device)
    shortfall = max(b.shortfall_bytes, 1)
    ways = []
    if device == "cuda":
        for n in (2, 4, 8, 16, 32, 64):
            if n <= hardware.count:
                continue
            more = dataclasses.replace(hardware, count=n)
            try:
                candidates_n = candidates(spec, more, c, engine=engine, device=device)
                if next(candidates_n, None) is not None:
                    ways.append(f"--gpus {n}")
                    break
            except InvalidSettingError:
                continue
        if spec.quantization is None and not c.no_quantize:
            four_bit = dataclasses.replace(
                spec,
                quantization=QuantSpec(method="awq", bits=4, group_size=128),
                checkpoint=dataclasses.replace(spec.checkpoint, total_bytes=None),
            )
            if next(candidates(four_bit, hardware, c, engine=engine, device=device), None):
                ways.append("a 4-bit (AWQ/GPTQ) checkpoint of this model")
        if b.shortfall_bytes and engine == "vllm":
            ways.append(f"--allow-offload (about {math.ceil(shortfall / GiB)} GiB of weights)")
    if b.max_model_len_that_fits > 0:
        ways.append(f"--min-context {b.max_model_len_that_fits}")
    gpu = f"{hardware.count} x {hardware.gpu.name}" if device == "cuda" else "this memory"
    return DoesNotFitError(
        f"{spec.model_id} does not fit {gpu} at context {c.min_context:,}: short by "
        f"{format_bytes(shortfall)} even with every lever turned.",
        shortfall_bytes=shortfall,
        hint=("Ways out: " + "; ".join(ways) + ".") if ways else None,
    )


def explain(
    spec: ModelSpec,
    hardware: Hardware,
    best: Candidate,
    baseline: MemoryBreakdown | None,
    *,
    engine: Engine,
    device: str,
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
    default_tokens, default_seqs = vllm_defaults(hardware.gpu, device=device)

    def saved(other: VllmSettings) -> int:
        """Non-KV bytes the chosen plan saves over ``other`` (itself with a lever put back)."""
        try:
            o = estimate(spec, hardware=hardware, settings=other, engine=engine, device=device)
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
