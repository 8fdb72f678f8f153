"""The memory model: (model, hardware, settings) -> a per-GPU breakdown. All numbers in bytes.

vLLM V1 (vllm/v1/worker/gpu_worker.py ``determine_available_memory``, 0.32)::

    budget       = cuda_total * gpu_memory_utilization
    non_kv       = weights/tp + non_torch + activation_peak + cuda_graphs
    kv_cache     = budget - non_kv            (or --kv-cache-memory-bytes when given)
    num_blocks   = kv_cache // page_bytes_per_layer // layers
    kv_tokens    = num_blocks * block_size

and the engine refuses to start when one request at max_model_len needs more blocks than
there are. Every constant below is derived from vLLM's source or fitted to the points in
shared/calibration (``bench/calibration.py`` prints the fit).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from oominfer.dtypes import Engine, dtype_bytes, dtype_name, kv_dtype_bytes
from oominfer.errors import InvalidSettingError
from oominfer.gpus import GpuSpec
from oominfer.settings import VllmSettings
from oominfer.spec import ATTENTION_KINDS, ModelSpec, QuantSpec
from oominfer.units import GiB, MiB

# vLLM's paged-attention block: 16 tokens on CUDA (vllm/config/cache.py DEFAULT_BLOCK_SIZE),
# 128 on the CPU backend (vllm/platforms/cpu.py). Hybrid Mamba models raise it (below).
GPU_BLOCK_SIZE: Final = 16
CPU_BLOCK_SIZE: Final = 128
# vLLM pads the vocabulary of the embedding and LM head to a multiple of 64
# (vocab_parallel_embedding.py DEFAULT_VOCAB_PADDING_SIZE).
VOCAB_PADDING: Final = 64

# Memory the engine holds after profiling beyond weights and activations: cuBLAS and
# attention workspaces, persistent input and sampler buffers; with tensor parallelism the
# NCCL and custom all-reduce buffers too. Fitted on calibration/ (bench/calibration.py).
NON_TORCH_BYTES: Final = 200 * MiB
NON_TORCH_TP_BYTES: Final = 400 * MiB

# The dummy forward over max_num_batched_tokens tokens: the residual stream and a few
# hidden-size temporaries, the fused QKV output, and the MLP's gate/up output plus its
# activation (3 x intermediate) are alive at the MLP's peak.
HIDDEN_TEMPORARIES: Final = 4
MLP_TEMPORARIES: Final = 3

# CUDA graphs: FULL_AND_PIECEWISE graphs for each capture size (capture_sizes below). vLLM
# measures their pool by capturing a sample and (>= 0.21) subtracts it before sizing the KV
# cache. The pool grows with layers x sizes; fitted on calibration point dp37 (Qwen3-8B,
# 36 layers, 67 sizes: 2.24 GiB).
GRAPH_BYTES_PER_LAYER_AND_SIZE: Final = 950 * 1024

# vLLM's CPU backend: the API server, the engine core and the torch runtime around the
# weights and the KV cache. Measured here: a 22M-parameter model with a 1 GiB KV cache has a
# process tree of about 3 GB resident (ENVIRONMENT.md), so about 2 GiB besides the two.
CPU_RUNTIME_BYTES: Final = 2 * GiB

# The transformers engine keeps the CUDA context and cuBLAS workspace beside the weights.
TRANSFORMERS_OVERHEAD_BYTES: Final = 512 * MiB


CURRENT_RELEASE: Final = (0, 32)


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineVersion:
    """What changed between vLLM releases that moves the memory split."""

    release: tuple[int, int]
    v1: bool
    """The V1 engine (0.8+); V0 profiled differently and kept no null block."""
    graphs_in_budget: bool
    """CUDA-graph memory is estimated and subtracted before KV sizing (0.21+)."""
    model_runner_v2: bool
    mla_latent: bool
    """MLA models cache the compressed latent (0.7+); before, K and V were expanded."""
    always_chunked_prefill: bool
    """V1 always chunks prefill; V0 did only past 32k tokens of context, and otherwise
    profiled a forward pass over max(max_model_len, max_num_batched_tokens) tokens."""
    """The V2 model runner (default in 0.32): its dummy sampler keeps only the logits in the
    model dtype; the V1 runner's also makes fp32 logits, probabilities and noise."""

    @classmethod
    def parse(cls, version: str) -> EngineVersion:
        """``0.32.0``, ``0.7.2 (V0 engine)`` -> the behaviour of that release."""
        m = re.search(r"(?<![\d.])(\d)\.(\d+)", version)
        release = (int(m.group(1)), int(m.group(2))) if m else CURRENT_RELEASE
        v1 = release >= (0, 8) and "v0" not in version.lower()
        return cls(
            release=release,
            v1=v1,
            graphs_in_budget=release >= (0, 21),
            model_runner_v2=release >= (0, 32),
            mla_latent=release >= (0, 7),
            always_chunked_prefill=v1,
        )

    @property
    def sampler_bytes_per_logit_fp32(self) -> int:
        """fp32 bytes per logit the dummy sampler holds at its peak besides the logits."""
        return 0 if self.model_runner_v2 else 12


