"""Parameter counts by role, layer by layer, and recurrent state, from the architecture."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final

from oominfer.model.reader import ConfigReader
from oominfer.model.spec import (
    ATTENTION_KINDS,
    STATE_KINDS,
    LayerKind,
    ParamCounts,
    VisionEncoder,
)

# Model types whose MLP is up/down only (no gate projection).
UNGATED_MLP: Final = frozenset(
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
# Model types with a learned absolute position embedding table.
LEARNED_POSITIONS: Final = {"gpt2": 0, "opt": 2, "gpt_bigcode": 0}


def param_counts(
    r: ConfigReader,
    *,
    kinds: tuple[LayerKind, ...],
    model_type: str,
    hidden: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    full_kv_heads: int,
    full_head_dim: int,
    inter: int,
    vocab: int,
    tied: bool,
    n_experts: int,
    moe_inter: int,
    layer_inter: tuple[int, ...] | None = None,
    shared_indexer: frozenset[int] = frozenset(),
    kv_shared: int = 0,
) -> ParamCounts:
    """Parameters by role, layer by layer, from the architecture alone.

    Gemma 4's full-attention layers project to their own KV heads and head size
    (``full_kv_heads``, ``full_head_dim``); where they share K and V (``attention_k_eq_v``)
    the checkpoint has no v_proj, but vLLM's fused QKV keeps a V slot it loads K into: it is
    counted. Its MoE layers run a dense MLP beside the experts, as a shared expert.
    ``layer_inter``: each layer's own MLP width where they differ (Nemotron-NAS);
    ``shared_indexer``: latent-attention layers without an indexer of their own (GLM-5.2);
    ``kv_shared``: the last layers, which read an earlier layer's KV cache (Gemma 4 / 3n),
    ``kinds`` giving the attention type each has."""
    gated = model_type not in UNGATED_MLP
    mlp_mats = 3 if gated else 2
    biased = r.flag("attention_bias", False) or model_type in ("qwen2", "qwen2_moe", "qwen")
    # Attention projections. MLA (DeepSeek V2/V3) projects through low-rank latents.
    if r.cfg.get("kv_lora_rank") is not None:
        q_rank = r.opt_integer("q_lora_rank")
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
        # vLLM keeps the latent down-projections whole on every rank (q_a_proj and
        # kv_a_proj_with_mqa: ReplicatedLinear, or fused with disable_tp).
        replicated_attn = hidden * ((q_rank or 0) + kv_rank + rope)
        index_heads = r.integer("index_n_heads", default=0)
        index_dim = r.integer("index_head_dim", default=0)
        index_lin = (q_rank or hidden) * index_heads * index_dim if index_dim else 0
        if index_heads and index_dim:
            # DeepSeek sparse attention's indexer, replicated: wq_b from the query latent
            # (quantized with the layer), the key and head-weight projections fused in 16
            # bits (wk_weights_proj), and the key's LayerNorm.
            attn += index_lin
            replicated_attn += index_lin
            replicated_index = hidden * (index_dim + index_heads) + 2 * index_dim
            attn_other += replicated_index
        else:
            replicated_index = 0
        full_attn = attn
    else:
        # Values may be narrower than queries and keys (MiMo-V2-Flash: v_head_dim 128 beside
        # 192): v_proj and o_proj at that width.
        v_dim = r.integer("v_head_dim", default=0)
        index_lin = 0
        attn = (
            hidden * (heads + kv_heads) * head_dim
            + hidden * kv_heads * (v_dim or head_dim)
            + heads * (v_dim or head_dim) * hidden
        )
        # Qwen3-Next and Qwen3.5 gate the full-attention output: q_proj projects a gate
        # beside each query head (vLLM's qkv_proj: heads x (1 + attn_output_gate), the
        # flag on unless config.json turns it off).
        gated_out = r.flag("attn_output_gate", model_type.startswith(("qwen3_next", "qwen3_5")))
        q_heads = heads * (2 if gated_out else 1)
        full_attn = (
            hidden * (q_heads + full_kv_heads) * full_head_dim
            + hidden * full_kv_heads * (v_dim or full_head_dim)
            + heads * (v_dim or full_head_dim) * hidden
        )
        attn_other = (heads + 2 * kv_heads) * head_dim if biased else 0
        replicated_attn = replicated_index = 0
        if r.flag("qk_norm", False) or model_type.startswith(("qwen3", "gemma3", "olmo2")):
            attn_other += 2 * head_dim
    norms_per_layer = 4 if model_type in ("gemma2", "gemma3", "gemma3_text") else 2
    # Llama 4's dense layers (between its MoE layers) have their own width.
    dense_mlp = mlp_mats * hidden * r.integer("intermediate_size_mlp", default=inter)
    mlp_bias = (inter + hidden) if model_type in UNGATED_MLP and r.flag("mlp_bias", True) else 0

    dense_layers = _dense_layers(r, len(kinds), n_experts)
    shared_inter = (
        r.integer("shared_expert_intermediate_size", default=0)
        or r.integer("moe_shared_expert_intermediate_size", default=0)
        or r.integer("n_shared_experts", default=0) * moe_inter
    )
    if model_type == "llama4" or (model_type.startswith("gemma4") and n_experts):
        shared_inter = shared_inter or inter
    expert_bias = (2 * moe_inter + hidden) if model_type == "gpt_oss" else 0
    # LatentMoE: the experts work in the latent width, behind a down- and an up-projection
    # that vLLM keeps whole on every rank (fc1_latent_proj / fc2_latent_proj, ReplicatedLinear).
    latent = r.integer("moe_latent_size", default=0) if n_experts else 0
    expert_hidden = latent or hidden
    latent_proj = 2 * hidden * latent
    state_params = _state_layer_params(r, hidden)
    # Gemma 4 / 3n: the MLP of twice the width the KV-shared layers have with
    # use_double_wide_mlp.
    double_wide = r.flag("use_double_wide_mlp", False)
    first_kv_shared = len(kinds) - kv_shared
    # Per-layer embeddings (Gemma 4 / 3n ``hidden_size_per_layer_input``): a second token
    # table of that width per layer, its projection from the hidden state, and in every
    # layer a gate and a projection back (ReplicatedLinear) with a norm.
    ple = r.integer("hidden_size_per_layer_input", default=0)
    ple_vocab = r.integer("vocab_size_per_layer_input", default=vocab) if ple else 0

    linear: list[int] = []
    experts: list[int] = []
    other: list[int] = []
    replicated_linear: list[int] = []
    replicated_other: list[int] = []
    for i, kind in enumerate(kinds):
        lin, exp, oth = 0, 0, norms_per_layer * hidden
        rep_lin = rep_oth = 0
        if kind in ATTENTION_KINDS and i >= first_kv_shared:
            # K and V come from an earlier layer's cache: q_proj and o_proj only.
            width = full_head_dim if kind == "full" else head_dim
            lin += 2 * hidden * heads * width
            oth += width if attn_other else 0  # q_norm
            if double_wide:
                lin += dense_mlp
        elif kind in ATTENTION_KINDS:
            lin += full_attn if kind == "full" else attn
            oth += attn_other
            rep_lin, rep_oth = replicated_attn, replicated_index
            if i in shared_indexer:  # GLM-5.2: reuses an earlier layer's indexer
                lin, rep_lin = lin - index_lin, rep_lin - index_lin
                oth, rep_oth = oth - replicated_index, 0
        elif kind in STATE_KINDS:
            lin += state_params[0]
            oth += state_params[1]
        # Every layer of these has an MLP; Nemotron-H's M and * layers do not.
        has_mlp = model_type != "nemotron_h" or kind == "mlp"
        if has_mlp and n_experts and i not in dense_layers:
            exp += n_experts * (mlp_mats * expert_hidden * moe_inter + expert_bias)
            lin += mlp_mats * hidden * shared_inter + latent_proj
            rep_lin += latent_proj
            oth += hidden * n_experts + (n_experts if model_type == "gpt_oss" else 0)
            rep_oth += hidden * n_experts  # the router: replicated in every vLLM MoE layer
        elif has_mlp and layer_inter is not None:  # Nemotron-NAS: each layer its own
            lin += mlp_mats * hidden * layer_inter[i]
            oth -= hidden * ((kind == "mlp") + (layer_inter[i] == 0))  # no norm before a no-op
        elif has_mlp:
            lin += dense_mlp
            oth += mlp_bias
        if ple:
            lin += 2 * hidden * ple
            rep_lin += 2 * hidden * ple
            oth += hidden
        if model_type == "nemotron_h":
            oth -= hidden  # one norm per block
        linear.append(lin)
        experts.append(exp)
        other.append(oth)
        replicated_linear.append(rep_lin)
        replicated_other.append(rep_oth)
    offset = LEARNED_POSITIONS.get(model_type)
    positions = 0
    if offset is not None:
        positions = (r.integer("max_position_embeddings", "n_positions") + offset) * hidden
    ple_table = ple_vocab * len(kinds) * ple
    # The projection of the hidden state to every layer's input and its norm.
    ple_projection = hidden * len(kinds) * ple + ple if ple else 0
    return ParamCounts(
        embedding=vocab * hidden + ple_table,
        lm_head=0 if tied else vocab * hidden,
        layer_linear=tuple(linear),
        layer_experts=tuple(experts),
        layer_other=tuple(other),
        final=hidden + positions + ple_projection,
        per_layer_embedding=ple_table,
        vision=vision_params(r, text_hidden=hidden) + audio_params(r),
        layer_replicated_linear=tuple(replicated_linear),
        layer_replicated_other=tuple(replicated_other),
    )


def audio_params(r: ConfigReader) -> int:
    """Parameters of Gemma 4's audio tower (``audio_config.model_type`` gemma4_audio, a
    conformer that vLLM builds with transformers' AutoModel): per block two macaron
    feed-forwards (h x 4h and 4h x h each), attention (q, k, v, out and the relative-position
    key projection), the light convolution (h x 2h in, h x h out, a depthwise kernel), nine
    norms and the per-dimension query scale; the subsampling convolutions and their
    projection ((mel bins / 4) x last channels x h), and the projection to
    ``output_proj_dims``. Exact against transformers 5.19's Gemma4AudioModel for gemma-4-E4B
    (304,824,608). 0 for other checkpoints."""
    a = r.section("audio_config")
    if a is None or a.text("model_type") != "gemma4_audio":
        return 0
    h, layers = a.integer("hidden_size"), a.integer("num_hidden_layers")
    heads = a.integer("num_attention_heads", default=8)
    kernel = a.integer("conv_kernel_size", default=5)
    channels = a.integers("subsampling_conv_channels") or [128, 32]
    mel = a.integer("input_feat_size", default=128)
    out = a.integer("output_proj_dims", default=h)
    block = 24 * h * h + (kernel + 9) * h + h // heads
    convs, previous = 0, 1
    for c in channels:
        convs += 3 * 3 * previous * c + c  # 3 x 3 kernel and its norm
        previous = c
    return layers * block + convs + mel // 4 * previous * h + h * out + out


def vision_params(r: ConfigReader, *, text_hidden: int) -> int:
    """Parameters of a multimodal checkpoint's vision tower and projector (``vision_config``).

    A ViT: per layer the q/k/v/o projections (4 h^2), the MLP (2 h i; 3 h i for the SwiGLU
    MLP of towers with a ``silu`` activation: Qwen2.5-VL, Pixtral), their biases and two
    norms; the patch embedding (channels x temporal x patch^2 x h), the position table and
    the projector to the language model (h x text hidden; with a spatial merge of m x m
    patches, Qwen-VL's merger: (m^2 h)^2 + m^2 h x out). Qwen3-VL adds one more merger per
    ``deepstack_visual_indexes`` entry, each with its own norm over the m^2 h merged features
    and biased linears (vllm/model_executor/models/qwen3_vl.py ``deepstack_merger_list``,
    ``use_postshuffle_norm=True``). Towers with extra blocks (mllama's global layers,
    Llama-4's adapter) are counted by this common part only.
    """
    v = r.section("vision_config")
    if v is None:
        return 0
    layers = v.integer("num_hidden_layers", "depth", default=0)
    hidden = v.integer("hidden_size", "embed_dim", default=0)
    if not layers or not hidden:
        return 0
    inter = v.integer("intermediate_size", default=4 * hidden)
    patch = v.integer("patch_size", default=14)
    channels = v.integer("num_channels", "in_channels", default=3)
    temporal = v.integer("temporal_patch_size", default=1)
    image = v.integer("image_size", default=0)
    positions = v.integer("num_position_embeddings", default=(image // patch) ** 2 if image else 0)
    # Gemma 4's tower: a table per axis (``Gemma4VisionPatchEmbedder.position_embedding_table``).
    positions = positions or 2 * v.integer("position_embedding_size", default=0)
    merge = v.integer("spatial_merge_size", default=1)
    out = v.integer("out_hidden_size", default=text_hidden)
    mlp = (3 if vision_gated(v.cfg) else 2) * hidden * inter
    per_layer = 4 * hidden * hidden + mlp + 9 * hidden + inter
    merged = merge * merge * hidden
    projector = merged * merged + merged * out if merge > 1 else hidden * out
    embed = channels * temporal * patch * patch * hidden + positions * hidden
    deepstack = len(v.integers("deepstack_visual_indexes")) * (
        2 * merged + merged * merged + merged + merged * out + out
    )
    return layers * per_layer + embed + 2 * hidden + projector + deepstack


def spatial_merge(cfg: Mapping[str, Any]) -> int:
    """Patches merged per side into one language-model token: ``vision_config``'s
    ``spatial_merge_size`` (Qwen-VL), else the top level's (Mistral 3's Pixtral), else 1."""
    vision = cfg.get("vision_config")
    inner = vision.get("spatial_merge_size") if isinstance(vision, Mapping) else None
    return int(inner or cfg.get("spatial_merge_size") or 1)


def vision_gated(vision: Mapping[str, Any]) -> bool:
    """A gated tower MLP (gate, up and down projections): the towers whose ``hidden_act`` is
    ``silu`` (Qwen2.5-VL, Pixtral) and Gemma 4's (GeGLU: transformers' ``Gemma4VisionMLP``);
    CLIP, SigLIP, Qwen2-VL and Qwen3-VL's GELU MLPs have two."""
    return (
        str(vision.get("hidden_act", "")) == "silu" or vision.get("model_type") == "gemma4_vision"
    )


