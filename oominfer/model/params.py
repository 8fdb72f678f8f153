"""Parameter counts by role, layer by layer, and recurrent state, from the architecture."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final

from oominfer.model.reader import ConfigReader
from oominfer.model.spec import ATTENTION_KINDS, STATE_KINDS, LayerKind, ParamCounts

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
    cfg: Mapping[str, Any],
    r: ConfigReader,
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
    gated = model_type not in UNGATED_MLP
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
    mlp_bias = (inter + hidden) if model_type in UNGATED_MLP and cfg.get("mlp_bias", True) else 0

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
    offset = LEARNED_POSITIONS.get(model_type)
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


def state_per_layer(
    cfg: Mapping[str, Any], r: ConfigReader, kinds: tuple[LayerKind, ...], hidden: int
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