CURRENT_VLLM: Final = EngineVersion.parse("0.32.0")
assert CURRENT_VLLM.release == CURRENT_RELEASE


@dataclass(frozen=True, slots=True, kw_only=True)
class Hardware:
    """The accelerator one replica runs on: a GPU kind and how many of it."""

    gpu: GpuSpec
    count: int = 1

    def __post_init__(self) -> None:
        """Reject a non-positive GPU count."""
        if self.count < 1:
            raise InvalidSettingError(f"--gpus must be at least 1, got {self.count}.")


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryBreakdown:
    """Memory needed to serve one model, per GPU (the busiest one). All numbers are in bytes."""

    engine: Engine
    dtype: str
    total_bytes: int
    """The GPU's memory as CUDA reports it."""
    budget_bytes: int
    """What the engine may use: total x gpu_memory_utilization."""
    weights_bytes: int
    activation_bytes: int
    non_torch_bytes: int
    cuda_graph_bytes: int
    kv_cache_bytes: int
    """What is left for the KV cache; negative when the rest does not fit."""
    kv_bytes_per_token: int
    """KV-cache bytes one token takes on this GPU, summed over its layers."""
    state_bytes_per_seq: int
    """Recurrent state (Mamba, linear attention) one sequence keeps on this GPU."""
    block_size: int
    kv_cache_tokens: int
    max_model_len: int
    """The context asked for (or derived from config.json)."""
    max_model_len_that_fits: int
    """The longest context one request can have with this KV cache (0: none)."""
    max_concurrency: float
    """Requests of max_model_len tokens the KV cache holds at once."""
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_block_bytes: int = 0
    """Bytes of one paged-cache block across the layers that share it (0: no paging)."""
    blocks_per_request: int = 0
    """Blocks one request of max_model_len tokens needs."""
    usable_blocks: int = 0
    """Blocks a request can use (the pool's null block excluded)."""

    @property
    def non_kv_bytes(self) -> int:
        """Everything but the KV cache."""
        return (
            self.weights_bytes
            + self.activation_bytes
            + self.non_torch_bytes
            + (self.cuda_graph_bytes)
        )

    @property
    def fits(self) -> bool:
        """True when one request at max_model_len fits in the KV cache."""
        return self.kv_cache_bytes > 0 and self.max_model_len_that_fits >= self.max_model_len

    @property
    def shortfall_bytes(self) -> int:
        """Bytes missing for one request at max_model_len; 0 when it fits."""
        if self.fits:
            return 0
        need = self.kv_bytes_per_token * self.max_model_len + self.state_bytes_per_seq
        # A negative KV cache means the rest already overflows the budget by that much.
        short = need - self.kv_cache_bytes
        if self.kv_block_bytes:
            # vLLM counts whole blocks, and holds one back.
            blocks = max(self.blocks_per_request - self.usable_blocks, 1) * self.kv_block_bytes
            short = max(short, blocks if self.kv_cache_bytes > 0 else short)
        return max(1, short)


