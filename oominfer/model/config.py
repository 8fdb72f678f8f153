"""Reading a Hugging Face config.json dict into a ModelSpec. Pure: a dict in, a record out.

Every field goes through one validating reader, so a malformed or missing field is an
UnsupportedConfigError naming it, never a KeyError.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final, TypedDict

from oominfer.base.errors import UnsupportedConfigError
from oominfer.model.params import (
    UNGATED_MLP,
    param_counts,
    spatial_merge,
    state_per_layer,
    vision_encoder,
)
from oominfer.model.reader import ConfigReader
from oominfer.model.spec import Checkpoint, LayerKind, ModelSpec, QuantSpec
from oominfer.settings import dtype_name

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


def with_modelopt(config: dict[str, Any], hf_quant_config: Any) -> dict[str, Any]:
    """NVIDIA ModelOpt checkpoints describe their quantization in hf_quant_config.json, not
    in config.json; vLLM reads it from there. Fold it in as a quantization_config."""
    if "quantization_config" in config or not isinstance(hf_quant_config, dict):
        return config
    quant = hf_quant_config.get("quantization") or {}
    if not isinstance(quant, dict) or not quant.get("quant_algo"):
        return config
    return {**config, "quantization_config": {"quant_method": "modelopt", **quant}}


def spec_from_config(
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
    r = ConfigReader(cfg, model_id)
    archs = cfg.get("architectures") or []
    architecture = str(archs[0]) if isinstance(archs, list) and archs else "unknown"
    model_type = str(cfg.get("model_type") or "unknown")
    model_type = _MODEL_TYPE_ALIASES.get(model_type, model_type)

    block_types = cfg.get("layers_block_type")
    layers = r.integer(
        "num_hidden_layers", "n_layer", "num_layers", "n_layers",
        default=len(block_types) if isinstance(block_types, list) and block_types else None,
    )  # fmt: skip
    hidden = r.integer("hidden_size", "n_embd", "d_model", "dim")
    heads = r.integer("num_attention_heads", "n_head", "num_heads", "n_heads")
    if layers == 0 or hidden == 0 or heads == 0:
        raise UnsupportedConfigError(
            f"{model_id}: config.json gives zero layers, hidden size or attention heads."
        )
    nas = _nas_blocks(r, hidden)
    if cfg.get("multi_query") and not cfg.get("new_decoder_architecture"):
        kv_heads = 1
    elif nas is not None:
        groups = [group for group, _ in nas if group]
        if not groups:
            raise UnsupportedConfigError(f"{model_id}: block_configs has no attention layer.")
        kv_heads = heads // max(set(groups), key=groups.count)
    else:
        kv_heads = r.integer("num_key_value_heads", "num_kv_heads", "n_head_kv", default=heads)
    head_dim = r.integer("head_dim", "attention_head_dim", "kv_channels", default=hidden // heads)
    if kv_heads == 0 or head_dim == 0 or heads % kv_heads:
        raise UnsupportedConfigError(
            f"{model_id}: {heads} attention heads cannot be shared by {kv_heads} KV heads."
        )
    n_experts = r.integer("num_local_experts", "num_experts", "n_routed_experts", default=0)
    inter_default = 4 * hidden if model_type in UNGATED_MLP else None
    if n_experts and inter_default is None:
        # Every layer a MoE layer (Qwen3.5's MoE): no dense MLP, no intermediate_size.
        inter_default = r.integer("moe_intermediate_size", default=0) or None
    if nas is not None:  # the widest of the layers' own MLPs
        inter_default = max(width for _, width in nas) or None
    inter = r.integer(
        "intermediate_size", "ffn_dim", "n_inner", "ffn_hidden_size", default=inter_default
    )
    if model_type == "qwen":  # Qwen (1): intermediate_size counts both halves of w1/w2.
        inter //= 2
    vocab = r.integer("vocab_size", "padded_vocab_size")
    tied = r.flag("tie_word_embeddings", model_type in _TIED_BY_DEFAULT)

    kinds = _layer_kinds(r, layers)
    if nas is not None:  # a layer whose attention is a no-op caches nothing
        kinds = tuple("full" if group else "mlp" for group, _ in nas)
    attention_kinds = kinds  # what each layer attends as, KV-shared ones included
    shared = min(r.integer("num_kv_shared_layers", default=0), layers - 1)
    if shared > 0:  # Gemma 4 / 3n: the last layers read an earlier layer's KV cache
        reads: LayerKind = "shared"
        kinds = kinds[: layers - shared] + (reads,) * shared
    window = r.integer("sliding_window", default=0) if "sliding" in kinds else None
    # Gemma 4's full-attention layers: their own KV heads and head size.
    full_kv_heads = r.integer("num_global_key_value_heads", default=0)
    full_head_dim = r.integer("global_head_dim", default=0)
    swa_kv_heads = r.integer("swa_num_key_value_heads", default=0)
    if swa_kv_heads and "sliding" in kinds:
        # MiMo-V2: its sliding-window layers have their own KV heads; the config's are the
        # full-attention layers'.
        full_kv_heads, kv_heads = kv_heads, swa_kv_heads
    quant = _quant_spec(r.section("quantization_config"), model_id)

    kv_lora = r.opt_integer("kv_lora_rank")
    rope_dim = r.opt_integer("qk_rope_head_dim") if kv_lora is not None else None

    moe_inter = r.integer("moe_intermediate_size", default=inter) if n_experts else 0

    sparse = _sparse_attention(r, latent=kv_lora is not None)
    params = param_counts(
        r,
        kinds=attention_kinds,
        model_type=model_type,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        full_kv_heads=full_kv_heads or kv_heads,
        full_head_dim=full_head_dim or head_dim,
        inter=inter,
        layer_inter=tuple(width for _, width in nas) if nas is not None else None,
        shared_indexer=frozenset(sparse["indexer_shared_layers"]),
        kv_shared=shared,
        vocab=vocab,
        tied=tied,
        n_experts=n_experts,
        moe_inter=moe_inter,
    )
    state_elems, state_dtype = state_per_layer(r, kinds, hidden)
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
        max_position_embeddings=(derived := _max_len(r)),
        default_max_model_len=_default_len(r, derived),
        torch_dtype=dtype_name(str(cfg.get("torch_dtype") or cfg.get("dtype") or "float32")),
        tie_word_embeddings=tied,
        layer_kinds=kinds,
        sliding_window=window or None,
        full_kv_heads=full_kv_heads,
        full_head_dim=full_head_dim,
        kv_lora_rank=kv_lora,
        qk_rope_head_dim=rope_dim,
        qk_nope_head_dim=r.opt_integer("qk_nope_head_dim") if kv_lora is not None else None,
        v_head_dim=r.opt_integer("v_head_dim"),
        **sparse,
        num_experts=n_experts,
        num_experts_per_tok=r.integer("num_experts_per_tok", "experts_per_token", default=0),
        moe_intermediate_size=moe_inter,
        moe_latent_size=r.integer("moe_latent_size", default=0) if n_experts else 0,
        state_elements_per_layer=state_elems,
        state_dtype=state_dtype,
        quantization=quant,
        mtp_layers=r.integer(
            "num_nextn_predict_layers",
            "mtp_num_hidden_layers",
            default=_MTP_LAYERS_UNSTATED.get(model_type, 0),
        ),
        rotary_dim=_rotary_dim(cfg, head_dim, rope_dim),
        mm_tokens_per_item=_mm_tokens_per_item(cfg),
        video_frames_per_group=_video_frames_per_group(cfg),
        vision_encoder=vision_encoder(r),
        params=params,
        checkpoint=checkpoint,
        source=src,
    )


# MTP layers vLLM builds where config.json states none: Qwen3-Next's checkpoints carry one
# ``mtp.*`` layer, and vllm/model_executor/models/qwen3_next_mtp.py reads
# ``getattr(config, "num_nextn_predict_layers", 1)``.
_MTP_LAYERS_UNSTATED: Final[dict[str, int]] = {"qwen3_next": 1}


# Qwen2-VL's image processor: max_pixels 12,845,056 / (14 x 14 patches) / (2 x 2 merge).
# Qwen3-VL's (preprocessor_config.json size.longest_edge 16,777,216 pixels, 16 x 16 patches,
# merge 2 x 2) comes to the same 16,384.
_DYNAMIC_RESOLUTION_TOKENS = 12_845_056 // (14 * 14) // 4


_ROPE_KEYS: Final = ("rope_theta", "rope_scaling", "rope_parameters", "rotary_emb_base")


class _Indexer(TypedDict):
    indexer_head_dim: int
    indexer_heads: int
    indexer_topk: int
    indexer_shared_layers: tuple[int, ...]


def _nas_blocks(r: ConfigReader, hidden: int) -> list[tuple[int, int]] | None:
    """Nemotron-NAS / DeciLM (Llama-3.3-Nemotron-Super-49B, -Ultra-253B): each layer's own
    ``block_configs`` entry, as (query heads per KV head, 0 where its attention is a no-op;
    its MLP's intermediate size, 0 where that is a no-op). vLLM's nemotron_nas.py sizes an
    MLP of ``ffn_mult`` at 2 x ffn_mult x hidden / 3 rounded up to a multiple of 256.
    None for other models."""
    blocks = r.cfg.get("block_configs")
    if not isinstance(blocks, list) or not blocks:
        return None
    out: list[tuple[int, int]] = []
    for i, block in enumerate(blocks):
        attention = block.get("attention") if isinstance(block, dict) else None
        ffn = block.get("ffn") if isinstance(block, dict) else None
        if not isinstance(attention, dict) or not isinstance(ffn, dict):
            raise r.invalid(f"block_configs[{i}]", block, "an object with attention and ffn")
        group = 0 if attention.get("no_op") else attention.get("n_heads_in_group")
        if (
            not isinstance(group, int)
            or isinstance(group, bool)
            or group < 0
            or (group == 0 and not attention.get("no_op"))
        ):
            raise r.invalid(f"block_configs[{i}].attention.n_heads_in_group", group, "a count")
        mult, size = ffn.get("ffn_mult"), ffn.get("intermediate_size")
        width = 0
        if ffn.get("no_op"):
            pass
        elif isinstance(mult, int | float) and not isinstance(mult, bool) and mult >= 0:
            width = -(-int(2 * mult * hidden / 3) // 256) * 256
        elif isinstance(size, int) and not isinstance(size, bool) and size >= 0:
            width = size
        else:
            raise r.invalid(f"block_configs[{i}].ffn.ffn_mult", mult, "a non-negative number")
        out.append((group, width))
    if len(out) != r.integer("num_hidden_layers", "n_layer", "num_layers", "n_layers"):
        raise r.invalid("block_configs", len(out), "one entry per layer")
    return out


def _sparse_attention(r: ConfigReader, *, latent: bool) -> _Indexer:
    """DeepSeek sparse attention's indexer (DeepSeek-V3.2, GLM-5), read only beside a
    ``latent`` (MLA) layout: its key width, heads and the top-k tokens each query attends
    to, 0 each without one; and the layers that reuse an earlier layer's indexer (GLM-5.2's
    ``indexer_types``: 57 of 78 "shared")."""
    if not latent:
        return _Indexer(
            indexer_head_dim=0, indexer_heads=0, indexer_topk=0, indexer_shared_layers=()
        )
    types = r.cfg.get("indexer_types")
    shared: tuple[int, ...] = ()
    if isinstance(types, list):
        shared = tuple(i for i, t in enumerate(types) if t == "shared")
    return _Indexer(
        indexer_head_dim=r.integer("index_head_dim", default=0),
        indexer_heads=r.integer("index_n_heads", default=0),
        indexer_topk=r.integer("index_topk", default=0),
        indexer_shared_layers=shared,
    )


def _rotary_dim(cfg: Mapping[str, Any], head_dim: int, rope_dim: int | None) -> int:
    """Columns of a head that rotary embeddings turn: MLA's rope part, else the head times
    ``partial_rotary_factor``; 0 for a config that names no rotary embedding (learned or
    ALiBi positions: OPT, GPT-2, BLOOM)."""
    if not any(key in cfg for key in _ROPE_KEYS):
        return 0
    if rope_dim:
        return rope_dim
    factor = cfg.get("partial_rotary_factor", 1.0)
    share = float(factor) if isinstance(factor, int | float) and 0 < factor <= 1 else 1.0
    return int(head_dim * share)


# Checkpoints whose vLLM processing (vllm/model_executor/models/qwen2_vl.py
# ``Qwen2VLProcessingInfo``, which Qwen2.5-VL's reuses) profiles a dummy video of frames at
# the image processor's largest size. Not Qwen3-VL (qwen3_vl.py ``Qwen3VLProcessingInfo``):
# its video processor caps the pixels of all frames together (size.longest_edge 25,165,824),
# so a video is at most 12,288 embeddings (``VisionEncoder.video_tokens``), fewer than an
# image's 16,384, and 0.13 profiles an image; 0.11-0.12 count 12.5 tokens an embedding
# (memory/additions.py ``profiled_item``) and profile the video.
_VIDEO_MODEL_TYPES: Final = ("qwen2_vl", "qwen2_5_vl")


def _video_frames_per_group(cfg: Mapping[str, Any]) -> int:
    """Frames per video token group (``vision_config.temporal_patch_size``) for the model
    types whose dummy video is modelled; 0 otherwise."""
    vision = cfg.get("vision_config")
    if cfg.get("model_type") not in _VIDEO_MODEL_TYPES or not isinstance(vision, Mapping):
        return 0
    frames = vision.get("temporal_patch_size", 2)
    return frames if isinstance(frames, int) and frames > 0 else 0


def _mm_tokens_per_item(cfg: Mapping[str, Any]) -> int:
    """The most language-model tokens one image becomes: ``mm_tokens_per_image`` (Gemma 3),
    else (image_size / patch_size)^2 / spatial_merge_size^2 from ``vision_config`` (LLaVA:
    (336 / 14)^2 = 576), else the dynamic-resolution maximum; 0 for a text-only model."""
    given = cfg.get("mm_tokens_per_image")
    if isinstance(given, int) and given > 0:
        return given
    vision = cfg.get("vision_config")
    if not isinstance(vision, Mapping):
        return 0
    size, patch = vision.get("image_size"), vision.get("patch_size")
    merge = spatial_merge(cfg)
    if isinstance(size, int) and isinstance(patch, int) and patch > 0:
        return (size // patch) ** 2 // (merge * merge)
    return _DYNAMIC_RESOLUTION_TOKENS


def _layer_kinds(r: ConfigReader, layers: int) -> tuple[LayerKind, ...]:
    """What each layer caches, from the many ways configs say it."""
    cfg, model_id = r.cfg, r.model_id
    names: dict[str, LayerKind] = {
        "full_attention": "full",
        "attention": "full",
        "sliding_attention": "sliding",
        "chunked_attention": "full",
        "linear_attention": "linear_attention",
        "mamba": "mamba",
        "mamba2": "mamba",
        "deepseek_sparse_attention": "full",  # GLM-5.2: MLA with the sparse indexer
        # Nemotron-H's layers_block_type (transformers 5): blocks without attention.
        "moe": "mlp",
        "mlp": "mlp",
    }
    block_types = cfg.get("layers_block_type")
    if isinstance(block_types, list) and len(block_types) == layers:  # Nemotron-H, Nemotron 3
        layer_types: Any = block_types
    else:
        layer_types = cfg.get("layer_types")
    if isinstance(layer_types, list) and len(layer_types) == layers:
        try:
            return tuple(names[str(t)] for t in layer_types)
        except KeyError as err:
            raise UnsupportedConfigError(
                f"{model_id}: unknown layer type {err.args[0]!r} in config.json's "
                "layer_types / layers_block_type."
            ) from None
    hybrid = cfg.get("hybrid_layer_pattern")
    if isinstance(hybrid, list) and len(hybrid) == layers:  # MiMo-V2: 1 sliding, 0 full
        return tuple("sliding" if kind == 1 else "full" for kind in hybrid)
    pattern = cfg.get("hybrid_override_pattern")
    if isinstance(pattern, str) and len(pattern) == layers:  # Nemotron-H
        symbols: dict[str, LayerKind] = {"M": "mamba", "*": "full", "-": "mlp", "E": "mlp"}
        return tuple(symbols.get(ch, "mlp") for ch in pattern)
    n = r.integer("full_attention_interval", default=0)
    if n:  # Qwen3-Next: every n-th layer is full attention
        return tuple("full" if (i + 1) % n == 0 else "linear_attention" for i in range(layers))
    period = r.integer("attn_layer_period", default=0)
    if period:  # Jamba
        offset = r.integer("attn_layer_offset", default=0)
        return tuple("full" if i % period == offset else "mamba" for i in range(layers))
    window = r.integer("sliding_window", default=0)
    uses_window = window and cfg.get("use_sliding_window", True) is not False
    if not uses_window:
        return _every(layers, lambda i: True)
    model_type = cfg.get("model_type")
    if model_type == "gemma2":  # even layers slide
        return _every(layers, lambda i: i % 2 == 1)
    pattern_n = r.integer("sliding_window_pattern", default=0)
    if model_type in ("gemma3", "gemma3_text") or pattern_n:  # every n-th layer is global
        n = pattern_n or 6
        return _every(layers, lambda i: (i + 1) % n == 0)
    max_window_layers = r.opt_integer("max_window_layers")
    if model_type in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe") and max_window_layers is not None:
        return _every(layers, lambda i: i < max_window_layers)
    return _every(layers, lambda i: False)


def _every(layers: int, is_full: Callable[[int], bool]) -> tuple[LayerKind, ...]:
    """Full attention where ``is_full(i)``, a sliding window elsewhere."""
    full: LayerKind = "full"
    sliding: LayerKind = "sliding"
    return tuple(full if is_full(i) else sliding for i in range(layers))


def _max_len(r: ConfigReader) -> int:
    """The context vLLM derives from config.json: the smallest of the length keys, replaced by
    ``model_max_length`` when the config sets one (Command-R), then scaled by RoPE
    (transformers_utils/model_arch_config_convertor.py derive_max_model_len_and_key,
    config/model.py _get_and_verify_max_len; 0.32 and 0.33)."""
    keys = (
        "max_position_embeddings",
        "n_positions",
        "max_seq_len",
        "seq_length",
        "model_max_length",
        "max_target_positions",
        "max_sequence_length",
        "max_seq_length",
        "seq_len",
    )
    found = [n for k in keys if (n := r.integer(k, default=0)) > 0]
    length = min(found) if found else 2048
    if (model_max_length := r.integer("model_max_length", default=0)) > 0:
        length = model_max_length
    rope = _rope(r)
    model_type = str(r.cfg.get("model_type", ""))
    if rope is not None and "gemma3" not in model_type:
        kind = rope.cfg.get("rope_type") or rope.cfg.get("type")
        factor = rope.number("factor", 0.0)
        # vLLM 0.32 (config/model.py _get_and_verify_max_len) multiplies by the factor except
        # for su/longrope/llama3 and the YaRN variants, whose max_position_embeddings is
        # already scaled.
        unscaled = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")
        if kind not in unscaled and kind not in ("default", "mrope") and factor:
            length = int(length * factor)
    return length


def _rope(r: ConfigReader) -> ConfigReader | None:
    """The rope scaling section (``rope_scaling``, or ``rope_parameters``), if any."""
    for key in ("rope_scaling", "rope_parameters"):
        if isinstance(r.cfg.get(key), Mapping) and r.cfg[key]:
            return r.section(key)
    return None


def _default_len(r: ConfigReader, derived: int) -> int:
    """vLLM's max_model_len when none is given: LongRoPE models start at their original
    length (to avoid slowing short sequences); the rest at the derived maximum."""
    rope = _rope(r)
    if rope is not None and (rope.cfg.get("rope_type") or rope.cfg.get("type")) == "longrope":
        original = r.integer("original_max_position_embeddings", default=0)
        if original > 0:
            return min(original, derived)
    return derived


GROUP_SIZE_DEFAULT: Final = 128


def _quant_spec(qc: ConfigReader | None, model_id: str) -> QuantSpec | None:
    """The weight format of a pre-quantized checkpoint, from its quantization_config."""
    if qc is None:
        return None
    method = (qc.text("quant_method") or qc.text("quant_algo")).lower()
    group = qc.positive_or_none("group_size", "q_group_size")
    match method:
        case "awq" | "gptq" | "awq_marlin" | "gptq_marlin" | "auto-round" | "auto_round":
            bits = qc.integer("bits", "w_bit", default=4)
            if all(qc.cfg.get(key) is None for key in ("group_size", "q_group_size")):
                # No group size written: the quantizers' default (transformers GPTQConfig,
                # AutoAWQ, AutoRound: 128); -1 (one scale per channel) stays None.
                group = GROUP_SIZE_DEFAULT
            if not bits:
                raise qc.invalid("bits", bits, "a positive number of bits")
            name = "gptq" if method.startswith("auto") else method.removesuffix("_marlin")
            return QuantSpec(
                method=name,
                bits=bits,
                group_size=group,
                desc_act=qc.flag("desc_act", False),
                symmetric=qc.flag("sym", True),
            )
        case "fp8" | "fbgemm_fp8":
            block = qc.cfg.get("weight_block_size")
            side = block[1] if isinstance(block, list) and len(block) == 2 else None
            weight_block = side if isinstance(side, int) and side > 0 else None
            return QuantSpec(method=method, bits=8, weight_block=weight_block)
        case "mxfp4":
            return QuantSpec(method="mxfp4", bits=4, group_size=32, experts_only=True)
        case "bitsandbytes":
            return QuantSpec(method="bitsandbytes", bits=8 if qc.flag("load_in_8bit", False) else 4)
        case "compressed-tensors" | "compressed_tensors":
            return _compressed_tensors(qc)
        case "modelopt":
            algo = qc.text("quant_algo", "FP8").upper()
            kv_algo = qc.cfg.get("kv_cache_quant_algo") or qc.cfg.get("kv_cache_scheme")
            # vLLM's get_kv_cache_quant_algo_string: "FP8", or a scheme of 8-bit floats.
            kv_fp8 = (isinstance(kv_algo, str) and kv_algo.upper().startswith("FP8")) or (
                isinstance(kv_algo, dict)
                and kv_algo.get("num_bits") == 8
                and kv_algo.get("type") == "float"
            )
            if "FP4" in algo:
                return QuantSpec(method="modelopt_fp4", bits=4.5, kv_cache_fp8=kv_fp8)
            return QuantSpec(method="modelopt", bits=8, kv_cache_fp8=kv_fp8)
        case "":
            raise UnsupportedConfigError(f"{model_id}: quantization_config has no quant_method.")
        case _:
            raise UnsupportedConfigError(
                f"{model_id}: unsupported quantization method {method!r} in config.json.",
                hint="oominfer reads awq, gptq, fp8, bitsandbytes, mxfp4, compressed-tensors "
                "and modelopt checkpoints.",
            )


def _compressed_tensors(qc: ConfigReader) -> QuantSpec:
    """The first config group's weight format (bits, group size)."""
    groups = qc.section("config_groups")
    first = next(iter(groups.cfg), None) if groups is not None else None
    group = groups.section(first) if groups is not None and first is not None else None
    weights = group.section("weights") if group is not None else None
    if weights is None:
        return QuantSpec(method="compressed-tensors", bits=8)
    return QuantSpec(
        method="compressed-tensors",
        bits=weights.integer("num_bits", default=8) or 8,
        group_size=weights.positive_or_none("group_size"),
    )
