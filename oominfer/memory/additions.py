"""What operators add to a deployment, per GPU: a speculative draft, LoRA slots, the
multimodal encoder cache, and how MoE experts split under expert and data parallelism.
All numbers in bytes.

Each term is its own function, derived from vLLM's source (0.32), and the estimator adds
them as lines of their own (``Additions``) beside the model's weights, activations and
graphs.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any, Final

from oominfer.base.errors import InvalidSettingError, ModelNotFoundError
from oominfer.memory.dtypes import dtype_bytes
from oominfer.memory.kv import kv_bytes_per_token_layer
from oominfer.memory.weights import role_bytes, weights_bytes
from oominfer.model.load import load_spec
from oominfer.model.spec import ATTENTION_KINDS, ModelSpec
from oominfer.rules.speculative import NO_MODEL_METHODS, speculative_method
from oominfer.rules.versions import EngineVersion
from oominfer.settings import EngineSettings, declared, flag

LORA_FP32_SLICES: Final = 3
"""Punica's shrink step writes an fp32 buffer of (slices, tokens, rank) per LoRA layer
(vllm/lora/ops/triton_ops/lora_shrink_op.py); qkv is the widest packed module, 3 slices."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Additions:
    """The operator additions on one GPU (zero when not used). All numbers in bytes."""

    speculative_method: str | None = None
    """vLLM's method (draft_model, eagle, eagle3, mtp, ngram, ...), None without one."""
    speculative_weights_bytes: int = 0
    """The draft's weights (a draft model, EAGLE heads or the model's own MTP layers)."""
    speculative_kv_bytes_per_token: int = 0
    """KV the draft's layers add to every token of the shared paged pool."""
    speculative_graph_bytes: int = 0
    """CUDA graphs captured for the draft's layers."""
    lora_bytes: int = 0
    """max_loras GPU slots of max_lora_rank on every target module, plus punica's buffer."""
    lora_cpu_cache_bytes: int = 0
    """Host memory of the adapters cached on the CPU (not on the GPU)."""
    multimodal_bytes: int = 0
    """The encoder cache: embeddings of the largest multimodal batch vLLM profiles."""
    encoder_items: int = 0
    """Items in that batch (``encoder_items``)."""
    encoder_modality: str = "image"
    """What those items are: images, or a video (``profiled_item``)."""
    vision_tower_bytes: int = 0
    """The vision tower's weights on this GPU (already within the weights line; 0 when the
    limits leave it unbuilt)."""
    expert_weights_bytes: int = 0
    """Routed-expert weights on this GPU (already within the weights line)."""
    experts_per_gpu: int = 0
    """Whole experts per GPU under --enable-expert-parallel (0: sliced, or not MoE)."""
    data_parallel_size: int = 1
    prefix_caching: bool | None = None
    """--enable-prefix-caching as given (None: vLLM decides, on for most models)."""

    @property
    def non_kv_bytes(self) -> int:
        """What these additions take from the KV cache's budget (expert weights and the vision
        tower are part of the weights line and not added again)."""
        return (
            self.speculative_weights_bytes
            + self.speculative_graph_bytes
            + self.lora_bytes
            + self.multimodal_bytes
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Draft:
    """A speculative draft, whole (before tensor parallelism)."""

    method: str
    weights_bytes: int
    layers: int
    """Layers of the draft that keep a KV cache (and are captured in graphs)."""
    kv_bytes_per_token_layer: int
    hidden_size: int


def draft(
    spec: ModelSpec,
    config: dict[str, Any],
    *,
    dtype: str,
    kv_bytes: int,
    tp: int,
    quantization: str | None,
    version: EngineVersion,
) -> Draft | None:
    """The draft ``--speculative-config`` names, as vLLM builds it (vllm/config/speculative.py).

    - ngram, suffix: no model, no memory.
    - mtp: the model's own next-token layers (config.json ``num_nextn_predict_layers``):
      each one a decoder layer of the target plus ``eh_proj`` (2 x hidden -> hidden),
      sharing the target's embedding and LM head, quantized as the target is.
    - eagle / eagle3: the head's checkpoint when the catalog or the Hub knows it, else one
      decoder layer of the target's shape plus the fusing ``fc`` (2 or 3 x hidden ->
      hidden); the embedding and LM head are shared with the target.
    - draft_model: a whole model, resolved like any model (``load_spec``).

    ``rules.speculative.refusal`` has checked ``config`` first (a model where one is needed).

    Raises:
        ModelNotFoundError: a draft model that no folder, catalog entry or the Hub has.
    """
    method = speculative_method(spec, config)
    if method is None or method in NO_MODEL_METHODS:
        return None
    elem = dtype_bytes(dtype)
    per_layer_kv = kv_bytes_per_token_layer(spec, kv_bytes=kv_bytes, tp=tp, version=version)
    if method == "mtp":
        layers = spec.mtp_layers
        weights = layers * (
            _layer_bytes(spec, dtype, quantization) + 2 * spec.hidden_size**2 * elem
        )
        return Draft(method=method, weights_bytes=weights, layers=layers,
                     kv_bytes_per_token_layer=per_layer_kv,
                     hidden_size=spec.hidden_size)  # fmt: skip
    name = str(config["model"])
    if method in ("eagle", "eagle3"):
        head = _known_spec(name)
        if head is not None:
            shared = head.params.embedding + head.params.lm_head
            layer_kv = kv_bytes_per_token_layer(head, kv_bytes=kv_bytes, tp=tp, version=version)
            return Draft(method=method, weights_bytes=max(0, head.params.total - shared) * elem,
                         layers=head.num_layers, kv_bytes_per_token_layer=layer_kv,
                         hidden_size=head.hidden_size)  # fmt: skip
        fused = 3 if method == "eagle3" else 2
        weights = _layer_bytes(spec, dtype, None) + fused * spec.hidden_size**2 * elem
        return Draft(method=method, weights_bytes=weights, layers=1,
                     kv_bytes_per_token_layer=per_layer_kv,
                     hidden_size=spec.hidden_size)  # fmt: skip
    try:
        model = load_spec(name)
    except ModelNotFoundError as err:
        raise ModelNotFoundError(
            f"the draft model of {flag('speculative_config')}: {err}", hint=err.hint
        ) from None
    return Draft(
        method=method,
        weights_bytes=weights_bytes(model, dtype=dtype),
        layers=model.attention_layers,
        kv_bytes_per_token_layer=kv_bytes_per_token_layer(
            model, kv_bytes=kv_bytes, tp=tp, version=version
        ),
        hidden_size=model.hidden_size,
    )


@functools.cache
def _known_spec(name: str) -> ModelSpec | None:
    """An EAGLE head's own spec when a folder, the catalog or the Hub has it; else None."""
    try:
        return load_spec(name)
    except Exception:
        return None


def _layer_bytes(spec: ModelSpec, dtype: str, quantization: str | None) -> int:
    """One decoder layer of ``spec`` (its last) in the engine's weight format."""
    linear, quant, elem = role_bytes(spec, dtype=dtype, quantization=quantization)
    p = spec.params
    return int(p.layer_linear[-1] * linear + p.layer_experts[-1] * quant + p.layer_other[-1] * elem)


def lora_slot_bytes(spec: ModelSpec, s: EngineSettings, *, dtype: str, tokens: int) -> int:
    """GPU memory of ``--enable-lora`` on one GPU.

    vLLM stacks ``max_loras`` slots per target module (vllm/lora/layers/*.py
    ``create_lora_weights``): lora_a is (max_loras, rank, in), lora_b (max_loras, out, rank),
    in the model's dtype. Column-parallel modules (q, k, v, gate, up) keep lora_a whole and
    split lora_b's out by tensor parallel; row-parallel ones (o, down) split lora_a's in and
    keep lora_b whole. MoE layers hold a slot per expert for gate, up and down
    (FusedMoEWithLoRA). Plus punica's fp32 shrink buffer over the prefill chunk.
    """
    if not s.enable_lora:
        return 0
    per_slot = _lora_slot_elements(spec, s)
    buffer = LORA_FP32_SLICES * tokens * s.max_lora_rank * 4
    return s.max_loras * per_slot * dtype_bytes(dtype) + buffer


def lora_cpu_cache_bytes(spec: ModelSpec, s: EngineSettings, *, dtype: str) -> int:
    """Host memory of the LoRA CPU cache: ``max_cpu_loras`` (default ``max_loras``) adapters
    of up to ``max_lora_rank`` on every target module, whole (vllm/lora/model_manager.py
    ``LRUCacheLoRAModelManager``). Not GPU memory: the pod's memory, not the KV cache."""
    if not s.enable_lora:
        return 0
    whole = dataclasses.replace(s, tensor_parallel_size=1)
    return (s.max_cpu_loras or s.max_loras) * _lora_slot_elements(spec, whole) * dtype_bytes(dtype)


def _lora_slot_elements(spec: ModelSpec, s: EngineSettings) -> int:
    """Elements of one LoRA slot on one GPU (see ``lora_slot_bytes``)."""
    tp, rank = s.tensor_parallel_size, s.max_lora_rank
    h, hd = spec.hidden_size, spec.head_dim
    q, kv = spec.num_attention_heads * hd, spec.num_kv_heads * hd

    def column(n_in: int, n_out: int) -> int:
        return rank * n_in + math.ceil(n_out / tp) * rank

    def row(n_in: int, n_out: int) -> int:
        return rank * math.ceil(n_in / tp) + n_out * rank

    attention = column(h, q) + 2 * column(h, kv) + row(q, h)
    if spec.is_moe:
        inter = spec.moe_intermediate_size
        mlp = spec.num_experts * (2 * column(h, inter) + row(inter, h))
    else:
        inter = spec.intermediate_size
        mlp = 2 * column(h, inter) + row(inter, h)
    attn_layers = sum(1 for k in spec.layer_kinds if k in ATTENTION_KINDS)
    return attention * attn_layers + mlp * spec.num_layers


def item_limit(limits: dict[str, Any], modality: str) -> int:
    """Items one prompt may carry of ``modality`` (vLLM's default: 999); a limit is a count
    or ``{"count": n, ...}``."""
    value = limits.get(modality, 999) if limits else 999
    return int(value.get("count", 999) if isinstance(value, dict) else value)


def mm_item_count(spec: ModelSpec, limits: dict[str, Any]) -> int | None:
    """Items per prompt over the modalities the model takes (None: vLLM's defaults, 999
    each): images, and videos where Qwen2-VL's are modelled; a modality the limits leave out
    keeps vLLM's 999."""
    if not limits:
        return None
    modalities = {"image", *limits} | ({"video"} if spec.video_frames_per_group else set())
    return sum(item_limit(limits, modality) for modality in sorted(modalities))


def tower_built(spec: ModelSpec, s: EngineSettings) -> bool:
    """Whether vLLM builds the model's vision tower: limits of 0 for every modality leave it
    unbuilt, its weights unloaded (vllm/model_executor/models/interfaces.py
    ``_mark_tower_model``: ``StageMissingLayer``)."""
    return spec.params.vision > 0 and mm_item_count(spec, s.mm_limits) != 0


def vision_tower_bytes(spec: ModelSpec, s: EngineSettings, *, dtype: str) -> int:
    """The vision tower's share of one GPU's weights line (``ParamCounts.vision``, kept
    16-bit by every quantization scheme, split by tensor parallel as vLLM's default
    ``mm_encoder_tp_mode`` does); 0 when it is not built."""
    if not tower_built(spec, s):
        return 0
    return spec.params.vision * dtype_bytes(dtype) // s.tensor_parallel_size


MAX_FRAMES_PER_VIDEO: Final = 14
"""vllm/model_executor/models/qwen2_vl.py ``_MAX_FRAMES_PER_VIDEO``: the dummy video's most
frames."""


QWEN3_VL_VIDEO_TOKENS_PER_EMBEDDING: Final = 12.5
"""vllm/model_executor/models/qwen3_vl.py ``get_max_video_tokens`` (0.11-0.12): each video
embedding counted with the timestamp text around it."""


def profiled_item(
    spec: ModelSpec, s: EngineSettings, *, max_len: int, version: EngineVersion
) -> tuple[str, int]:
    """The modality of the item vLLM's profiling run encodes, and that item's tokens: of the
    modalities a prompt may carry, the one whose largest item has the most tokens
    (vllm/multimodal/encoder_budget.py ``get_modality_with_max_tokens``; image on a tie).

    Qwen2-VL's dummy video (``get_num_frames_with_most_features``) has as many frames at
    the image processor's largest size as fit in ``max_len`` tokens, up to
    MAX_FRAMES_PER_VIDEO, each ``video_frames_per_group`` frames one image's tokens: 114,688
    tokens at Qwen2.5-VL's 128k context, seven times an image (a vLLM 0.23 log profiles
    "1 video items" against a 114,688-token budget).

    Qwen3-VL's largest video is ``VisionEncoder.video_tokens`` embeddings, fewer than an
    image's, but 0.11-0.12 count each as QWEN3_VL_VIDEO_TOKENS_PER_EMBEDDING tokens
    (``EngineVersion.video_timestamp_tokens``): 153,600 for Qwen3-VL-30B-A3B, the budget a
    0.11 log prints for "1 video items"; 0.13 profiles an image."""
    per_image = spec.mm_tokens_per_item
    tower = spec.vision_encoder
    if tower and tower.video_tokens and item_limit(s.mm_limits, "video"):
        video = tower.video_tokens
        if version.video_timestamp_tokens:
            video = int(video * QWEN3_VL_VIDEO_TOKENS_PER_EMBEDDING)
        if video > per_image or not item_limit(s.mm_limits, "image"):
            return "video", video
        return "image", per_image
    group = spec.video_frames_per_group
    if not (per_image and group and item_limit(s.mm_limits, "video")):
        return "image", per_image
    frames = min(max(max_len // per_image * group, 1), MAX_FRAMES_PER_VIDEO)
    video = math.ceil(frames / group) * per_image
    if video > per_image or not item_limit(s.mm_limits, "image"):
        return "video", video
    return "image", per_image


def encoder_items(
    spec: ModelSpec,
    s: EngineSettings,
    *,
    tokens: int,
    seqs: int,
    max_len: int,
    version: EngineVersion,
) -> int:
    """Items in the profiling run's dummy encoder batch (0: no encoder to profile), of the
    modality ``profiled_item`` picks.

    vllm/multimodal/encoder_budget.py ``MultiModalBudget._get_max_items``: the encoder
    budget, max(max_num_batched_tokens, the largest item's tokens)
    (v1/core/encoder_cache_manager.py ``compute_mm_encoder_budget``), holds
    ``budget // per_item`` items; the decoder side ``max_num_seqs`` x the items one prompt
    takes (its limit, at most ``max_model_len // per_item``, at least 1); at least one.
    """
    if not spec.mm_tokens_per_item or mm_item_count(spec, s.mm_limits) == 0:
        return 0
    modality, per_item = profiled_item(spec, s, max_len=max_len, version=version)
    limit = item_limit(s.mm_limits, modality)
    if limit == 0:  # only another modality's items (audio): their tower is not modelled
        return 0
    per_prompt = max(1, min(limit, max_len // per_item))
    return max(1, min(encoder_budget(tokens, per_item) // per_item, seqs * per_prompt))


def encoder_budget(tokens: int, per_item: int) -> int:
    """The encoder budget of the profiling run: max(max_num_batched_tokens, the largest
    item's tokens) (v1/core/encoder_cache_manager.py ``compute_mm_encoder_budget``)."""
    return max(tokens, per_item)


def padded_rows(version: EngineVersion, *, tokens: int, per_item: int) -> int:
    """The rows the profiling run pads each dummy encoder output to
    (``EngineVersion.encoder_outputs_padded``): the encoder budget, the item's tokens, or
    none (0)."""
    if version.encoder_outputs_padded == "budget":
        return encoder_budget(tokens, per_item)
    if version.encoder_outputs_padded == "item":
        return per_item
    return 0


def item_rows(spec: ModelSpec, modality: str, tokens: int) -> int:
    """Embeddings the tower outputs for the profiled item of ``tokens`` tokens: as many,
    but for Qwen3-VL's video, counted in more tokens than it has (``profiled_item``)."""
    tower = spec.vision_encoder
    if modality == "video" and tower is not None and tower.video_tokens:
        return min(tower.video_tokens, tokens)
    return tokens


def multimodal_bytes(
    spec: ModelSpec, *, dtype: str, items: int, per_item: int, padded_to: int = 0
) -> int:
    """The encoder cache the profiling run fills on one GPU: the dummy batch's embeddings,
    ``items`` x the largest item's ``per_item`` rows (``item_rows``) x the tower's output
    width (``VisionEncoder.output_width``, else the language model's hidden size), alive
    through the text model's dummy forward (v1/worker/gpu_model_runner.py ``profile_run``).
    ``padded_to``: the rows each item is zero-padded to where the release pads them
    (``EngineVersion.encoder_outputs_padded``), 0 where not."""
    tower = spec.vision_encoder
    width = (tower.output_width if tower else 0) or spec.hidden_size
    return items * max(per_item, padded_to) * width * dtype_bytes(dtype)


ENCODER_HIDDEN_TEMPORARIES: Final = 4
"""Tower-width tensors alive at a ViT block's MLP peak: the block's input, the attention
output, the fused norm's output and the MLP's down projection."""


def encoder_forward_bytes(
    spec: ModelSpec, *, dtype: str, items: int, per_item: int, tp: int
) -> int:
    """Peak of the profiling run's vision-tower forward over ``items`` images of the
    largest size, on one GPU, before its output becomes the encoder cache.

    The whole dummy batch goes through the tower at once (``embed_multimodal``): ``items``
    x tokens per item x ViT positions per token (``VisionEncoder.patches_per_token``)
    patches. Per patch, at a block's MLP peak: ``ENCODER_HIDDEN_TEMPORARIES`` tower-width
    tensors plus the MLP's intermediates (gate/up and the activation, 3 x intermediate for
    a SwiGLU MLP; fc1 and the activation, 2 x, otherwise; split by tensor parallel as
    ``mm_encoder_tp_mode`` "weights" splits them), in the model dtype; and the pixel values
    the processor hands over in fp32. The attention runs in memory-efficient kernels
    (FlashAttention, xFormers, SDPA) and keeps no positions-squared matrix.
    """
    tower = spec.vision_encoder
    if tower is None or items == 0:
        return 0
    patches = items * per_item * tower.patches_per_token
    mlp = (3 if tower.gated else 2) * tower.intermediate_size // tp
    per_patch = (ENCODER_HIDDEN_TEMPORARIES * tower.hidden_size + mlp) * dtype_bytes(dtype)
    return patches * (per_patch + tower.patch_elements * 4)


def expert_slices(s: EngineSettings) -> int:
    """Ranks each routed expert is sliced over: vLLM's FusedMoE spans tensor x data parallel
    ranks, and ``--enable-expert-parallel`` keeps every expert whole on one (1)."""
    if s.enable_expert_parallel:
        return 1
    return s.tensor_parallel_size * s.data_parallel_size


def expert_share(spec: ModelSpec, s: EngineSettings, stage_expert_bytes: int) -> tuple[int, int]:
    """Routed-expert bytes on one GPU, and whole experts per GPU (0 when sliced).

    vLLM's FusedMoE (vllm/model_executor/layers/fused_moe/config.py
    ``FusedMoEParallelConfig.make``) spans tensor x data parallel ranks: without
    ``--enable-expert-parallel`` each expert is sliced over all of them; with it each rank
    holds whole experts, ``ceil(experts / ranks)`` on the first ones (``determine_expert_map``).
    """
    if not spec.is_moe:
        return 0, 0
    if not s.enable_expert_parallel:
        return stage_expert_bytes // expert_slices(s), 0
    per_gpu = math.ceil(spec.num_experts / (s.tensor_parallel_size * s.data_parallel_size))
    return stage_expert_bytes * per_gpu // spec.num_experts, per_gpu


OPERATOR_FLAGS: Final = (
    "speculative_config", "enable_lora", "limit_mm_per_prompt", "enable_expert_parallel",
    "data_parallel_size",
)  # fmt: skip
"""The additions only vLLM serves (the transformers server has none of them)."""


def state_blocks(aligned: int, s: EngineSettings, *, drafted: int = 0) -> int:
    """Recurrent-state blocks one request of a hybrid model holds, given the settings.

    ``aligned`` is the count with prefix caching on (vLLM's default for hybrids: "align"
    mode, rules/attention.py). Without prefix caching vLLM keeps one block, and speculative
    decoding adds one per drafted token either way (v1/kv_cache_interface.py
    ``MambaSpec.max_memory_usage_bytes``: 2 + speculative + checkpoint when aligned, else
    1 + speculative). ``drafted``: the tokens drafted per step (rules/speculative.py
    ``drafted_tokens``).
    """
    if aligned == 0:
        return 0
    base = 1 if s.enable_prefix_caching is False else aligned
    return base + drafted


def check_additions(spec: ModelSpec, s: EngineSettings, engine: str = "vllm") -> None:
    """Refuse what vLLM refuses about these settings before it touches a GPU, and what the
    transformers engine cannot serve.

    Raises:
        InvalidSettingError: expert parallel on a dense model; an addition on transformers.
    """
    if engine != "vllm":
        given = [name for name in OPERATOR_FLAGS if getattr(s, name) != declared(name).default]
        if given:
            raise InvalidSettingError(
                f"the transformers engine does not serve {', '.join(map(flag, given))}.",
                hint="Use --engine vllm, or leave them out.",
            )
    if s.enable_expert_parallel and not spec.is_moe:
        raise InvalidSettingError(
            f"{flag('enable_expert_parallel')} needs a mixture-of-experts model; "
            f"{spec.model_id} has no experts (vLLM refuses it).",
            hint=f"Leave out {flag('enable_expert_parallel')}; use "
            f"{flag('data_parallel_size')} for replicas.",
        )
