"""Weights: the compute dtype, the format the engine holds them in, and their bytes per GPU."""

from __future__ import annotations

from typing import Final, NamedTuple

from oominfer.base.errors import InvalidSettingError
from oominfer.base.units import MiB
from oominfer.hardware.gpu import GpuSpec
from oominfer.memory.dtypes import dtype_bytes
from oominfer.model.spec import ATTENTION_KINDS, ModelSpec, QuantSpec
from oominfer.rules.dtypes import compute_dtype
from oominfer.rules.versions import EngineVersion

# vLLM pads the vocabulary of the embedding and LM head to a multiple of 64
# (vocab_parallel_embedding.py DEFAULT_VOCAB_PADDING_SIZE).
VOCAB_PADDING: Final = 64


def resolve_dtype(spec: ModelSpec, gpu: GpuSpec, dtype: str) -> str:
    """The compute dtype vLLM runs the model in (rules/dtypes.py).

    Raises:
        InvalidSettingError: a dtype the GPU or the model refuses.
    """
    return compute_dtype(spec, gpu, dtype)


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
                    hint="Use --quantization fp8_per_tensor (vLLM) or int8/bitsandbytes "
                    "(--engine transformers) to quantize in flight, or a pre-quantized "
                    "checkpoint.",
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


def rope_cache_bytes(spec: ModelSpec, *, dtype: str) -> int:
    """vLLM's rotary cos/sin cache on each GPU: one row of ``rotary_dim`` values per
    position up to the context the config derives, in the model's dtype, built on the GPU
    while the model loads (vllm/model_executor/layers/rotary_embedding/base.py
    ``cos_sin_cache``; "Model loading took" counts it). 16 MiB for Llama-3.2-1B's 131,072
    positions, 0.7% of its weights."""
    return spec.max_position_embeddings * spec.rotary_dim * dtype_bytes(dtype)


def pp_layer_ranges(num_layers: int, pp: int) -> list[range]:
    """The layers of each pipeline stage, as vLLM splits them.

    vllm/distributed/utils.py ``get_pp_indices``: every stage gets ``layers // pp`` and the
    remainder goes one layer each to the stages before the last (the first and the last
    stage, which also hold the embedding and the LM head, get none of it).
    """
    per = num_layers // pp
    sizes = [per] * pp
    for i in range(2, num_layers % pp + 2):
        sizes[-i] += 1
    starts = [sum(sizes[:i]) for i in range(pp)]
    return [range(s, s + n) for s, n in zip(starts, sizes, strict=True)]


def stage_weights(
    spec: ModelSpec, *, dtype: str, quantization: str | None, pp: int, tower: bool = True
) -> list[int]:
    """Weights of each pipeline stage, whole (before tensor parallelism), in the engine's
    format, the vocabulary padded as vLLM pads it; without the vision tower when ``tower``
    is False (limits of 0 leave it unbuilt: memory/additions.py ``tower_built``).

    The first stage holds the embedding, the last the final norm and the LM head (with tied
    embeddings the last stage loads the embedding again: vLLM's models build it there when
    ``tie_word_embeddings``). The parts are counted by role from the architecture and scaled
    so that the stages add up to ``weights_bytes`` (exact when the checkpoint's sizes are).
    """
    linear, quant, elem = role_bytes(spec, dtype=dtype, quantization=quantization)
    p = spec.params

    def layer(i: int) -> float:
        return p.layer_linear[i] * linear + p.layer_experts[i] * quant + p.layer_other[i] * elem

    layers = [layer(i) for i in range(spec.num_layers)]
    embedding, lm_head, final = p.embedding * elem, p.lm_head * elem, p.final * elem
    vision = p.vision * elem  # on the first stage, with the embedding
    scale = _scale(spec, dtype=dtype, quantization=quantization)
    if not tower:
        vision = 0
    pad = -spec.vocab_size % VOCAB_PADDING * spec.hidden_size * elem
    out = []
    for index, stage in enumerate(pp_layer_ranges(spec.num_layers, pp)):
        size = sum(layers[i] for i in stage) * scale
        first, last = index == 0, index == pp - 1
        if first:
            size += (embedding + vision) * scale + pad
        if last:
            size += final * scale
            if spec.tie_word_embeddings:
                size += 0 if first else embedding * scale + pad
            else:
                size += lm_head * scale + pad
        out.append(int(size))
    return out


