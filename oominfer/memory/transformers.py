"""The transformers engine's memory: weights, a dynamic KV cache per sequence, no paging."""

from __future__ import annotations

import math
from typing import Final

from oominfer.base.units import MiB
from oominfer.memory.breakdown import MemoryBreakdown, unpaged_seq_bytes
from oominfer.memory.dtypes import dtype_bytes
from oominfer.memory.profile import HIDDEN_TEMPORARIES, MLP_TEMPORARIES
from oominfer.memory.weights import stage_expert_bytes, weight_format
from oominfer.model.spec import ModelSpec

TRANSFORMERS_OVERHEAD_BYTES: Final = 695 * MiB
"""What the GPU holds for the engine beyond torch's caching allocator: the CUDA context and
the cuBLAS/cuDNN handles. Measured by NVML beside ``torch.cuda.memory_reserved()`` after a
load and a prefill: 694.8 MiB on an H100 and on an H200 alike (torch 2.11 + CUDA 13,
tests/data/calibration/device_transformers.jsonl)."""

TRANSFORMERS_CPU_OVERHEAD_BYTES: Final = 512 * MiB
"""On the CPU (``--device cpu``) no CUDA context: a margin for the runtime's own buffers."""

FUSED_GATE_UP: Final = frozenset(
    {"Phi3ForCausalLM", "Phi4MMForCausalLM", "GlmForCausalLM", "Glm4ForCausalLM"}
)
"""transformers models whose MLP is one ``gate_up_proj``: its 2 x intermediate output, the
activation of its gate half and the product are alive together (4 x intermediate)."""

ROUTED_COPIES: Final = 4
"""transformers' grouped-GEMM experts (integrations/moe.py ``grouped_mm_experts_forward``)
hold, per routed token, its gathered hidden state and then either the fused gate/up output,
its gate's activation and their product (4 x the expert's intermediate size) or, at the
end, three more hidden-size rows: the experts' output, its weighted copy and that copy put
back in token order."""