def resolve_dtype(spec: ModelSpec, gpu: GpuSpec, dtype: str) -> str:
    """The compute dtype vLLM picks: ``auto`` is the checkpoint's 16-bit dtype, and bf16
    becomes fp16 on GPUs older than compute capability 8.0 (vLLM does the same cast).

    Raises:
        InvalidSettingError: bf16 was asked for on a GPU that cannot run it.
    """
    if dtype == "auto":
        name = dtype_name(spec.torch_dtype)
        if name not in ("bfloat16", "float16"):
            name = "bfloat16"  # fp32 checkpoints are served in 16-bit by default
        if name == "bfloat16" and not gpu.supports_bf16:
            name = "float16"
        return name
    name = dtype_name(dtype)
    if name == "bfloat16" and not gpu.supports_bf16:
        cc = ".".join(map(str, gpu.compute_capability))
        raise InvalidSettingError(
            f"{gpu.name} (compute capability {cc}) cannot run bfloat16; it needs 8.0 or newer.",
            hint="Use --dtype float16.",
        )
    return name


def weight_format(spec: ModelSpec, quantization: str | None) -> QuantSpec | None:
    """The format the engine holds weights in: the checkpoint's, or the one asked for."""
    if quantization is None or (
        spec.quantization is not None and quantization.startswith(spec.quantization.method)
    ):
        return spec.quantization
    match quantization:
        case "fp8" | "fp8_per_tensor":
            return QuantSpec(method="fp8", bits=8)
        case "int8":
            return QuantSpec(method="int8", bits=8)
        case "bitsandbytes":
            return QuantSpec(method="bitsandbytes", bits=4)
        case _:
            if spec.quantization is None:
                raise InvalidSettingError(
                    f"--quantization {quantization} needs a checkpoint quantized that way, "
                    f"but {spec.model_id} is not.",
                    hint="Use --quantization fp8 or bitsandbytes for in-flight quantization, "
                    "or pick a pre-quantized checkpoint.",
                )
            raise InvalidSettingError(
                f"{spec.model_id} is a {spec.quantization.method} checkpoint; it cannot be "
                f"loaded as {quantization}.",
                hint="Leave --quantization out to use the checkpoint's own format.",
            )


def weights_bytes(spec: ModelSpec, *, dtype: str, quantization: str | None = None) -> int:
    """Weights of the whole model in the engine's format.

    Exact when the checkpoint's tensor sizes are known and the format is the checkpoint's
    own; otherwise computed by role from the architecture: embeddings, LM head, norms and
    biases stay 16-bit under every scheme, projections (and experts) take the scheme's
    bytes per element.
    """
    fmt = weight_format(spec, quantization)
    elem = dtype_bytes(dtype)
    p = spec.params
    exact_floats = spec.checkpoint.float_params
    if fmt is None and exact_floats:
        return exact_floats * elem
    if fmt is not None and fmt is spec.quantization and spec.checkpoint.tensor_bytes:
        return spec.checkpoint.tensor_bytes
    scale = exact_floats / p.total if exact_floats else 1.0
    linear, experts = sum(p.layer_linear) * scale, sum(p.layer_experts) * scale
    rest = (p.total * scale) - linear - experts
    if fmt is None:
        return int((linear + experts + rest) * elem)
    quant = fmt.bytes_per_param
    linear_bytes = linear * elem if fmt.experts_only else linear * quant
    return int(rest * elem + linear_bytes + experts * quant)


