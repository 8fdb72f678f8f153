"""ModelSpec: the architecture facts the estimator needs, read from a config.json dict.

Pure: a dict in, a frozen dataclass out. No file, network or torch access here; the
loaders in ``oominfer.models`` find the dict (local folder, Hub, catalog) and the
checkpoint's exact sizes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from oominfer.dtypes import FLOAT_SAFETENSORS_DTYPES, SAFETENSORS_BYTES, dtype_name
from oominfer.errors import UnsupportedConfigError

LayerKind = Literal["full", "sliding", "mamba", "linear_attention", "mlp"]
"""What a decoder layer keeps per sequence: a full KV cache, a sliding window of it, a fixed
recurrent state (Mamba, linear attention), or nothing (MLP-only layers of hybrid models)."""

ATTENTION_KINDS: Final = frozenset({"full", "sliding"})
STATE_KINDS: Final = frozenset({"mamba", "linear_attention"})

# Model types whose MLP is up/down only (no gate projection).
_UNGATED_MLP: Final = frozenset(
    {
        "gpt2",
        "opt",
        "gpt_neox",
        "falcon",
        "phi",
        "bloom",
        "gpt_bigcode",
        "starcoder2",
        "gptj",
        "nemotron_h",
    }
)
# Model types whose config class ties the embeddings to the LM head unless told otherwise.
_TIED_BY_DEFAULT: Final = frozenset(
    {
        "gpt2",
        "opt",
        "gemma",
        "gemma2",
        "gemma3",
        "gemma3_text",
        "bloom",
        "gpt_bigcode",
        "phi",
        "gptj",
    }
)
_MODEL_TYPE_ALIASES: Final = {"RefinedWeb": "falcon", "RefinedWebModel": "falcon"}
# Model types with a learned absolute position embedding table.
_LEARNED_POSITIONS: Final = {"gpt2": 0, "opt": 2, "gpt_bigcode": 0}


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

    @property
    def total(self) -> int:
        """All parameters."""
        return (
            self.embedding
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
    # MLA (DeepSeek V2/V3): the latent is cached once per token and layer.
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    qk_nope_head_dim: int | None = None
    # MoE
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    # Recurrent state per sequence of one Mamba / linear-attention layer, in elements.
    state_elements_per_layer: int = 0
    state_dtype: str | None = None
    quantization: QuantSpec | None = None
    params: ParamCounts
    checkpoint: Checkpoint = field(default_factory=Checkpoint)
    source: str = "config"
    """Where the spec came from: a folder path, "hub", or "catalog"."""

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
    def state_layers(self) -> int:
        """Layers that keep a fixed recurrent state per sequence instead of a KV cache."""
        return sum(1 for k in self.layer_kinds if k in STATE_KINDS)

    @classmethod
    def from_hf_config(
        cls,
        config: Mapping[str, Any],
        *,
        model_id: str,
        checkpoint: Checkpoint | None = None,
        source: str = "config",
    ) -> ModelSpec:
        """Read a Hugging Face config.json dict.

        Args:
            config: the parsed config.json.
            model_id: the name to show for the model.
            checkpoint: exact tensor sizes, when known.
            source: where the config came from.

        Raises:
            UnsupportedConfigError: a field the estimator needs is missing or malformed.
        """
        return _parse(config, model_id=model_id, checkpoint=checkpoint or Checkpoint(), src=source)


class _Reader:
    """Typed access to config fields, with errors that name the missing field."""

    def __init__(self, cfg: Mapping[str, Any], model_id: str) -> None:
        self.cfg = cfg
        self.model_id = model_id

    def integer(self, *keys: str, default: int | None = None) -> int:
        for key in keys:
            value = self.cfg.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise UnsupportedConfigError(
                    f"{self.model_id}: config.json field {key!r} must be a non-negative "
                    f"integer, got {value!r}."
                )
            return int(value)
        if default is not None:
            return default
        raise UnsupportedConfigError(
            f"{self.model_id}: config.json lacks {' / '.join(repr(k) for k in keys)}, "
            "which the memory estimate needs.",
            hint="Check that the folder holds the model's own config.json.",
        )

    def opt_integer(self, *keys: str) -> int | None:
        return (
            self.integer(*keys, default=-1)
            if any(self.cfg.get(k) is not None for k in keys)
            else None
        )

    def flag(self, key: str, default: bool) -> bool:
        value = self.cfg.get(key)
        return default if value is None else bool(value)


def _text_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """Flatten multimodal configs: the language model's fields live under text_config."""
    if not isinstance(config, Mapping):
        raise UnsupportedConfigError("config.json must hold a JSON object.")
    flat = dict(config)
    for key in ("text_config", "llm_config", "language_config"):
        sub = config.get(key)
        if isinstance(sub, Mapping) and "num_hidden_layers" not in config:
            flat = {**{k: v for k, v in config.items() if k != key}, **sub}
            # The outer architecture names the checkpoint; keep it.
            flat["architectures"] = config.get("architectures") or sub.get("architectures")
            flat.setdefault("torch_dtype", config.get("torch_dtype"))
            if "quantization_config" in config:
                flat["quantization_config"] = config["quantization_config"]
            break
    return flat


