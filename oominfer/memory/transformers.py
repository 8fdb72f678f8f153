"""The transformers engine's memory: weights, a dynamic KV cache per sequence, no paging."""

from __future__ import annotations

from typing import Final

from oominfer.base.units import MiB
from oominfer.memory.breakdown import MemoryBreakdown
from oominfer.memory.profile import forward_bytes
from oominfer.model.spec import ModelSpec

# The transformers engine keeps the CUDA context and cuBLAS workspace beside the weights.
TRANSFORMERS_OVERHEAD_BYTES: Final = 512 * MiB


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
) -> MemoryBreakdown:
    """transformers generate(): a dynamic KV cache per sequence (no paging, no pool), a
    prefill peak over one full-length prompt (oominfer's server prefills one sequence at a
    time; SDPA keeps no n^2 attention matrix), and fp32 logits of the last position only."""
    activation = forward_bytes(spec, tokens=max_len, dtype_size=elem, tp=tp)
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