class RoleBytes(NamedTuple):
    """Bytes one parameter takes in the engine's weight format, by role (``ParamCounts``)."""

    linear: float
    """Attention and dense MLP projections: quantized unless the scheme is experts-only."""
    experts: float
    """Routed experts: the scheme's bytes."""
    other: int
    """Embeddings, norms, routers, biases: 16-bit (the dtype's bytes) under every scheme."""


def role_bytes(spec: ModelSpec, *, dtype: str, quantization: str | None) -> RoleBytes:
    """Bytes a parameter takes by role, for ``spec`` served in ``dtype`` under
    ``quantization`` (the checkpoint's own format where None)."""
    fmt = weight_format(spec, quantization)
    elem = dtype_bytes(dtype)
    quant = fmt.bytes_per_param if fmt is not None else elem
    return RoleBytes(elem if fmt is None or fmt.experts_only else quant, quant, elem)


def _scale(spec: ModelSpec, *, dtype: str, quantization: str | None) -> float:
    """What scales the parts counted by role to ``weights_bytes`` (exact when the
    checkpoint's sizes are): its bytes over theirs."""
    linear, quant, elem = role_bytes(spec, dtype=dtype, quantization=quantization)
    p = spec.params
    counted = (
        sum(p.layer_linear) * linear
        + sum(p.layer_experts) * quant
        + (sum(p.layer_other) + p.embedding + p.lm_head + p.final + p.vision) * elem
    )
    return weights_bytes(spec, dtype=dtype, quantization=quantization) / counted


def stage_replicated_bytes(
    spec: ModelSpec, *, dtype: str, quantization: str | None, pp: int
) -> list[int]:
    """Weights of each pipeline stage that vLLM keeps whole on every tensor-parallel rank
    instead of splitting (``ParamCounts.layer_replicated_linear``/``_other``: MLA's latent
    down-projections, MoE routers, the sparse-attention indexer), in the engine's format:
    each rank holds them whole beside its share of the rest. DeepSeek-R1 at TP 8: 0.9 GiB
    a GPU where a split would put 0.1."""
    p = spec.params
    if not (p.layer_replicated_linear or p.layer_replicated_other):
        return [0] * pp
    linear, _, elem = role_bytes(spec, dtype=dtype, quantization=quantization)
    scale = _scale(spec, dtype=dtype, quantization=quantization)

    def layer(i: int) -> float:
        return p.layer_replicated_linear[i] * linear + p.layer_replicated_other[i] * elem

    return [int(sum(map(layer, stage)) * scale) for stage in pp_layer_ranges(spec.num_layers, pp)]