def _parse(raw: Mapping[str, Any], *, model_id: str, checkpoint: Checkpoint, src: str) -> ModelSpec:
    cfg = _text_config(raw)
    r = _Reader(cfg, model_id)
    archs = cfg.get("architectures") or []
    architecture = str(archs[0]) if isinstance(archs, list) and archs else "unknown"
    model_type = str(cfg.get("model_type") or "unknown")
    model_type = _MODEL_TYPE_ALIASES.get(model_type, model_type)

    layers = r.integer("num_hidden_layers", "n_layer", "num_layers", "n_layers")
    hidden = r.integer("hidden_size", "n_embd", "d_model", "dim")
    heads = r.integer("num_attention_heads", "n_head", "num_heads", "n_heads")
    if layers == 0 or hidden == 0 or heads == 0:
        raise UnsupportedConfigError(
            f"{model_id}: config.json gives zero layers, hidden size or attention heads."
        )
    if cfg.get("multi_query") and not cfg.get("new_decoder_architecture"):
        kv_heads = 1
    else:
        kv_heads = r.integer("num_key_value_heads", "num_kv_heads", "n_head_kv", default=heads)
    head_dim = r.integer("head_dim", "attention_head_dim", "kv_channels", default=hidden // heads)
    if kv_heads == 0 or head_dim == 0 or heads % kv_heads:
        raise UnsupportedConfigError(
            f"{model_id}: {heads} attention heads cannot be shared by {kv_heads} KV heads."
        )
    inter_default = 4 * hidden if model_type in _UNGATED_MLP else None
    inter = r.integer(
        "intermediate_size", "ffn_dim", "n_inner", "ffn_hidden_size", default=inter_default
    )
    if model_type == "qwen":  # Qwen (1): intermediate_size counts both halves of w1/w2.
        inter //= 2
    vocab = r.integer("vocab_size", "padded_vocab_size")
    tied = r.flag("tie_word_embeddings", model_type in _TIED_BY_DEFAULT)

    kinds = _layer_kinds(cfg, layers, model_id)
    window = cfg.get("sliding_window") if "sliding" in kinds else None
    quant = _quant_spec(cfg.get("quantization_config"), model_id)

    kv_lora = r.opt_integer("kv_lora_rank")
    rope_dim = r.opt_integer("qk_rope_head_dim") if kv_lora is not None else None

    n_experts = r.integer("num_local_experts", "num_experts", "n_routed_experts", default=0)
    moe_inter = r.integer("moe_intermediate_size", default=inter) if n_experts else 0

    params = _param_counts(
        cfg,
        r,
        kinds=kinds,
        model_type=model_type,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        inter=inter,
        vocab=vocab,
        tied=tied,
        n_experts=n_experts,
        moe_inter=moe_inter,
    )
    state_elems, state_dtype = _state_per_layer(cfg, r, kinds, hidden)
    return ModelSpec(
        model_id=model_id,
        architecture=architecture,
        model_type=model_type,
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=inter,
        vocab_size=vocab,
        max_position_embeddings=(derived := _max_len(cfg, r)),
        default_max_model_len=_default_len(cfg, derived),
        torch_dtype=dtype_name(str(cfg.get("torch_dtype") or cfg.get("dtype") or "float32")),
        tie_word_embeddings=tied,
        layer_kinds=kinds,
        sliding_window=int(window) if isinstance(window, int) and window > 0 else None,
        kv_lora_rank=kv_lora,
        qk_rope_head_dim=rope_dim,
        qk_nope_head_dim=r.opt_integer("qk_nope_head_dim") if kv_lora is not None else None,
        num_experts=n_experts,
        num_experts_per_tok=r.integer("num_experts_per_tok", "experts_per_token", default=0),
        moe_intermediate_size=moe_inter,
        state_elements_per_layer=state_elems,
        state_dtype=state_dtype,
        quantization=quant,
        params=params,
        checkpoint=checkpoint,
        source=src,
    )


def _layer_kinds(cfg: Mapping[str, Any], layers: int, model_id: str) -> tuple[LayerKind, ...]:
    """What each layer caches, from the many ways configs say it."""
    names: dict[str, LayerKind] = {
        "full_attention": "full",
        "attention": "full",
        "sliding_attention": "sliding",
        "chunked_attention": "full",
        "linear_attention": "linear_attention",
        "mamba": "mamba",
        "mamba2": "mamba",
    }
    layer_types = cfg.get("layer_types")
    if isinstance(layer_types, list) and len(layer_types) == layers:
        try:
            return tuple(names[str(t)] for t in layer_types)
        except KeyError as err:
            raise UnsupportedConfigError(
                f"{model_id}: unknown layer type {err.args[0]!r} in config.json layer_types."
            ) from None
    pattern = cfg.get("hybrid_override_pattern")
    if isinstance(pattern, str) and len(pattern) == layers:  # Nemotron-H
        symbols: dict[str, LayerKind] = {"M": "mamba", "*": "full", "-": "mlp", "E": "mlp"}
        return tuple(symbols.get(ch, "mlp") for ch in pattern)
    if cfg.get("full_attention_interval"):  # Qwen3-Next: every n-th layer is full attention
        n = int(cfg["full_attention_interval"])
        return tuple("full" if (i + 1) % n == 0 else "linear_attention" for i in range(layers))
    if cfg.get("attn_layer_period"):  # Jamba
        period, offset = int(cfg["attn_layer_period"]), int(cfg.get("attn_layer_offset", 0))
        return tuple("full" if i % period == offset else "mamba" for i in range(layers))
    window = cfg.get("sliding_window")
    uses_window = window and cfg.get("use_sliding_window", True) is not False
    if not uses_window:
        return _every(layers, lambda i: True)
    model_type = cfg.get("model_type")
    if model_type == "gemma2":  # even layers slide
        return _every(layers, lambda i: i % 2 == 1)
    pattern_n = cfg.get("sliding_window_pattern")
    if model_type in ("gemma3", "gemma3_text") or pattern_n:  # every n-th layer is global
        n = int(pattern_n or 6)
        return _every(layers, lambda i: (i + 1) % n == 0)
    max_window_layers = cfg.get("max_window_layers")
    if model_type in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe") and max_window_layers is not None:
        return _every(layers, lambda i: i < max_window_layers)
    return _every(layers, lambda i: False)


def _every(layers: int, is_full: Callable[[int], bool]) -> tuple[LayerKind, ...]:
    """Full attention where ``is_full(i)``, a sliding window elsewhere."""
    full: LayerKind = "full"
    sliding: LayerKind = "sliding"
    return tuple(full if is_full(i) else sliding for i in range(layers))


def _max_len(cfg: Mapping[str, Any], r: _Reader) -> int:
    """The context vLLM derives from config.json (vllm.config.model._get_and_verify_max_len)."""
    keys = (
        "max_position_embeddings",
        "n_positions",
        "max_seq_len",
        "seq_length",
        "max_sequence_length",
        "max_seq_length",
        "seq_len",
    )
    found = [int(cfg[k]) for k in keys if isinstance(cfg.get(k), int | float) and cfg[k] > 0]
    length = min(found) if found else 2048
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    model_type = str(cfg.get("model_type", ""))
    if isinstance(rope, Mapping) and "gemma3" not in model_type:
        kind = rope.get("rope_type") or rope.get("type")
        factor = rope.get("factor")
        # vLLM 0.32 (config/model.py _get_and_verify_max_len) multiplies by the factor except
        # for su/longrope/llama3 and the YaRN variants, whose max_position_embeddings is
        # already scaled.
        unscaled = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")
        if kind not in unscaled and kind not in ("default", "mrope") and factor:
            length = int(length * float(factor))
    return length


def _default_len(cfg: Mapping[str, Any], derived: int) -> int:
    """vLLM's max_model_len when none is given: LongRoPE models start at their original
    length (to avoid slowing short sequences); the rest at the derived maximum."""
    rope = cfg.get("rope_scaling") or {}
    if isinstance(rope, Mapping) and (rope.get("rope_type") or rope.get("type")) == "longrope":
        original = cfg.get("original_max_position_embeddings")
        if isinstance(original, int) and original > 0:
            return min(original, derived)
    return derived


def _quant_spec(qc: Any, model_id: str) -> QuantSpec | None:
    """The weight format of a pre-quantized checkpoint, from its quantization_config."""
    if not isinstance(qc, Mapping):
        return None
    method = str(qc.get("quant_method") or qc.get("quant_algo") or "").lower()
    group = qc.get("group_size", qc.get("q_group_size"))
    group = int(group) if isinstance(group, int) and group > 0 else None
    match method:
        case "awq" | "gptq" | "awq_marlin" | "gptq_marlin" | "auto-round" | "auto_round":
            bits = int(qc.get("bits", qc.get("w_bit", 4)))
            name = "gptq" if method.startswith("auto") else method.removesuffix("_marlin")
            return QuantSpec(method=name, bits=bits, group_size=group)
        case "fp8" | "fbgemm_fp8":
            return QuantSpec(method="fp8", bits=8)
        case "mxfp4":
            return QuantSpec(method="mxfp4", bits=4, group_size=32, experts_only=True)
        case "bitsandbytes":
            return QuantSpec(method="bitsandbytes", bits=8 if qc.get("load_in_8bit") else 4)
        case "compressed-tensors" | "compressed_tensors":
            return _compressed_tensors(qc)
        case "modelopt":
            algo = str(qc.get("quant_algo", "FP8")).upper()
            return QuantSpec(method="modelopt", bits=4.5 if "FP4" in algo else 8)
        case "":
            raise UnsupportedConfigError(f"{model_id}: quantization_config has no quant_method.")
        case _:
            raise UnsupportedConfigError(
                f"{model_id}: unsupported quantization method {method!r} in config.json.",
                hint="oominfer reads awq, gptq, fp8, bitsandbytes, mxfp4, compressed-tensors "
                "and modelopt checkpoints.",
            )


def _compressed_tensors(qc: Mapping[str, Any]) -> QuantSpec:
    groups = qc.get("config_groups") or {}
    for group in groups.values() if isinstance(groups, Mapping) else ():
        weights = group.get("weights") or {}
        bits = int(weights.get("num_bits", 8))
        size = weights.get("group_size")
        return QuantSpec(
            method="compressed-tensors",
            bits=bits,
            group_size=int(size) if isinstance(size, int) and size > 0 else None,
        )
    return QuantSpec(method="compressed-tensors", bits=8)


def _param_counts(
    cfg: Mapping[str, Any],
    r: _Reader,
    *,
    kinds: tuple[LayerKind, ...],
    model_type: str,
    hidden: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    inter: int,
    vocab: int,
    tied: bool,
    n_experts: int,
    moe_inter: int,
) -> ParamCounts:
    """Parameters by role, layer by layer, from the architecture alone."""
    gated = model_type not in _UNGATED_MLP
    mlp_mats = 3 if gated else 2
    biased = bool(cfg.get("attention_bias")) or model_type in ("qwen2", "qwen2_moe", "qwen")
    # Attention projections. MLA (DeepSeek V2/V3) projects through low-rank latents.
    if cfg.get("kv_lora_rank") is not None:
        q_rank = cfg.get("q_lora_rank")
        nope, rope = r.integer("qk_nope_head_dim"), r.integer("qk_rope_head_dim")
        v_dim, kv_rank = r.integer("v_head_dim"), r.integer("kv_lora_rank")
        q_proj = (
            (hidden * q_rank + q_rank * heads * (nope + rope))
            if q_rank
            else (hidden * heads * (nope + rope))
        )
        attn = (
            q_proj
            + hidden * (kv_rank + rope)
            + kv_rank * heads * (nope + v_dim)
            + heads * v_dim * hidden
        )
        attn_other = kv_rank + (q_rank or 0)
    else:
        attn = hidden * (heads + 2 * kv_heads) * head_dim + heads * head_dim * hidden
        attn_other = (heads + 2 * kv_heads) * head_dim if biased else 0
        if cfg.get("qk_norm") or model_type.startswith(("qwen3", "gemma3", "olmo2")):
            attn_other += 2 * head_dim
    norms_per_layer = 4 if model_type in ("gemma2", "gemma3", "gemma3_text") else 2
    dense_mlp = mlp_mats * hidden * inter
    mlp_bias = (inter + hidden) if model_type in _UNGATED_MLP and cfg.get("mlp_bias", True) else 0

    dense_layers = _dense_layers(cfg, len(kinds), n_experts)
    shared_inter = (
        int(cfg.get("shared_expert_intermediate_size") or 0)
        or int(cfg.get("moe_shared_expert_intermediate_size") or 0)
        or int(cfg.get("n_shared_experts") or 0) * moe_inter
    )
    if model_type == "llama4":
        shared_inter = shared_inter or inter
    expert_bias = (2 * moe_inter + hidden) if model_type == "gpt_oss" else 0
    state_params = _state_layer_params(cfg, hidden)

    linear: list[int] = []
    experts: list[int] = []
    other: list[int] = []
    for i, kind in enumerate(kinds):
        lin, exp, oth = 0, 0, norms_per_layer * hidden
        if kind in ATTENTION_KINDS:
            lin += attn
            oth += attn_other
        elif kind in STATE_KINDS:
            lin += state_params[0]
            oth += state_params[1]
        # Every layer of these has an MLP; Nemotron-H's M and * layers do not.
        has_mlp = model_type != "nemotron_h" or kind == "mlp"
        if has_mlp and n_experts and i not in dense_layers:
            exp += n_experts * (mlp_mats * hidden * moe_inter + expert_bias)
            lin += mlp_mats * hidden * shared_inter
            oth += hidden * n_experts + (n_experts if model_type == "gpt_oss" else 0)
        elif has_mlp:
            lin += dense_mlp
            oth += mlp_bias
        if model_type == "nemotron_h":
            oth -= hidden  # one norm per block
        linear.append(lin)
        experts.append(exp)
        other.append(oth)
    offset = _LEARNED_POSITIONS.get(model_type)
    positions = 0
    if offset is not None:
        positions = (r.integer("max_position_embeddings", "n_positions") + offset) * hidden
    return ParamCounts(
        embedding=vocab * hidden,
        lm_head=0 if tied else vocab * hidden,
        layer_linear=tuple(linear),
        layer_experts=tuple(experts),
        layer_other=tuple(other),
        final=hidden + positions,
    )


def _dense_layers(cfg: Mapping[str, Any], layers: int, n_experts: int) -> set[int]:
    """Indices of layers with a dense MLP in a MoE model."""
    if not n_experts:
        return set(range(layers))
    dense = set(range(int(cfg.get("first_k_dense_replace") or 0)))
    dense |= {int(i) for i in cfg.get("mlp_only_layers") or []}
    step = int(cfg.get("decoder_sparse_step") or cfg.get("interleave_moe_layer_step") or 1)
    dense |= {i for i in range(layers) if (i + 1) % step}
    if cfg.get("expert_layer_period"):  # Jamba
        period, offset = int(cfg["expert_layer_period"]), int(cfg.get("expert_layer_offset", 0))
        dense |= {i for i in range(layers) if i % period != offset}
    return dense


def _state_layer_params(cfg: Mapping[str, Any], hidden: int) -> tuple[int, int]:
    """(projection, other) parameters of one Mamba or linear-attention mixer."""
    if cfg.get("linear_num_value_heads"):  # Qwen3-Next gated DeltaNet
        kh, vh = int(cfg["linear_num_key_heads"]), int(cfg["linear_num_value_heads"])
        kd, vd = int(cfg["linear_key_head_dim"]), int(cfg["linear_value_head_dim"])
        qkvz = hidden * (2 * kh * kd + 2 * vh * vd)
        ba = hidden * 2 * vh
        conv = (2 * kh * kd + vh * vd) * int(cfg.get("linear_conv_kernel_dim", 4))
        return qkvz + ba + vh * vd * hidden, conv + 2 * vh + vd
    if cfg.get("mamba_num_heads"):  # Mamba2 (Nemotron-H)
        nh, hd = int(cfg["mamba_num_heads"]), int(cfg["mamba_head_dim"])
        groups, state = int(cfg.get("n_groups", 1)), int(cfg.get("ssm_state_size", 128))
        inner = nh * hd
        conv_dim = inner + 2 * groups * state
        in_proj = hidden * (inner + conv_dim + nh)
        return in_proj + inner * hidden, conv_dim * int(cfg.get("conv_kernel", 4)) + 3 * nh + inner
    if cfg.get("mamba_d_state"):  # Mamba1 (Jamba)
        inner = int(cfg.get("mamba_expand", 2)) * hidden
        state, rank = (
            int(cfg["mamba_d_state"]),
            int(cfg.get("mamba_dt_rank") or math.ceil(hidden / 16)),
        )
        proj = hidden * 2 * inner + inner * (rank + 2 * state) + rank * inner + inner * hidden
        return proj, inner * int(cfg.get("mamba_d_conv", 4)) + inner * state + inner
    return 0, 0


def _state_per_layer(
    cfg: Mapping[str, Any], r: _Reader, kinds: tuple[LayerKind, ...], hidden: int
) -> tuple[int, str | None]:
    """Elements of recurrent state one sequence keeps in one Mamba / linear-attention layer."""
    if not any(k in STATE_KINDS for k in kinds):
        return 0, None
    state_dtype = cfg.get("mamba_ssm_cache_dtype")
    if cfg.get("linear_num_value_heads"):
        kh, vh = int(cfg["linear_num_key_heads"]), int(cfg["linear_num_value_heads"])
        kd, vd = int(cfg["linear_key_head_dim"]), int(cfg["linear_value_head_dim"])
        conv = (int(cfg.get("linear_conv_kernel_dim", 4)) - 1) * (2 * kh * kd + vh * vd)
        return conv + vh * kd * vd, state_dtype
    if cfg.get("mamba_num_heads"):
        nh, hd = int(cfg["mamba_num_heads"]), int(cfg["mamba_head_dim"])
        groups, state = int(cfg.get("n_groups", 1)), int(cfg.get("ssm_state_size", 128))
        conv = (int(cfg.get("conv_kernel", 4)) - 1) * (nh * hd + 2 * groups * state)
        return conv + nh * hd * state, state_dtype
    inner = int(cfg.get("mamba_expand", 2)) * hidden
    state = r.integer("mamba_d_state", "ssm_state_size", default=16)
    return (int(cfg.get("mamba_d_conv", 4)) - 1) * inner + inner * state, state_dtype