FP32_ROUTERS: Final = frozenset(
    {"DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "Glm4MoeForCausalLM"}
)
"""Routers that weigh the experts in float32: the weighted copy and its reordering are
float32, two more hidden-size rows per routed token (6 in all)."""


PADDED_GROUP_WIDTH: Final = 2048
"""The widest prompt a prefill group pads others to (the transformers engine's scheduler).
Prompts of unequal length in one group need an explicit [rows, 1, n, n] boolean mask, which
SDPA turns into an additive copy in the model's dtype, with the keys and values repeated to
every head (seen in transformers 5.19's sdpa path: without padding it passes no mask and
uses GQA). Past this width a prompt is prefilled alone (or with prompts of its own length),
so the mask stays linear in ``max_prefill_tokens``: at most that x this width elements."""


def padded_mask_elements(tokens: int) -> int:
    """The largest padded prefill mask a group of at most ``tokens`` padded tokens makes:
    rows x n x n with rows x n <= tokens, two rows or more, n <= PADDED_GROUP_WIDTH."""
    return tokens * min(PADDED_GROUP_WIDTH, tokens // 2)


def unquantized_expert_bytes(spec: ModelSpec, *, dtype: str, quantization: str | None) -> int:
    """What a MoE model's routed experts weigh beyond their quantized count under
    bitsandbytes on the transformers engine.

    transformers 5 keeps each layer's experts as fused 3-D parameters (``gate_up_proj``,
    ``down_proj``), and bitsandbytes quantizes by replacing ``nn.Linear`` modules: the
    experts stay in the model's 16-bit dtype, int8 and nf4 alike (seen loading a Qwen3-MoE
    with ``load_in_4bit`` and ``load_in_8bit``). vLLM's bitsandbytes does quantize them.
    """
    fmt = weight_format(spec, quantization)
    if not spec.is_moe or fmt is None or fmt.method not in ("int8", "bitsandbytes"):
        return 0
    quantized = sum(stage_expert_bytes(spec, dtype=dtype, quantization=quantization, pp=1))
    return int(quantized * (dtype_bytes(dtype) / fmt.bytes_per_param - 1))


def transformers_kept_tokens(spec: ModelSpec, length: int) -> int:
    """Tokens a sliding-window layer keeps for one sequence of ``length`` tokens.

    transformers' ``DynamicSlidingWindowLayer`` keeps the last ``sliding_window - 1`` tokens
    (measured: 4,095 on Gemma-2-9B, 511 on Gemma-3-1B, 2,046 on Phi-3-mini's 2,047 window);
    a full-attention layer keeps them all."""
    if not spec.sliding_window:
        return length
    return min(length, spec.sliding_window - 1)


def transformers_seq_kv_bytes(spec: ModelSpec, *, length: int, per_token: int) -> int:
    """The dynamic cache of one sequence of ``length`` tokens, ``per_token`` being the bytes
    a token takes in all the attention layers (the breakdown's ``kv_bytes_per_token``)."""
    return unpaged_seq_bytes(
        per_token,
        sliding_per_token=sliding_bytes_per_token(spec, per_token),
        kept_tokens=transformers_kept_tokens(spec, length),
        length=length,
    )


def sliding_bytes_per_token(spec: ModelSpec, per_token: int) -> int:
    """The part of ``per_token`` (bytes a token takes in all the attention layers) in the
    sliding-window layers."""
    sliding_heads, sliding_dim = spec.kv_width("sliding")
    full_heads, full_dim = spec.kv_width("full")
    sliding = spec.sliding_layers * sliding_heads * sliding_dim
    full = (spec.attention_layers - spec.sliding_layers) * full_heads * full_dim
    return per_token * sliding // (sliding + full) if sliding + full else 0


def _repeated_kv_bytes(spec: ModelSpec, *, tokens: int, dtype_size: int, tp: int) -> int:
    """Keys and values repeated to every query head, as transformers' SDPA path does when it
    passes a mask (``repeat_kv``; without one it lets SDPA's GQA read the shared heads)."""
    return tokens * 2 * spec.num_attention_heads * spec.head_dim // tp * dtype_size


def decode_step_share(spec: ModelSpec, length: int, *, padded: bool) -> float:
    """What a decode step holds beside the KV cache for a moment, as a share of the cache.

    Each layer's ``DynamicLayer.update`` concatenates the new token onto its keys, then its
    values (``torch.cat``): the old and the new tensor of one of them are alive together,
    half a layer's cache more. Rows of unequal length (``padded``) decode with an explicit
    mask, and transformers' SDPA path then repeats the layer's keys and values to every query
    head (``repeat_kv``; seen in 5.19 on the CPU: a padded batch's decode gets keys of all
    heads, an even one shares them through SDPA's GQA): (heads / KV heads) x the layer's
    cache. The largest layer is a full-attention one, measured at sequences of ``length``
    tokens (past the sliding window the sliding layers hold less)."""
    layers = spec.attention_layers
    if not layers:
        return 0.0
    ratio = spec.num_attention_heads / max(spec.num_kv_heads, 1)
    held = max(0.5, ratio if padded and ratio > 1 else 0.0)
    kept = transformers_kept_tokens(spec, length)
    full = layers - spec.sliding_layers
    largest = length if full else kept
    return held * largest / (full * length + spec.sliding_layers * kept)


def _sliding_prefill_bytes(
    spec: ModelSpec, *, tokens: int, dtype_size: int, tp: int
) -> tuple[int, int]:
    """What a prompt longer than the sliding window adds to a prefill: (at attention, held).

    Past the window the sliding layers' attention gets a boolean ``[1, 1, n, n]`` mask
    (1 byte a pair, held through the pass); SDPA turns it into an additive mask in the
    model's dtype for the call (2 bytes a pair) and, masked, takes keys and values repeated
    to every query head. Each sliding layer's cache is a slice of the prompt's keys and
    values, which keeps the whole prompt's storage alive until the first decode step.
    Measured on Gemma-2-9B (8,192 tokens), Gemma-3-1B (2,048-32,768) and Phi-3-mini
    (2,048) on an H200 (run 4): without these, 45%, 28-62% and 3% low."""
    sliding = spec.sliding_layers
    window = spec.sliding_window or 0
    if not sliding or tokens <= window:
        return 0, 0
    at_attention = _repeated_kv_bytes(spec, tokens=tokens, dtype_size=dtype_size, tp=tp)
    at_attention += 2 * tokens * tokens
    per_layer = 2 * spec.num_kv_heads * spec.head_dim // tp * dtype_size
    beyond = tokens - transformers_kept_tokens(spec, tokens)
    return at_attention, tokens * tokens + sliding * beyond * per_layer


def transformers_forward_bytes(
    spec: ModelSpec, *, tokens: int, dtype_size: int, tp: int, groups: bool = False
) -> int:
    """Peak of one transformers forward pass over ``tokens`` tokens above the weights and
    the cache.

    Eager modules free the attention's projections before the MLP runs, so the peak is the
    residual stream and a few hidden-size temporaries plus the larger of the two blocks, not
    their sum as in vLLM's profiling run (memory/profile.py ``forward_bytes``). Measured on
    17 real-size architectures with random weights (H100, H200; 512-32,768 tokens): within
    4% for each, phi-4, Qwen3-30B-A3B, Mixtral-8x7B and DeepSeek-V2-Lite included (the last
    two came after the fit and showed the experts' fused gate/up and the float32 router;
    Mistral-Small-24B and Granite-3.3 were held out and came within 0.7%). A prompt longer
    than a sliding window adds its masks and the slices' storage
    (``_sliding_prefill_bytes``). With ``groups`` (max_num_seqs above one) the scheduler may
    pad prompts of unequal length into one group, whose boolean mask is held through the pass
    and copied in the model's dtype at attention, with the keys and values repeated to every
    head (``padded_mask_elements``); the peak is the larger of the two passes.
    """
    qkv = (spec.num_attention_heads + 2 * spec.num_kv_heads) * spec.head_dim
    fused = spec.architecture in FUSED_GATE_UP
    mlp = (MLP_TEMPORARIES + fused) * spec.intermediate_size
    if spec.is_moe:
        h, inter = spec.hidden_size, spec.moe_intermediate_size
        copies = ROUTED_COPIES + 2 * (spec.architecture in FP32_ROUTERS)
        routed = max(h + (MLP_TEMPORARIES + 1) * inter, copies * h)
        mlp = max(mlp, max(spec.num_experts_per_tok, 1) * routed)
    projections = tokens * (qkv // tp) * dtype_size
    at_mlp = tokens * (mlp // tp) * dtype_size
    residual = tokens * HIDDEN_TEMPORARIES * spec.hidden_size * dtype_size
    at_attention, held = _sliding_prefill_bytes(spec, tokens=tokens, dtype_size=dtype_size, tp=tp)
    peak = residual + max(projections + at_attention, at_mlp) + held
    if groups:
        mask = padded_mask_elements(tokens)
        repeated = _repeated_kv_bytes(spec, tokens=tokens, dtype_size=dtype_size, tp=tp)
        padded = projections + repeated + mask * dtype_size
        peak = max(peak, residual + max(padded, at_mlp) + mask)
    return peak


def _longest_fitting(spec: ModelSpec, room: int, *, per_token: int) -> int:
    """The longest sequence whose dynamic cache fits in ``room`` bytes (within the model's
    context): past the sliding window only the full-attention layers grow."""
    if room <= 0 or not per_token:
        return 0
    limit = spec.max_position_embeddings
    longest = room // per_token
    kept = transformers_kept_tokens(spec, limit)
    if longest < kept:
        return longest
    full = spec.attention_layers - spec.sliding_layers
    if not full:
        return limit
    per_layer = per_token // spec.attention_layers
    longest = (room - spec.sliding_layers * kept * per_layer) // (full * per_layer)
    return int(min(limit, longest))


def transformers_breakdown(
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
    device: str = "cuda",
) -> MemoryBreakdown:
    """oominfer's transformers server: a dynamic KV cache per sequence (no paging, no pool),
    a prefill peak over ``max_len`` tokens (the scheduler admits a prefill group of at most
    that many padded tokens; SDPA keeps no n^2 attention matrix), and fp32 logits of the
    last position only."""
    prefill = transformers_forward_bytes(
        spec, tokens=max_len, dtype_size=elem, tp=tp, groups=seqs > 1
    )
    logits = seqs * spec.vocab_size * 4 * 2  # fp32 logits and their softmax
    overhead = TRANSFORMERS_OVERHEAD_BYTES if device == "cuda" else TRANSFORMERS_CPU_OVERHEAD_BYTES
    per_seq = transformers_seq_kv_bytes(spec, length=max_len, per_token=per_token) + state_per_seq
    # A decode step holds a share of one layer's cache beside the cache (decode_step_share),
    # of as much cache as max_num_seqs sequences fill: where that outgrows the prefill, the
    # room is split between the two.
    share = decode_step_share(spec, max_len, padded=seqs > 1)
    room = budget - weights - overhead - logits
    decode = min(math.ceil(share * room / (1 + share)), math.ceil(share * seqs * per_seq))
    activation = logits + max(prefill, decode)
    kv_cache = budget - weights - activation - overhead
    fits_len = _longest_fitting(spec, kv_cache - state_per_seq, per_token=per_token)
    return MemoryBreakdown(
        engine="transformers",
        dtype=dtype,
        total_bytes=total,
        budget_bytes=budget,
        weights_bytes=weights,
        activation_bytes=activation,
        non_torch_bytes=overhead,
        cuda_graph_bytes=0,
        kv_cache_bytes=kv_cache,
        kv_bytes_per_token=per_token,
        state_bytes_per_seq=state_per_seq,
        block_size=1,
        # Tokens in requests of max_len: past the sliding window a request holds fewer bytes
        # than its tokens times the per-token figure of every layer.
        kv_cache_tokens=max(0, kv_cache) * max_len // per_seq if per_seq else 0,
        max_model_len=max_len,
        max_model_len_that_fits=int(fits_len),
        max_concurrency=round(max(0, kv_cache) / per_seq, 2) if per_seq else float(seqs),
        max_num_seqs=seqs,
        max_num_batched_tokens=max_len,
        sliding_kv_bytes_per_token=sliding_bytes_per_token(spec, per_token),
        sliding_kept_tokens=transformers_kept_tokens(spec, spec.max_position_embeddings),
    )
