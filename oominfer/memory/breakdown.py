"""The estimate's result: memory needed per GPU, part by part. All numbers in bytes."""

from __future__ import annotations

from dataclasses import dataclass, field

from oominfer.memory.additions import Additions
from oominfer.memory.kv import KvLayout
from oominfer.settings import Engine


def unpaged_seq_bytes(
    per_token: int, *, sliding_per_token: int, kept_tokens: int, length: int
) -> int:
    """The cache one unpaged sequence of ``length`` tokens holds: ``per_token`` bytes a token
    in every layer, of which the ``sliding_per_token`` in sliding-window layers stop growing
    at ``kept_tokens`` (the transformers engine's dynamic cache)."""
    full = (per_token - sliding_per_token) * length
    return full + sliding_per_token * min(length, kept_tokens)


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryBreakdown:
    """Memory needed to serve one model, per GPU (the busiest one). All numbers are in bytes."""

    engine: Engine
    dtype: str
    total_bytes: int
    """The GPU's memory as CUDA reports it."""
    budget_bytes: int
    """What the engine may use: total x gpu_memory_utilization."""
    weights_bytes: int
    activation_bytes: int
    non_torch_bytes: int
    cuda_graph_bytes: int
    kv_cache_bytes: int
    """What is left for the KV cache; negative when the rest does not fit."""
    kv_bytes_per_token: int
    """KV-cache bytes one token takes on this GPU, summed over its layers."""
    state_bytes_per_seq: int
    """Recurrent state (Mamba, linear attention) one sequence keeps on this GPU."""
    block_size: int
    kv_cache_tokens: int
    max_model_len: int
    """The context asked for (or derived from config.json)."""
    max_model_len_that_fits: int
    """The longest context one request can have with this KV cache (0: none)."""
    max_concurrency: float
    """Requests of max_model_len tokens the KV cache holds at once."""
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_block_bytes: int = 0
    """Bytes of one paged-cache block across the layers that share it (0: no paging)."""
    blocks_per_request: int = 0
    """Blocks one request of max_model_len tokens needs."""
    usable_blocks: int = 0
    """Blocks a request can use (the pool's null block excluded)."""
    overcommitted_bytes: int = 0
    """A KV cache fixed by --kv-cache-memory-bytes that does not fit beside the rest of the
    GPU's memory: vLLM skips its budget then and fails allocating it (CUDA out of memory)."""
    post_capture_short_bytes: int = 0
    """A release that captures CUDA graphs after sizing the KV cache (V1 before 0.20): what
    the graph pool and the sampler's warm-up lack above the budget (memory/profile.py
    ``post_capture_short``); vLLM then fails right after capture (CUDA out of memory)."""
    startup_short_bytes: int = 0
    """What the budget (gpu_memory_utilization x total) exceeds the memory free at vLLM's
    start-up snapshot by, on an empty GPU (memory/profile.py ``startup_free_bytes``): vLLM
    then refuses to start ("Free memory on device ... is less than desired GPU memory
    utilization")."""
    sliding_kv_bytes_per_token: int = 0
    """The part of ``kv_bytes_per_token`` in sliding-window layers that keep at most
    ``sliding_kept_tokens`` of a sequence: the transformers engine's dynamic cache (vLLM's
    paged ``layout`` counts its sliding layers itself)."""
    sliding_kept_tokens: int = 0
    pipeline_stage: int = 0
    """The pipeline stage these figures are of: the one that holds the fewest KV blocks."""
    layout: KvLayout | None = field(default=None, compare=False, repr=False)
    """How the paged cache is laid out (None for the transformers engine)."""
    additions: Additions = field(default_factory=Additions)
    """What operators add: a speculative draft, LoRA slots, the encoder cache, MoE experts'
    split (memory/additions.py)."""

    @property
    def non_kv_bytes(self) -> int:
        """Everything but the KV cache."""
        return (
            self.weights_bytes
            + self.activation_bytes
            + self.non_torch_bytes
            + self.cuda_graph_bytes
            + self.additions.non_kv_bytes
        )

    @property
    def loaded_bytes(self) -> int:
        """What vLLM's "Model loading took" line counts: the weights, the draft's weights and
        the LoRA slots, all built inside ``GPUModelRunner.load_model``'s memory profiler."""
        a = self.additions
        return self.weights_bytes + a.speculative_weights_bytes + a.lora_bytes

    @property
    def fits(self) -> bool:
        """True when one request at max_model_len fits in the KV cache."""
        return (
            self.kv_cache_bytes > 0
            and self.max_model_len_that_fits >= self.max_model_len
            and self.overcommitted_bytes <= 0
            and self.post_capture_short_bytes <= 0
            and self.startup_short_bytes <= 0
        )

    @property
    def shortfall_bytes(self) -> int:
        """Bytes missing for one request at max_model_len; 0 when it fits."""
        if self.fits:
            return 0
        if self.overcommitted_bytes > 0:
            return self.overcommitted_bytes
        if self.startup_short_bytes > 0:
            return self.startup_short_bytes
        if self.kv_cache_bytes > 0 and self.max_model_len_that_fits >= self.max_model_len:
            return self.post_capture_short_bytes
        need = self.kv_bytes_per_token * self.max_model_len + self.state_bytes_per_seq
        # A negative KV cache means the rest already overflows the budget by that much.
        short = need - self.kv_cache_bytes
        if self.kv_block_bytes:
            # vLLM counts whole blocks, and holds one back.
            blocks = max(self.blocks_per_request - self.usable_blocks, 1) * self.kv_block_bytes
            short = max(short, blocks if self.kv_cache_bytes > 0 else short)
        return max(1, short)

    def requests_at(self, length: int) -> float:
        """Requests of ``length`` tokens the KV cache holds at once (not capped by
        max_num_seqs): vLLM's pool is shared, so this is what real lengths get."""
        if length < 1 or self.kv_cache_bytes <= 0:
            return 0.0
        if self.layout is not None:
            return self.usable_blocks / self.layout.blocks_per_request(length)
        per_seq = self.seq_kv_bytes(length)
        return self.kv_cache_bytes / per_seq if per_seq else float(self.max_num_seqs)

    def seq_kv_bytes(self, length: int) -> int:
        """KV cache and state one unpaged sequence of ``length`` tokens holds: past the
        sliding window only the full-attention layers grow."""
        cache = unpaged_seq_bytes(
            self.kv_bytes_per_token,
            sliding_per_token=self.sliding_kv_bytes_per_token,
            kept_tokens=self.sliding_kept_tokens,
            length=length,
        )
        return cache + self.state_bytes_per_seq

    def running_at(self, length: int) -> int:
        """Requests of ``length`` tokens that run at once: the pool, capped by max_num_seqs."""
        return min(self.max_num_seqs, int(self.requests_at(length)))
