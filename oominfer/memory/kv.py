"""The KV cache: bytes per token and layer, and how vLLM pages it into blocks."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from oominfer.model.spec import ModelSpec
from oominfer.rules.versions import EngineVersion


def kv_bytes_per_token_layer(
    spec: ModelSpec,
    *,
    kv_bytes: int,
    tp: int,
    version: EngineVersion,
    full: bool = False,
    plain_fp8_latent: bool = False,
) -> int:
    """KV-cache bytes one token takes in one attention layer on one GPU (a full-attention
    one with ``full``: Gemma 4's differ from its sliding-window ones, ``ModelSpec.kv_width``).

    Standard attention: 2 (K and V) x kv_heads x head_dim x bytes, the heads split across
    tensor-parallel ranks (replicated when there are fewer KV heads than ranks). vLLM stores
    V even where a layer shares it with K (Gemma 4's ``attention_k_eq_v``).
    MLA caches the compressed latent once: (kv_lora_rank + qk_rope_head_dim) x bytes, on
    every rank (vllm MLAAttentionSpec: num_kv_heads=1). DeepSeek sparse attention
    (DeepSeek-V3.2, GLM-5) adds its indexer's key, FP8 with an fp32 scale per 128
    (``DeepseekV32IndexerCache``: 132 bytes), and stores an FP8 latent as ``fp8_ds_mla``: the
    latent in FP8 with an fp32 scale per 128, the rotary part in 16 bits (656 bytes), unless
    ``plain_fp8_latent`` (FlashInfer's sparse MLA on Blackwell: 576 bytes,
    ``EngineVersion.blackwell_sparse_mla_fp8``).
    """
    if spec.is_mla:
        assert spec.kv_lora_rank is not None and spec.qk_rope_head_dim is not None
        if not version.mla_latent:
            # vLLM < 0.7 expanded K and V per head, V padded to the QK head size.
            qk = (spec.qk_nope_head_dim or spec.head_dim) + spec.qk_rope_head_dim
            return 2 * max(1, spec.num_attention_heads // tp) * qk * kv_bytes
        latent = (spec.kv_lora_rank + spec.qk_rope_head_dim) * kv_bytes
        if not spec.indexer_head_dim:
            return latent
        if kv_bytes == 1 and not plain_fp8_latent:
            latent = spec.kv_lora_rank + spec.kv_lora_rank // 128 * 4 + spec.qk_rope_head_dim * 2
        return latent + indexer_key_bytes(spec)
    kv_heads, head_dim = spec.kv_width("full" if full else "sliding")
    heads = max(1, kv_heads // tp)
    # V may be narrower than K (MiMo-V2: 128 beside 192; vLLM's head_size_v).
    return heads * (head_dim + (spec.v_head_dim or head_dim)) * kv_bytes


def indexer_key_bytes(spec: ModelSpec) -> int:
    """Bytes DeepSeek sparse attention's indexer caches per token and layer: its key in FP8
    and an fp32 scale per 128 (``DeepseekV32IndexerCache``); 0 without an indexer."""
    return spec.indexer_head_dim + spec.indexer_head_dim // 128 * 4


@dataclass(frozen=True, slots=True)
class KvLayout:
    """How vLLM lays the paged cache out (vllm/v1/core/kv_cache_utils.py, 0.32).

    Layers of one kind (full, sliding, state) share a page size; vLLM splits each kind into
    groups of ``group_size`` layers, and one block is a page in every layer of a group, so
    ``bytes_per_block = group_size x page``. A request needs, per group, cdiv(L, block) blocks
    (full attention), at most cdiv(window - 1 + in-flight tokens, block) + 1 (sliding window),
    or ``state_blocks`` blocks (a recurrent state: rules/attention.py).

    Where the full-attention layers take fewer bytes a token than the others (Gemma 4), their
    page is brought to the common one by a larger block (v1/core/kv_cache_planning.py
    ``unify_kv_cache_spec_page_size``): ``full_block_size`` tokens a block.
    """

    block_size: int
    bytes_per_block: int
    groups: tuple[tuple[str, int], ...]
    """(kind, number of such groups)."""
    window_tokens: int
    state_blocks: int = 1
    full_block_size: int = 0
    """Tokens a full-attention block holds; 0: ``block_size``."""

    def blocks_per_request(self, length: int) -> int:
        """Blocks one request of ``length`` tokens takes, summed over groups."""
        total = 0
        for kind, count in self.groups:
            if kind == "full":
                per = math.ceil(length / (self.full_block_size or self.block_size))
            elif kind == "sliding":
                per = math.ceil(min(self.window_tokens, length) / self.block_size) + 1
            else:
                per = self.state_blocks
            total += per * count
        return total


def kv_layout(
    spec: ModelSpec,
    kinds: Sequence[str],
    *,
    per_token_layer: int,
    state_bytes_layer: int,
    block: int,
    in_flight: int,
    state_blocks: int = 1,
    full_token_layer: int = 0,
) -> KvLayout | None:
    """The paged-cache layout of the layers ``kinds`` on one GPU; None without attention.

    ``per_token_layer`` is a layer's bytes a token (``full_token_layer`` a full-attention
    layer's where they differ), ``in_flight`` the tokens scheduled and not yet settled that a
    sliding window holds beside its window (``EngineVersion.in_flight_tokens``)."""
    counts = {k: kinds.count(k) for k in ("full", "sliding")}
    counts["state"] = sum(1 for k in kinds if k in ("mamba", "linear_attention"))
    present = {k: n for k, n in counts.items() if n}
    if not counts["full"] and not counts["sliding"]:
        return None
    if not counts["sliding"] and full_token_layer:  # full attention only: its own width
        per_token_layer = full_token_layer
    if counts["state"]:
        # Hybrid models: the attention block grows (in steps of 16 tokens) until its page
        # holds a Mamba state, whose page is then padded to match
        # (vllm/platforms/interface.py _align_hybrid_block_size).
        block = max(block, 16 * math.ceil(state_bytes_layer / (16 * per_token_layer)))
    page = block * per_token_layer
    full_block = 0
    if full_token_layer and full_token_layer != per_token_layer and counts["full"]:
        # The smaller page is brought to the larger by a block that many times larger, or
        # padded where it does not divide it.
        full_page = block * full_token_layer
        if page % full_page == 0:
            full_block = block * (page // full_page)
        elif full_page % page == 0 and not counts["state"]:
            full_block, block = block, block * (full_page // page)
        page = max(page, full_page)
    window = (spec.sliding_window or 0) - 1 + in_flight
    low, high = min(present.values()), max(present.values())
    group_size = high if high < 1.5 * low else low
    groups = tuple((k, math.ceil(n / group_size)) for k, n in present.items())
    return KvLayout(block, group_size * page, groups, window, state_blocks, full_block)


def longest(blocks_needed: Callable[[int], int], usable: int, limit: int, block: int) -> int:
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
