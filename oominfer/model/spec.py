"""ModelSpec: the architecture facts the estimator needs, read from a config.json dict.

Pure: a dict in, a frozen dataclass out. No file, network or torch access here; the
loaders in ``oominfer.model.load`` find the dict (local folder, Hub, catalog) and the
checkpoint's exact sizes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

from oominfer.base.errors import InvalidSettingError

LayerKind = Literal["full", "sliding", "mamba", "linear_attention", "mlp", "shared"]
"""What a layer caches: a full or sliding-window KV cache, a recurrent state, nothing (an
attention-free "mlp" layer), or nothing of its own ("shared": attention that reads an earlier
layer's KV cache, Gemma 4's and Gemma 3n's last ``num_kv_shared_layers``)."""
"""What a decoder layer keeps per sequence: a full KV cache, a sliding window of it, a fixed
recurrent state (Mamba, linear attention), or nothing (MLP-only layers of hybrid models)."""

# Bytes per element of each safetensors dtype (the header's "dtype" strings).
SAFETENSORS_BYTES: Final[dict[str, float]] = {
    "F64": 8, "I64": 8, "U64": 8,
    "F32": 4, "I32": 4, "U32": 4,
    "F16": 2, "BF16": 2, "I16": 2, "U16": 2,
    "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "I8": 1, "U8": 1, "BOOL": 1,
    "F4": 0.5, "F6_E2M3": 0.75, "F6_E3M2": 0.75,
}  # fmt: skip

FLOAT_SAFETENSORS_DTYPES: Final = frozenset({"F64", "F32", "F16", "BF16"})

ATTENTION_KINDS: Final = frozenset({"full", "sliding"})
STATE_KINDS: Final = frozenset({"mamba", "linear_attention"})


@dataclass(frozen=True, slots=True, kw_only=True)
class QuantSpec:
    """The weight format of a pre-quantized checkpoint, or one asked for with --quantization."""

    method: str
    """vLLM's name: awq, gptq, fp8, bitsandbytes, int8, mxfp4, compressed-tensors, modelopt."""
    bits: float
    """Bits per quantized weight element, before scales (4, 8)."""
    group_size: int | None = None
    """Elements sharing one scale; None for per-channel or per-tensor scales."""
    experts_only: bool = False
    """Only the routed experts are quantized (gpt-oss MXFP4)."""
    weight_block: int | None = None
    """The input-side block of a block-scaled FP8 checkpoint (``weight_block_size``'s second
    value, 128): one fp32 scale per block, which Marlin (memory/weights.py
    ``marlin_fp8_scale_bytes``) widens to one 16-bit scale per block-row and column."""
    desc_act: bool = False
    """GPTQ group activation ordering (act-order), which vLLM 0.32/0.33 no longer runs."""
    symmetric: bool = True
    """Symmetric integer quantization (GPTQ's ``sym``); vLLM runs 4-bit GPTQ symmetric only."""
    kv_cache_fp8: bool = False
    """A ModelOpt checkpoint that names an FP8 KV cache (``kv_cache_quant_algo``): vLLM
    resolves a KV cache dtype of ``auto`` to it (``EngineVersion.checkpoint_kv_cache``)."""

    @property
    def bytes_per_param(self) -> float:
        """Storage per quantized weight element, scales and zero points included."""
        match self.method:
            case "bitsandbytes" if self.bits == 4:
                # NF4 with double quantization: 4 bits + one 8-bit absmax per 64 elements
                # + one fp32 second-level scale per 256 absmax values (bitsandbytes defaults).
                return 0.5 + 1 / 64 + 4 / (64 * 256)
            case "mxfp4":
                # OCP MXFP4: 4-bit elements + one shared 8-bit exponent per 32 elements.
                return 0.5 + 1 / 32
            case _:
                group_extra = 0.0
                if self.group_size and self.bits < 8:
                    # One fp16 scale + one packed zero point (bits) per group.
                    group_extra = (2 + self.bits / 8) / self.group_size
                return self.bits / 8 + group_extra


@dataclass(frozen=True, slots=True, kw_only=True)
class VisionEncoder:
    """The vision tower's shape, as vLLM's profiling run drives it (``vision_config``)."""

    hidden_size: int
    intermediate_size: int
    gated: bool
    """A SwiGLU MLP (towers with a ``silu`` activation): gate and up outputs both alive."""
    patch_elements: int
    """Pixel values of one patch: channels x temporal patch x patch^2."""
    patches_per_token: int
    """ViT positions behind one language-model token: the spatial merge (Qwen-VL,
    Pixtral: 2 x 2) or the pooling (Gemma 3: 4,096 patches to 256 tokens); 1 for LLaVA."""
    output_width: int = 0
    """Columns of each embedding the tower hands over, where they are not the language
    model's hidden size (0): Qwen3-VL's merger output and one more per
    ``deepstack_visual_indexes`` entry, side by side (4 x 2,048 for Qwen3-VL-30B-A3B)."""
    video_tokens: int = 0
    """Embeddings of the largest video, for towers whose video processor caps the pixels of
    all frames together (Qwen3-VL: ``size.longest_edge`` 25,165,824 of
    video_preprocessor_config.json, 12,288 embeddings at 16 x 16 patches, 2 x 2 merge and 2
    frames a group); 0 where no such video is modelled."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ParamCounts:
    """Parameter counts by role, derived from the architecture (elements, not bytes)."""

    embedding: int
    lm_head: int
    """Zero when the LM head is tied to the embedding."""
    layer_linear: tuple[int, ...]
    """Per layer: attention and dense MLP projections (what 4/8-bit schemes quantize)."""
    layer_experts: tuple[int, ...]
    """Per layer: routed-expert weights (MoE)."""
    layer_other: tuple[int, ...]
    """Per layer: norms, biases, routers, SSM parameters (kept in 16-bit by every scheme)."""
    final: int
    """Final norm and learned position embeddings."""
    vision: int = 0
    """The vision tower and its projector (multimodal checkpoints), and an audio tower where
    the checkpoint has one (Gemma 4's): kept in 16-bit, as quantized checkpoints leave them
    (``modules_to_not_convert``/``ignore``)."""
    per_layer_embedding: int = 0
    """The part of ``embedding`` that is per-layer token tables (Gemma 4 and 3n's
    ``hidden_size_per_layer_input``): looked up a row a token, never read whole by a step."""
    layer_replicated_linear: tuple[int, ...] = ()
    """Per layer: the part of ``layer_linear`` vLLM keeps whole on every tensor-parallel rank
    (MLA's latent down-projections, ``ReplicatedLinear``/``disable_tp``); () for none."""
    layer_replicated_other: tuple[int, ...] = ()
    """Per layer: the part of ``layer_other`` kept whole on every rank (MoE routers, the
    sparse-attention indexer's key projection)."""

    @property
    def total(self) -> int:
        """All parameters."""
        return (
            self.vision
            + self.embedding
            + self.lm_head
            + sum(self.layer_linear)
            + sum(self.layer_experts)
            + sum(self.layer_other)
            + self.final
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Checkpoint:
    """Exact sizes of the checkpoint's tensors, from safetensors headers or Hub metadata."""

    parameters: Mapping[str, int] = field(default_factory=dict)
    """Safetensors dtype ("BF16", "I32", ...) -> number of elements."""
    total_bytes: int | None = None
    """Tensor bytes of the whole checkpoint (model.safetensors.index.json's total_size)."""

    @property
    def tensor_bytes(self) -> int | None:
        """Tensor bytes: the published total, else the sum over dtypes."""
        if self.total_bytes:
            return self.total_bytes
        if self.parameters:
            return int(sum(n * SAFETENSORS_BYTES.get(k, 2) for k, n in self.parameters.items()))
        return None

    @property
    def float_params(self) -> int | None:
        """Elements of an all-float checkpoint; None if it holds packed or 8-bit tensors."""
        if self.parameters and set(self.parameters) <= FLOAT_SAFETENSORS_DTYPES:
            return sum(self.parameters.values())
        return None


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """Architecture facts of one model, as the estimator uses them."""

    model_id: str
    architecture: str
    model_type: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    """The longest context vLLM derives from config.json (rope scaling applied)."""
    default_max_model_len: int = 0
    """vLLM's max_model_len when none is given (LongRoPE: the original length)."""
    torch_dtype: str
    tie_word_embeddings: bool
    layer_kinds: tuple[LayerKind, ...]
    sliding_window: int | None = None
    full_kv_heads: int = 0
    """KV heads of the full-attention layers where they differ from the others' (Gemma 4:
    ``num_global_key_value_heads``); 0: ``num_kv_heads``."""
    full_head_dim: int = 0
    """Head size of the full-attention layers where it differs (Gemma 4: ``global_head_dim``);
    0: ``head_dim``."""
    # MLA (DeepSeek V2/V3): the latent is cached once per token and layer.
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    qk_nope_head_dim: int | None = None
    v_head_dim: int | None = None
    """MLA's value head size (``v_head_dim``; None: ``qk_nope_head_dim``)."""
    indexer_head_dim: int = 0
    """DeepSeek sparse attention (DeepSeek-V3.2, GLM-5: ``index_head_dim``): its indexer
    caches one FP8 key of this size and its scales per token and layer; 0 for none."""
    indexer_heads: int = 0
    """The indexer's heads (``index_n_heads``): it scores every cached token with each."""
    indexer_topk: int = 0
    """Tokens each query attends to (``index_topk``): the latent is read for these only."""
    indexer_shared_layers: tuple[int, ...] = ()
    """Layers that reuse an earlier layer's indexer (GLM-5.2's ``indexer_types`` "shared"):
    no indexer weights of their own and no indexer key cached."""
    # MoE
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    moe_latent_size: int = 0
    """LatentMoE (Nemotron 3 Super: ``moe_latent_size``): the routed experts work in this
    width, between a down- and an up-projection from and to the hidden size; 0: the hidden
    size."""
    # Recurrent state per sequence of one Mamba / linear-attention layer, in elements.
    state_elements_per_layer: int = 0
    state_dtype: str | None = None
    quantization: QuantSpec | None = None
    mtp_layers: int = 0
    """Multi-token-prediction layers the checkpoint carries (``num_nextn_predict_layers``):
    what ``--speculative-config '{"method": "mtp"}'`` drafts with."""
    rotary_dim: int = 0
    """Columns of a head that rotary embeddings turn (MLA: the rope part); 0 without them."""
    mm_tokens_per_item: int = 0
    """Language-model tokens one image becomes, at most (0: a text-only model)."""
    video_frames_per_group: int = 0
    """Frames one video token group spans (Qwen2-VL's ``temporal_patch_size``); 0 where
    vLLM's dummy video is not modelled (additions.profiled_item)."""
    vision_encoder: VisionEncoder | None = None
    """The vision tower's shape (None: a text-only model, or a tower not described)."""
    params: ParamCounts
    checkpoint: Checkpoint = field(default_factory=Checkpoint)
    source: str = "config"
    """Where the spec came from: a folder path, "hub", or "catalog"."""
    revision: str | None = None
    """The Hub revision asked for (``--revision``), which the engine must load too."""
    config_overrides: str = ""
    """The ``--hf-overrides`` this spec was read with (compact JSON; "" for none), so that
    applying them again changes nothing (``rules.overrides.with_overrides``)."""

    def check_context(self, tokens: int | None, flag: str = "--max-model-len") -> None:
        """Refuse a context longer than the model was trained for, as vLLM does.

        Raises:
            InvalidSettingError: ``tokens`` exceeds ``max_position_embeddings`` (what vLLM
                derives from config.json, rope scaling included).
        """
        limit = self.max_position_embeddings
        if tokens is not None and tokens > limit:
            raise InvalidSettingError(
                f"{flag} {tokens:,} is longer than {self.model_id}'s trained maximum of "
                f"{limit:,} tokens (from its config.json); vLLM refuses it.",
                hint=f"Pass {flag} {limit} or less; a model made for RoPE scaling (as "
                "Qwen's YaRN) extends it with --hf-overrides (`oominfer estimate --help`).",
            )

    def context(self, requested: int | None) -> int:
        """The context vLLM serves when asked for ``requested`` tokens (None: its default,
        derived from config.json; LongRoPE models start at their original length)."""
        return requested or self.default_max_model_len or self.max_position_embeddings

    @property
    def is_mla(self) -> bool:
        """True for multi-head latent attention (DeepSeek V2/V3/R1)."""
        return self.kv_lora_rank is not None

    @property
    def is_moe(self) -> bool:
        """True for mixture-of-experts models."""
        return self.num_experts > 0

    @property
    def attention_layers(self) -> int:
        """Layers that keep a KV cache (full or sliding window)."""
        return sum(1 for k in self.layer_kinds if k in ATTENTION_KINDS)

    @property
    def sliding_layers(self) -> int:
        """Attention layers that keep only a sliding window of the KV cache."""
        return self.layer_kinds.count("sliding")

    def kv_width(self, kind: LayerKind) -> tuple[int, int]:
        """(KV heads, head size) of a ``kind`` attention layer: Gemma 4's full-attention
        layers have fewer, wider heads than its sliding-window ones."""
        if kind == "full":
            return self.full_kv_heads or self.num_kv_heads, self.full_head_dim or self.head_dim
        return self.num_kv_heads, self.head_dim

    @property
    def state_layers(self) -> int:
        """Layers that keep a fixed recurrent state per sequence instead of a KV cache."""
        return sum(1 for k in self.layer_kinds if k in STATE_KINDS)