def mla_dequantized_bytes(
    spec: ModelSpec, *, dtype: str, quantization: str | None, tp: int, layers: int
) -> int:
    """What one GPU holds for ``layers`` latent-attention layers beside their weights: vLLM
    splits kv_b_proj into the absorbed W_UK and W_UV at load, dequantized to the model's
    dtype where the checkpoint quantizes it (MLAAttention.process_weights_after_loading,
    ``split_kv_b_proj``), and keeps the quantized weight too; unquantized, the two are
    views of it. kv_lora_rank x heads a GPU x (qk_nope + v head size), in 16 bits:
    DeepSeek-R1 in FP8 at TP 8, 0.24 GiB a GPU."""
    if spec.kv_lora_rank is None:
        return 0
    linear, _, elem = role_bytes(spec, dtype=dtype, quantization=quantization)
    if linear >= elem:
        return 0
    nope = spec.qk_nope_head_dim or spec.head_dim
    heads = max(1, spec.num_attention_heads // tp)
    return layers * spec.kv_lora_rank * heads * (nope + (spec.v_head_dim or nope)) * elem


def stage_expert_bytes(
    spec: ModelSpec, *, dtype: str, quantization: str | None, pp: int
) -> list[int]:
    """Routed-expert weights of each pipeline stage, whole, in the engine's format (the part
    of ``stage_weights`` that expert and data parallelism split differently)."""
    quant = role_bytes(spec, dtype=dtype, quantization=quantization).experts
    experts = spec.params.layer_experts
    return [
        int(sum(experts[i] for i in stage) * quant)
        for stage in pp_layer_ranges(spec.num_layers, pp)
    ]


def marlin_fp8_scale_bytes(
    spec: ModelSpec, *, gpu: GpuSpec, quantization: str | None, pp: int, experts: bool = False
) -> list[int]:
    """What Marlin adds per pipeline stage, whole, to a block-scaled FP8 checkpoint's weights
    (only the routed experts' share with ``experts``).

    Below compute capability 8.9 (no FP8 tensor cores) vLLM runs FP8 weights through Marlin,
    which turns a block's one fp32 scale into a 16-bit scale per column for every
    ``weight_block`` rows (quantization/utils/marlin_utils_fp8.py
    ``prepare_fp8_layer_for_marlin``, ``prepare_fp8_moe_layer_for_marlin``: "block-wise
    quantization -> group-wise quantization", ``repeat_interleave(block_n)``): 2 bytes per
    128 weights, 1.6% of the FP8 bytes, and "Model loading took" counts them. Qwen3-Coder-
    30B-A3B-FP8 on an A100 (vLLM 0.19.1): 29.54 GiB loaded, 0.45 GiB over the checkpoint's
    shapes."""
    fmt = weight_format(spec, quantization)
    if (
        fmt is None
        or fmt.method != "fp8"
        or not fmt.weight_block
        or gpu.compute_capability >= (8, 9)
    ):
        return [0] * pp
    p = spec.params
    per_layer = [
        e if experts else e + lin for lin, e in zip(p.layer_linear, p.layer_experts, strict=True)
    ]
    return [
        int(sum(per_layer[i] for i in stage) * 2 / fmt.weight_block)
        for stage in pp_layer_ranges(spec.num_layers, pp)
    ]


def _up(n: int, to: int) -> int:
    return -(-n // to) * to


def mxfp4_expert_ratio(
    spec: ModelSpec, *, gpu: GpuSpec, version: EngineVersion, expert_slices: int
) -> float:
    """How much more memory vLLM holds an MXFP4 checkpoint's experts in than the checkpoint
    (1.0 for every other format): its MoE kernels pad the expert matrices.

    model_executor/layers/quantization/mxfp4.py ``Mxfp4MoEMethod.create_weights`` pads the
    intermediate size per rank (``expert_slices`` ranks slice each expert: tensor x data
    parallel, or 1 under expert parallelism) and the hidden size by backend:

    - Marlin (GPUs below Hopper, Blackwell's consumer parts, Hopper before 0.10.2): the
      intermediate to a multiple of 128, the hidden to 256;
    - FlashInfer on Blackwell (compute capability 10.x): both to 256;
    - Triton on Hopper: the intermediate to 64; from 0.11.1 the kernels' swizzled layout
      (triton_kernels ``HopperMXValueLayout``) then pads each matrix's contraction side to
      128 and its output side to 256.

    gpt-oss-120b on one H100 ("Model loading took"): 65.97 GiB with Marlin (vLLM 0.10.1,
    vllm issue #23278), 64.38 GiB with the swizzled Triton layout (0.14.1, #33155), where its
    checkpoint holds 60.7 GiB.
    """
    fmt = spec.quantization
    if fmt is None or fmt.method != "mxfp4" or not spec.is_moe:
        return 1.0
    hidden = spec.hidden_size
    inter = max(spec.moe_intermediate_size // expert_slices, 1)
    cc = gpu.compute_capability
    if (10, 0) <= cc < (11, 0):
        h, i = _up(hidden, 256), _up(inter, 256)
        padded = 3 * h * i
    elif cc == (9, 0) and version.hopper_mxfp4 != "marlin":
        i = _up(inter, 64)
        if version.hopper_mxfp4 == "triton":
            padded = 3 * hidden * i
        else:
            # gate_up: contraction hidden, output 2 x inter; down: contraction inter.
            padded = _up(hidden, 128) * _up(2 * i, 256) + _up(i, 128) * _up(hidden, 256)
    else:
        h, i = _up(hidden, 256), _up(inter, 128)
        padded = 3 * h * i
    return padded / (3 * hidden * inter)


ALLOCATOR_OWN_SEGMENT: Final = 10 * MiB
"""torch's CUDA caching allocator gives an allocation of this size or more a segment of its
own, rounded up to ``ALLOCATOR_SEGMENT_ROUND`` (c10/cuda/CUDACachingAllocator.cpp
``kMinLargeAlloc``, ``kRoundLarge``)."""

ALLOCATOR_SEGMENT_ROUND: Final = 2 * MiB

ALLOCATOR_SPLIT: Final = 1 * MiB
"""A block splits off what it does not need only when that is more than this (``kSmallSize``
in ``should_split``): a remainder of 1 MiB or less stays with the tensor, and
``torch.cuda.memory_allocated()``, which vLLM's "Model loading took" reads, counts it."""


def allocator_rounding(nbytes: int) -> int:
    """What the caching allocator counts beyond one tensor of ``nbytes`` made in a fresh
    segment (weights are made one after the other, nothing freed in between): 0 for a tensor
    under 10 MiB or one whose size is a multiple of 2 MiB, up to 1 MiB otherwise."""
    if nbytes < ALLOCATOR_OWN_SEGMENT:
        return 0
    remainder = -nbytes % ALLOCATOR_SEGMENT_ROUND
    return remainder if remainder <= ALLOCATOR_SPLIT else 0


def weight_tensors(
    spec: ModelSpec,
    *,
    layers: range,
    elem: int,
    tp: int,
    fused: bool,
    embedding: bool,
    lm_head: bool,
    vocab_padding: int = 1,
) -> list[int]:
    """Bytes of each large weight tensor one GPU makes for ``layers``: the attention's and
    the dense MLP's projections, fused as vLLM fuses them (``QKVParallelLinear``,
    ``MergedColumnParallelLinear``) or one per matrix as transformers keeps them, split over
    ``tp`` ranks (KV heads replicated below one a rank); the embedding and the LM head where
    asked, the vocabulary padded to ``vocab_padding``. Left out: MLA and recurrent layers,
    routed experts and norms, where the rounding is small beside the whole."""
    h, d = spec.hidden_size, spec.head_dim
    q = max(1, spec.num_attention_heads // tp) * d
    kv = max(1, spec.num_kv_heads // tp) * d
    attention = h * (spec.num_attention_heads + 2 * spec.num_kv_heads) * d
    attention += spec.num_attention_heads * d * h
    inter = spec.intermediate_size // tp
    p = spec.params
    out: list[int] = []
    for i in layers:
        kind = spec.layer_kinds[i]
        if kind not in ATTENTION_KINDS and kind != "mlp":
            continue
        mlp = p.layer_linear[i]
        if kind in ATTENTION_KINDS:
            if spec.is_mla:
                continue
            out += [(q + 2 * kv) * h] if fused else [q * h, kv * h, kv * h]
            out.append(h * q)
            mlp -= attention
        if p.layer_experts[i] or not spec.intermediate_size:
            continue
        matrices = round(mlp / (h * spec.intermediate_size))
        if matrices == 3:
            out += [2 * inter * h] if fused else [inter * h, inter * h]
            out.append(inter * h)
        elif matrices == 2:
            out += [inter * h, inter * h]
    rows = -(-spec.vocab_size // vocab_padding) * vocab_padding // tp
    out += [rows * h] * (int(embedding) + int(lm_head))
    return [n * elem for n in out]


def weight_rounding_bytes(
    spec: ModelSpec,
    *,
    dtype: str,
    quantization: str | None,
    tp: int,
    pp: int = 1,
    fused: bool,
) -> list[int]:
    """What the allocator's rounding adds to the weights of one GPU of each pipeline stage
    (``allocator_rounding`` over ``weight_tensors``); 0 for quantized weights, whose packed
    tensors and scales are not modelled. Qwen2.5-7B's projections (18,944 wide) come out
    57 MiB above their parameters, Llama's and Qwen3's (multiples of 2 MiB) at none: on the
    calibration logs Qwen2.5 models went from 0.3-0.6% light to within 0.01%."""
    if weight_format(spec, quantization) is not None:
        return [0] * pp
    elem = dtype_bytes(dtype)
    ranges = pp_layer_ranges(spec.num_layers, pp)
    out = []
    for index, layers in enumerate(ranges):
        first, last = index == 0, index == pp - 1
        head = last and (not spec.tie_word_embeddings or not first)
        tensors = weight_tensors(
            spec, layers=layers, elem=elem, tp=tp, fused=fused, embedding=first,
            lm_head=head, vocab_padding=VOCAB_PADDING if fused else 1,
        )  # fmt: skip
        out.append(sum(allocator_rounding(n) for n in tensors))
    return out


def on_gpu_rounding(rounding: int, weights: int, offload: int) -> int:
    """The share of a GPU's weight rounding that stays on it when ``offload`` bytes of its
    ``weights`` go to the CPU (``--cpu-offload-gb``: those tensors take no GPU segment)."""
    if offload <= 0 or weights <= 0:
        return rounding
    return int(rounding * max(0.0, 1 - offload / weights))