def kv_bytes_per_token_layer(
    spec: ModelSpec, *, kv_bytes: int, tp: int, version: EngineVersion = CURRENT_VLLM
) -> int:
    """KV-cache bytes one token takes in one attention layer on one GPU.

    Standard attention: 2 (K and V) x kv_heads x head_dim x bytes, the heads split across
    tensor-parallel ranks (replicated when there are fewer KV heads than ranks).
    MLA caches the compressed latent once: (kv_lora_rank + qk_rope_head_dim) x bytes, on
    every rank (vllm MLAAttentionSpec: num_kv_heads=1).
    """
    if spec.is_mla:
        assert spec.kv_lora_rank is not None and spec.qk_rope_head_dim is not None
        if not version.mla_latent:
            # vLLM < 0.7 expanded K and V per head, V padded to the QK head size.
            qk = (spec.qk_nope_head_dim or spec.head_dim) + spec.qk_rope_head_dim
            return 2 * max(1, spec.num_attention_heads // tp) * qk * kv_bytes
        return (spec.kv_lora_rank + spec.qk_rope_head_dim) * kv_bytes
    heads = max(1, spec.num_kv_heads // tp)
    return 2 * heads * spec.head_dim * kv_bytes


def _layers_on_busiest_stage(spec: ModelSpec, pp: int) -> range:
    """Layers of the first pipeline stage, which also holds the embedding (the busiest)."""
    per_stage = math.ceil(spec.num_layers / pp)
    return range(min(per_stage, spec.num_layers))


def _weights_per_gpu(
    spec: ModelSpec, total: int, *, tp: int, pp: int, offload: int, elem: int
) -> int:
    # vLLM pads the vocabulary to a multiple of 64 in the embedding and in an untied LM head.
    pad = -spec.vocab_size % VOCAB_PADDING
    total += pad * spec.hidden_size * elem * (1 if spec.tie_word_embeddings else 2)
    if pp == 1:
        return max(0, total // tp - offload)
    p = spec.params
    layers = _layers_on_busiest_stage(spec, pp)
    share = (
        p.embedding + sum(p.layer_linear[i] + p.layer_experts[i] + p.layer_other[i] for i in layers)
    ) / p.total
    return max(0, int(total * share) // tp - offload)


def vllm_defaults(gpu: GpuSpec, *, device: str = "cuda", world_size: int = 1) -> tuple[int, int]:
    """vLLM's (max_num_batched_tokens, max_num_seqs) for its OpenAI server on this device.

    vllm/engine/arg_utils.py ``_get_default_max_num_seqs_and_batched_tokens`` (0.32):
    >= 160 GiB: (16384, 1024); >= 70 GiB and not an A100: (8192, 1024); else (2048, 256);
    CPU: (2048 x world, 128 x world).
    """
    if device == "cpu":
        return 2048 * world_size, 128 * world_size
    if gpu.cuda_total_bytes >= 160 * GiB:
        return 16384, 1024
    if gpu.cuda_total_bytes >= 70 * GiB and "a100" not in gpu.name.lower():
        return 8192, 1024
    return 2048, 256


def capture_sizes(max_num_seqs: int, max_num_batched_tokens: int) -> int:
    """How many batch sizes vLLM captures CUDA graphs for (VllmConfig._set_cudagraph_sizes):
    [1, 2, 4] + range(8, 256, 8) + range(256, cap + 1, 16) (+ max_num_seqs),
    cap = min(max_num_batched_tokens, 2 * max_num_seqs, 512).
    """
    top = min(max_num_batched_tokens, 2 * max_num_seqs, 512)
    sizes = {s for s in (1, 2, 4) if s <= top}
    sizes |= set(range(8, min(top + 1, 256), 8))
    sizes |= set(range(256, top + 1, 16))
    if max_num_seqs <= top:
        sizes.add(max_num_seqs)
    return len(sizes)


def estimate(
    spec: ModelSpec,
    *,
    hardware: Hardware,
    settings: VllmSettings,
    engine: Engine = "vllm",
    device: str = "cuda",
    version: EngineVersion = CURRENT_VLLM,
) -> MemoryBreakdown:
    """Memory needed to serve ``spec`` on ``hardware`` with ``settings``, per GPU.

    Args:
        spec: the model.
        hardware: the GPU kind and count.
        settings: the engine settings; None fields take the engine's defaults.
        engine: ``vllm`` (paged KV cache, profiling run, CUDA graphs) or ``transformers``
            (dynamic KV cache per sequence, no graphs).
        device: ``cuda``, or ``cpu`` for vLLM's CPU backend (KV cache sized by
            kv_cache_memory_bytes, 128-token blocks, no graphs).
        version: the vLLM release whose behaviour to model (calibration replays old logs).

    Raises:
        InvalidSettingError: settings that cannot work with this model or hardware.
    """
    s = settings
    tp, pp = s.tensor_parallel_size, s.pipeline_parallel_size
    _check_parallel(spec, s, hardware)
    gpu = hardware.gpu
    dtype = resolve_dtype(spec, gpu, s.dtype)
    elem = dtype_bytes(dtype)
    if s.kv_cache_dtype.startswith("fp8") and device == "cuda" and not gpu.supports_fp8:
        raise InvalidSettingError(
            f"--kv-cache-dtype {s.kv_cache_dtype} needs compute capability 8.9 or newer; "
            f"{gpu.name} has {'.'.join(map(str, gpu.compute_capability))}.",
            hint="Use --kv-cache-dtype auto.",
        )
    kv_elem = kv_dtype_bytes(s.kv_cache_dtype, dtype)
    max_len = s.max_model_len or spec.default_max_model_len or spec.max_position_embeddings
    default_tokens, default_seqs = vllm_defaults(gpu, device=device, world_size=s.world_size)
    seqs = s.max_num_seqs or default_seqs
    batched = s.max_num_batched_tokens or min(default_tokens, seqs * max_len)
    if not version.always_chunked_prefill and max_len <= 32768:
        batched = max(batched, max_len)

    total_weights = weights_bytes(spec, dtype=dtype, quantization=s.quantization)
    weights = _weights_per_gpu(
        spec, total_weights, tp=tp, pp=pp, offload=int(s.cpu_offload_gb * GiB), elem=elem
    )
    layers = _layers_on_busiest_stage(spec, pp)
    kinds = [spec.layer_kinds[i] for i in layers]
    per_layer = kv_bytes_per_token_layer(spec, kv_bytes=kv_elem, tp=tp, version=version)
    attn_layers = sum(1 for k in kinds if k in ATTENTION_KINDS)
    state_dtype = dtype_bytes(spec.state_dtype) if spec.state_dtype else elem
    state_layer = spec.state_elements_per_layer * state_dtype // tp
    state_layers = sum(1 for k in kinds if k in ("mamba", "linear_attention"))
    budget = math.ceil(gpu.cuda_total_bytes * s.gpu_memory_utilization)
    if engine == "transformers":
        return _transformers_breakdown(
            spec,
            dtype=dtype,
            budget=budget,
            total=gpu.cuda_total_bytes,
            weights=weights,
            per_token=per_layer * attn_layers,
            state_per_seq=state_layer * state_layers,
            seqs=seqs,
            max_len=max_len,
            elem=elem,
            tp=tp,
        )

    activation = activation_bytes(
        spec, tokens=batched, seqs=seqs, dtype_size=elem, tp=tp, version=version
    )
    if device == "cpu":
        non_torch = CPU_RUNTIME_BYTES
    else:
        non_torch = NON_TORCH_BYTES + (NON_TORCH_TP_BYTES if tp > 1 else 0)
    graphs = 0
    if device == "cuda" and not s.enforce_eager:
        graphs = GRAPH_BYTES_PER_LAYER_AND_SIZE * len(layers) * capture_sizes(seqs, batched)
    if s.kv_cache_memory_bytes is not None:
        kv_cache = s.kv_cache_memory_bytes
    else:
        in_budget = graphs if version.graphs_in_budget else 0
        kv_cache = budget - weights - activation - non_torch - in_budget

    layout = kv_layout(
        spec,
        kinds,
        per_token_layer=per_layer,
        state_bytes_layer=state_layer,
        block=CPU_BLOCK_SIZE if device == "cpu" else GPU_BLOCK_SIZE,
        batched=batched,
        pp=pp,
    )
    num_blocks = kv_cache // layout.bytes_per_block if layout and kv_cache > 0 else 0
    # Block 0 is the pool's null block (vllm/v1/core/block_pool.py): a request can use
    # num_blocks - 1 (measured: 512 blocks of 128 tokens admit 65,408 tokens, not 65,536).
    usable = num_blocks - 1 if version.v1 else num_blocks
    fits_len = 0
    concurrency = 0.0
    tokens = 0
    if layout is not None and num_blocks > 0:
        per_request = layout.blocks_per_request(max_len)
        fits_len = _longest(
            layout.blocks_per_request, usable, spec.max_position_embeddings, layout.block_size
        )
        # vLLM logs "KV cache size: int(num_blocks / blocks_per_request * L) tokens".
        concurrency = num_blocks / per_request
        tokens = int(concurrency * max_len)
    return MemoryBreakdown(
        engine="vllm",
        dtype=dtype,
        total_bytes=gpu.cuda_total_bytes,
        budget_bytes=budget,
        weights_bytes=weights,
        activation_bytes=activation,
        non_torch_bytes=non_torch,
        cuda_graph_bytes=graphs,
        kv_cache_bytes=kv_cache,
        kv_bytes_per_token=per_layer * attn_layers,
        state_bytes_per_seq=state_layer * state_layers,
        block_size=layout.block_size if layout else 0,
        kv_cache_tokens=tokens,
        max_model_len=max_len,
        max_model_len_that_fits=fits_len,
        max_concurrency=round(concurrency, 2),
        max_num_seqs=seqs,
        max_num_batched_tokens=batched,
        kv_block_bytes=layout.bytes_per_block if layout else 0,
        blocks_per_request=layout.blocks_per_request(max_len) if layout else 0,
        usable_blocks=max(usable, 0),
    )


def _check_parallel(spec: ModelSpec, s: VllmSettings, hardware: Hardware) -> None:
    tp, pp = s.tensor_parallel_size, s.pipeline_parallel_size
    if s.world_size > hardware.count:
        raise InvalidSettingError(
            f"tensor_parallel_size x pipeline_parallel_size = {s.world_size} needs "
            f"{s.world_size} GPUs, but --gpus is {hardware.count}.",
            hint=f"Pass --gpus {s.world_size} or lower the parallel sizes.",
        )
    if spec.num_attention_heads % tp:
        raise InvalidSettingError(
            f"--tensor-parallel-size {tp} does not divide {spec.model_id}'s "
            f"{spec.num_attention_heads} attention heads.",
            hint="Use a tensor-parallel size that divides the attention heads (1, 2, 4, 8).",
        )
    if pp > spec.num_layers:
        raise InvalidSettingError(
            f"--pipeline-parallel-size {pp} exceeds the model's {spec.num_layers} layers."
        )


def activation_bytes(
    spec: ModelSpec,
    *,
    tokens: int,
    seqs: int,
    dtype_size: int,
    tp: int,
    version: EngineVersion = CURRENT_VLLM,
) -> int:
    """Peak of vLLM's profiling run above the weights: a forward pass over ``tokens`` tokens
    (max_num_batched_tokens), then the dummy sampler over ``min(tokens, seqs)`` rows of logits.

    Forward: per token, a few hidden-size temporaries plus the fused QKV output and the MLP's
    gate/up output and activation (experts: top-k of them), split across TP ranks.
    Sampler: logits [rows, vocab] in the model dtype; the V1 runner adds fp32 logits,
    softmax probabilities and exponential noise (3 x 4 bytes per logit).
    """
    inter = spec.intermediate_size
    if spec.is_moe:
        inter = max(spec.moe_intermediate_size * max(spec.num_experts_per_tok, 1), inter)
    qkv = (spec.num_attention_heads + 2 * spec.num_kv_heads) * spec.head_dim
    per_token = HIDDEN_TEMPORARIES * spec.hidden_size + (MLP_TEMPORARIES * inter + qkv) // tp
    forward = tokens * per_token * dtype_size
    rows = min(tokens, seqs)
    sampler = rows * spec.vocab_size * (dtype_size + version.sampler_bytes_per_logit_fp32)
    return forward + sampler


@dataclass(frozen=True, slots=True)
class KvLayout:
    """How vLLM lays the paged cache out (vllm/v1/core/kv_cache_utils.py, 0.32).

    Layers of one kind (full, sliding, state) share a page size; vLLM splits each kind into
    groups of ``group_size`` layers, and one block is a page in every layer of a group, so
    ``bytes_per_block = group_size x page``. A request needs, per group, cdiv(L, block) blocks
    (full attention), at most cdiv(window - 1 + in-flight tokens, block) + 1 (sliding window),
    or one block (a recurrent state).
    """

    block_size: int
    bytes_per_block: int
    groups: tuple[tuple[str, int], ...]
    """(kind, number of such groups)."""
    window_tokens: int

    def blocks_per_request(self, length: int) -> int:
        """Blocks one request of ``length`` tokens takes, summed over groups."""
        total = 0
        for kind, count in self.groups:
            if kind == "full":
                per = math.ceil(length / self.block_size)
            elif kind == "sliding":
                per = math.ceil(min(self.window_tokens, length) / self.block_size) + 1
            else:
                per = 1
            total += per * count
        return total


def kv_layout(
    spec: ModelSpec,
    kinds: Sequence[str],
    *,
    per_token_layer: int,
    state_bytes_layer: int,
    block: int,
    batched: int,
    pp: int,
) -> KvLayout | None:
    """The paged-cache layout of the layers ``kinds`` on one GPU; None without attention."""
    counts = {k: kinds.count(k) for k in ("full", "sliding")}
    counts["state"] = sum(1 for k in kinds if k in ("mamba", "linear_attention"))
    present = {k: n for k, n in counts.items() if n}
    if not counts["full"] and not counts["sliding"]:
        return None
    if counts["state"]:
        # Hybrid models: the attention block grows (in steps of 16 tokens) until its page
        # holds a Mamba state, whose page is then padded to match
        # (vllm/platforms/interface.py _align_hybrid_block_size).
        block = max(block, 16 * math.ceil(state_bytes_layer / (16 * per_token_layer)))
    page = block * per_token_layer
    window = (spec.sliding_window or 0) - 1 + (pp + 1) * batched
    low, high = min(present.values()), max(present.values())
    group_size = high if high < 1.5 * low else low
    groups = tuple((k, math.ceil(n / group_size)) for k, n in present.items())
    return KvLayout(block, group_size * page, groups, window)


def _longest(blocks_needed: Callable[[int], int], usable: int, limit: int, block: int) -> int:
    """The longest length (a multiple of the block size, at most ``limit``) whose blocks fit."""
    if usable <= 0 or blocks_needed(1) > usable:
        return 0
    if blocks_needed(limit) <= usable:
        return limit
    lo, hi = 1, limit // block  # in blocks
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if blocks_needed(mid * block) <= usable:
            lo = mid
        else:
            hi = mid - 1
    return int(lo * block)


def _transformers_breakdown(
    spec: ModelSpec,
    *,
    dtype: str,
    budget: int,
    total: int,
    weights: int,
    per_token: int,
    state_per_seq: int,
    seqs: int,
    max_len: int,
    elem: int,
    tp: int,
) -> MemoryBreakdown:
    """transformers generate(): a dynamic KV cache per sequence (no paging, no pool), a
    prefill peak over one full-length prompt (oominfer's server prefills one sequence at a
    time; SDPA keeps no n^2 attention matrix), and fp32 logits of the last position only."""
    activation = activation_bytes(spec, tokens=max_len, seqs=0, dtype_size=elem, tp=tp)
    activation += seqs * spec.vocab_size * 4 * 2  # fp32 logits and their softmax
    kv_cache = budget - weights - activation - TRANSFORMERS_OVERHEAD_BYTES
    per_seq = per_token * max_len + state_per_seq
    fits_len = 0
    if kv_cache > state_per_seq and per_token:
        fits_len = min(spec.max_position_embeddings, (kv_cache - state_per_seq) // per_token)
    return MemoryBreakdown(
        engine="transformers",
        dtype=dtype,
        total_bytes=total,
        budget_bytes=budget,
        weights_bytes=weights,
        activation_bytes=activation,
        non_torch_bytes=TRANSFORMERS_OVERHEAD_BYTES,
        cuda_graph_bytes=0,
        kv_cache_bytes=kv_cache,
        kv_bytes_per_token=per_token,
        state_bytes_per_seq=state_per_seq,
        block_size=1,
        kv_cache_tokens=max(0, kv_cache) // per_token if per_token else 0,
        max_model_len=max_len,
        max_model_len_that_fits=int(fits_len),
        max_concurrency=round(max(0, kv_cache) / per_seq, 2) if per_seq else float(seqs),
        max_num_seqs=seqs,
        max_num_batched_tokens=max_len,
    )