def vision_encoder(r: ConfigReader) -> VisionEncoder | None:
    """The vision tower's shape for the profiling run (memory/additions.py
    ``encoder_forward_bytes``); None without a ``vision_config`` that gives its width."""
    v = r.section("vision_config")
    if v is None:
        return None
    hidden = v.integer("hidden_size", "embed_dim", default=0)
    if not hidden:
        return None
    patch = v.integer("patch_size", default=14)
    image = v.integer("image_size", default=0)
    pooled = r.integer("mm_tokens_per_image", default=0)
    merge = spatial_merge(r.cfg)
    positions = (image // patch) ** 2 // pooled if image and pooled else merge * merge
    channels = v.integer("num_channels", "in_channels", "in_chans", default=3)
    temporal = v.integer("temporal_patch_size", default=1)
    deepstack = len(v.integers("deepstack_visual_indexes"))
    out = v.integer("out_hidden_size", default=0)
    video = 0
    if v.cfg.get("model_type") in QWEN3_VL_TOWERS:
        video = QWEN3_VL_VIDEO_PIXELS // (patch * patch * merge * merge * max(temporal, 1))
    return VisionEncoder(
        hidden_size=hidden,
        intermediate_size=v.integer("intermediate_size", default=4 * hidden),
        gated=vision_gated(v.cfg),
        patch_elements=channels * temporal * patch * patch,
        patches_per_token=max(1, positions),
        output_width=out * (1 + deepstack) if deepstack and out else 0,
        video_tokens=video,
    )


QWEN3_VL_TOWERS: Final = ("qwen3_vl", "qwen3_vl_moe")
"""``vision_config.model_type`` of Qwen3-VL's towers (dense and MoE checkpoints)."""
QWEN3_VL_VIDEO_PIXELS: Final = 25_165_824
"""Qwen3-VL's video processor: ``size.longest_edge``, the pixels of all of a video's frames
together (video_preprocessor_config.json; vllm/model_executor/models/qwen3_vl.py
``get_num_video_tokens`` resizes with it)."""


def _dense_layers(r: ConfigReader, layers: int, n_experts: int) -> set[int]:
    """Indices of layers with a dense MLP in a MoE model."""
    if not n_experts:
        return set(range(layers))
    dense = set(range(r.integer("first_k_dense_replace", default=0)))
    dense |= set(r.integers("mlp_only_layers"))
    freq = r.cfg.get("moe_layer_freq")
    if isinstance(freq, list) and len(freq) == layers:  # MiMo-V2: 0 dense, 1 MoE, per layer
        dense |= {i for i, moe in enumerate(freq) if not moe}
    step = (
        r.integer("decoder_sparse_step", default=0)
        or r.integer("interleave_moe_layer_step", default=0)
        or 1
    )
    dense |= {i for i in range(layers) if (i + 1) % step}
    period = r.integer("expert_layer_period", default=0)
    if period:  # Jamba
        offset = r.integer("expert_layer_offset", default=0)
        dense |= {i for i in range(layers) if i % period != offset}
    return dense


def _linear_attention(r: ConfigReader) -> tuple[int, int, int, int, int]:
    """Qwen3-Next gated DeltaNet: key heads, value heads, key dim, value dim, conv kernel."""
    return (
        r.integer("linear_num_key_heads"),
        r.integer("linear_num_value_heads"),
        r.integer("linear_key_head_dim"),
        r.integer("linear_value_head_dim"),
        r.integer("linear_conv_kernel_dim", default=4),
    )


def _mamba2(r: ConfigReader) -> tuple[int, int, int, int, int]:
    """Mamba2 (Nemotron-H): heads, head dim, groups, state size, conv kernel."""
    return (
        r.integer("mamba_num_heads"),
        r.integer("mamba_head_dim"),
        r.integer("n_groups", default=1),
        r.integer("ssm_state_size", default=128),
        r.integer("conv_kernel", default=4),
    )


def _state_layer_params(r: ConfigReader, hidden: int) -> tuple[int, int]:
    """(projection, other) parameters of one Mamba or linear-attention mixer."""
    if r.integer("linear_num_value_heads", default=0):  # Qwen3-Next gated DeltaNet
        kh, vh, kd, vd, kernel = _linear_attention(r)
        qkvz = hidden * (2 * kh * kd + 2 * vh * vd)
        ba = hidden * 2 * vh
        conv = (2 * kh * kd + vh * vd) * kernel
        return qkvz + ba + vh * vd * hidden, conv + 2 * vh + vd
    if r.integer("mamba_num_heads", default=0):  # Mamba2 (Nemotron-H)
        nh, hd, groups, state, kernel = _mamba2(r)
        inner = nh * hd
        conv_dim = inner + 2 * groups * state
        in_proj = hidden * (inner + conv_dim + nh)
        return in_proj + inner * hidden, conv_dim * kernel + 3 * nh + inner
    if r.integer("mamba_d_state", default=0):  # Mamba1 (Jamba)
        inner = r.integer("mamba_expand", default=2) * hidden
        state = r.integer("mamba_d_state")
        rank = r.integer("mamba_dt_rank", default=0) or math.ceil(hidden / 16)
        proj = hidden * 2 * inner + inner * (rank + 2 * state) + rank * inner + inner * hidden
        return proj, inner * r.integer("mamba_d_conv", default=4) + inner * state + inner
    return 0, 0


def state_per_layer(
    r: ConfigReader, kinds: tuple[LayerKind, ...], hidden: int
) -> tuple[int, str | None]:
    """Elements of recurrent state one sequence keeps in one Mamba / linear-attention layer."""
    if not any(k in STATE_KINDS for k in kinds):
        return 0, None
    state_dtype = r.text("mamba_ssm_cache_dtype") or None
    if r.integer("linear_num_value_heads", default=0):
        kh, vh, kd, vd, kernel = _linear_attention(r)
        conv = max(kernel - 1, 0) * (2 * kh * kd + vh * vd)
        return conv + vh * kd * vd, state_dtype
    if r.integer("mamba_num_heads", default=0):
        nh, hd, groups, state, kernel = _mamba2(r)
        conv = max(kernel - 1, 0) * (nh * hd + 2 * groups * state)
        return conv + nh * hd * state, state_dtype
    inner = r.integer("mamba_expand", default=2) * hidden
    state = r.integer("mamba_d_state", "ssm_state_size", default=16)
    return max(r.integer("mamba_d_conv", default=4) - 1, 0) * inner + inner * state, state_dtype
