"""Attention-side rules that move memory: CUDA-graph capture sizes, paged-cache block sizes,
recurrent-state blocks per request, and the MLA decode workspace.

CUDA graphs: vllm/config/vllm.py ``_set_cudagraph_sizes`` (0.32, 0.33): the default largest
capture size is 1024 on data-center Blackwell (compute capability family 10.x) and 512
elsewhere, capped by 2 x max_num_seqs and by max_num_batched_tokens; gpt-oss sets 1024 on
every GPU (model_executor/models/config.py GptOssForCausalLMConfig).

Block sizes: vllm/platforms/interface.py ``update_block_size_for_backend`` picks the
attention backend's preferred block (v1/attention/backends/*, mla/*): 16 on CUDA, 32 for MLA
on compute capability 10.x (FLASHINFER_MLA), 64 for MLA with an FP8 cache on 9.0 (FLASHMLA),
128 on the CPU backend.
"""

from __future__ import annotations

from typing import Final

from oominfer.hardware.gpu import GpuSpec
from oominfer.model.spec import ModelSpec
from oominfer.rules.versions import EngineVersion

SOURCE: Final = "vllm/config/vllm.py VllmConfig._set_cudagraph_sizes"
GPU_BLOCK_SIZE: Final = 16
"""vllm/config/cache.py DEFAULT_BLOCK_SIZE."""
CPU_BLOCK_SIZE: Final = 128
"""vllm/platforms/cpu.py: the CPU backend's block."""


MAMBA2_MODEL_TYPES: Final = frozenset(
    {"nemotron_h", "zamba2", "falcon_h1", "bamba", "granitemoehybrid", "plamo2"}
)
"""Hybrids whose Mamba layers are Mamba2 (model_executor/layers/mamba/mamba_mixer2.py): one
prefill checkpoint block per request in align mode."""
TRITON_MLA_WORK_PER_SPLIT: Final = 512
"""v1/attention/backends/mla/triton_mla.py _MIN_WORK_PER_SPLIT (0.33)."""


def max_capture_size(gpu: GpuSpec, spec: ModelSpec | None = None) -> int:
    """The default largest CUDA-graph batch: 1024 on compute capability 10.x and for gpt-oss,
    else 512."""
    if gpu.compute_capability[0] == 10 or pinned_capture_size(spec):
        return 1024
    return 512


def pinned_capture_size(spec: ModelSpec | None) -> bool:
    """The model sets the largest capture size itself, which 2 x max_num_seqs then does not
    cap: gpt-oss's config hook sets ``max_cudagraph_capture_size`` to 1024 when the operator
    sets none ("Overriding max cuda graph capture size to 1024 for performance"), and
    ``_set_cudagraph_sizes`` only derives the cap when it is unset."""
    return spec is not None and spec.model_type == "gpt_oss"


def block_size(spec: ModelSpec, gpu: GpuSpec, *, device: str, kv_cache_dtype: str) -> int:
    """Tokens per paged-cache block the attention backend picks."""
    if device == "cpu":
        return CPU_BLOCK_SIZE
    if spec.is_mla and gpu.compute_capability[0] == 10:
        return 32  # FLASHINFER_MLA: [32, 64]
    if spec.is_mla and gpu.compute_capability[0] == 9 and kv_cache_dtype.startswith("fp8"):
        return 64  # FLASHMLA: FLASH_ATTN_MLA has no FP8 cache
    return GPU_BLOCK_SIZE


def state_blocks_per_request(spec: ModelSpec, gpu: GpuSpec, version: EngineVersion) -> int:
    """Blocks of recurrent state one request of a hybrid model holds.

    Prefix caching is on by default for hybrids, which puts Mamba layers in "align" mode:
    2 blocks, plus one prefill checkpoint block for Mamba2 layers, and in 0.33 for Qwen GDN
    layers where the FlashInfer GDN prefill runs (Hopper) (v1/kv_cache_interface.py
    MambaSpec.max_memory_usage_bytes; config/model.py is_prefix_caching_supported).
    """
    if not spec.state_layers:
        return 0
    checkpoint = 0
    if "mamba" in spec.layer_kinds and spec.model_type in MAMBA2_MODEL_TYPES:
        checkpoint = 1
    if (
        "linear_attention" in spec.layer_kinds
        and version.gdn_checkpoint_blocks
        and gpu.compute_capability[0] == 9
    ):
        checkpoint = 1
    return 2 + checkpoint


def uses_triton_mla(spec: ModelSpec, gpu: GpuSpec) -> bool:
    """TRITON_MLA is the MLA backend on compute capability 8.x and 12.x (and the fallback):
    platforms/cuda.py _get_backend_priorities."""
    return spec.is_mla and gpu.compute_capability[0] in (8, 12)


def triton_mla_workspace_bytes(
    spec: ModelSpec, gpu: GpuSpec, *, max_num_seqs: int, max_model_len: int, tp: int
) -> int:
    """TRITON_MLA's fp32 decode workspace: seqs x heads per rank x splits x (latent + 1) x 4,
    splits = min(next power of two of max_model_len // 512, 2 x SMs)."""
    if not uses_triton_mla(spec, gpu) or spec.kv_lora_rank is None:
        return 0
    splits = 1 << (max(1, max_model_len // TRITON_MLA_WORK_PER_SPLIT) - 1).bit_length()
    if gpu.sm_count:
        splits = min(splits, 2 * gpu.sm_count)
    heads = max(1, spec.num_attention_heads // tp)
    return max_num_seqs * heads * splits * (spec.kv_lora_rank + 1) * 4


V0_CAPTURE_LIMIT: Final = 256
"""V0 (vllm/worker/model_runner.py _BATCH_SIZES_TO_CAPTURE): [1, 2, 4] + multiples of 8 up to
256, those up to max_num_seqs."""


OLD_CAPTURE_LIMIT: Final = 512
"""The largest graph of 0.8-0.11's default list."""


def _stepped_list(top: int) -> list[int]:
    """[1, 2, 4] + range(8, 256, 8) + range(256, top + 1, 16), up to ``top``: 0.12+'s list,
    and gpt-oss's own before."""
    return [s for s in (1, 2, 4, *range(8, 256, 8), *range(256, top + 1, 16)) if s <= top]


def _old_list(top: int) -> list[int]:
    """The capture list of 0.8-0.11 (vllm/config.py, before 0.12): [1, 2, 4] + multiples of 8."""
    return [s for s in (1, 2, 4, *range(8, top + 1, 8)) if s <= top]


def graph_counts(
    version: EngineVersion,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    *,
    largest: int = 512,
    recurrent: bool = False,
    decode_query_len: int = 1,
    full_graphs: bool = True,
    pinned: bool = False,
) -> tuple[int, int]:
    """(PIECEWISE, FULL) graphs vLLM captures, per its release's graph mode.

    Read from the logs' "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): N" and
    "(decode, FULL): N" bars and "Profiling CUDA graph memory: PIECEWISE=51 (largest=512),
    FULL=35 (largest=256)":

    - V0: one graph per size of [1, 2, 4, 8, ..., 256] up to max_num_seqs, no FULL kind.
    - 0.8-0.11: PIECEWISE graphs for [1, 2, 4, 8, 16, ..., 512] (67 sizes), capped by
      max_num_batched_tokens and, from 0.10, by 2 x max_num_seqs (SchedulerConfig's default
      ``cuda_graph_sizes`` = [min(2 x max_num_seqs, 512)]; 0.8-0.9 took [512] whatever
      max_num_seqs was; gpt-oss pins its own list); from 0.11 (FULL_AND_PIECEWISE
      by default) FULL decode graphs for those sizes up to max_num_seqs too, and from
      0.10.2 for models with recurrent-state layers (``recurrent``;
      ``EngineVersion.hybrid_full_graphs``).
    - 0.12+: the list of ``capture_sizes`` up to min(2 x max_num_seqs x decode_query_len,
      largest, max_num_batched_tokens) as PIECEWISE, and its sizes up to max_num_seqs x
      decode_query_len as FULL. Under speculative decoding (``decode_query_len`` = 1 +
      num_speculative_tokens > 1) the V1 runner rounds the sizes up to multiples of it
      (config/compilation.py ``adjust_cudagraph_sizes_for_spec_decode``; the V2 runner of
      0.32+ does not), and ``full_graphs`` False (``spec_decode_full_graphs``) leaves
      PIECEWISE graphs only.
    """
    if not version.v1:
        return len([s for s in _old_list(V0_CAPTURE_LIMIT) if s <= max_num_seqs]), 0
    if version.release < (0, 12):
        with_full = version.release >= (0, 11) or (recurrent and version.hybrid_full_graphs)
        if largest > OLD_CAPTURE_LIMIT:
            # gpt-oss's own list (model_executor/models/config.py): step 16 past 256, up to
            # 992 ("the max supported size" of FA3's full graphs: "from 67 to 81" graphs)
            # until PR #27840 (0.11.1) lifted it; a 0.11.2 log captures 83 up to 1,024.
            top = largest if (*version.release, version.patch) >= (0, 11, 1) else 992
            sizes = _stepped_list(min(top, max_num_batched_tokens))
            full = len([s for s in sizes if s <= max_num_seqs]) if with_full else 0
            return len(sizes), full
        top = min(largest, max_num_batched_tokens)
        if version.release >= (0, 10):
            top = min(top, 2 * max_num_seqs)
        sizes = _old_list(top)
        full = len([s for s in sizes if s <= max_num_seqs]) if with_full else 0
        return len(sizes), full
    q = max(1, decode_query_len)
    sizes = capture_size_list(
        max_num_seqs, max_num_batched_tokens, largest=largest, decode_query_len=q, pinned=pinned
    )
    if not full_graphs:
        return len(sizes), 0
    if q > 1 and not version.model_runner_v2:
        rounded = {-(-s // q) * q for s in sizes}
        sizes = sorted(r for r in rounded if r <= sizes[-1]) or [q]
    return len(sizes), len([s for s in sizes if s <= max_num_seqs * q])


def capture_size_list(
    max_num_seqs: int,
    max_num_batched_tokens: int,
    *,
    largest: int = 512,
    decode_query_len: int = 1,
    pinned: bool = False,
) -> list[int]:
    """The token counts vLLM (0.12+) captures CUDA graphs for: [1, 2, 4] + range(8, 256, 8)
    + range(256, top + 1, 16), plus max_num_batched_tokens and the widest decode step
    (max_num_seqs x decode_query_len) when within the top, top = min(2 x max_num_seqs x
    decode_query_len, largest, max_num_batched_tokens); ``decode_query_len`` is 1 +
    num_speculative_tokens under speculative decoding, else 1. ``pinned``: the model sets
    the largest size itself (``pinned_capture_size``), and max_num_seqs does not cap it."""
    widest = max_num_seqs * max(1, decode_query_len)
    top = largest if pinned else min(2 * widest, largest)
    decode = [widest] if widest <= top else []
    top = min(max_num_batched_tokens, top)
    sizes = set(_stepped_list(top))
    if max_num_batched_tokens <= top:
        sizes.add(max_num_batched_tokens)
    sizes |= {s for s in decode if s <= max_num_batched_tokens}
    return sorted(sizes)


FLASHINFER_SPEC_FULL_GRAPHS: Final = (0, 33)
"""The release whose FlashInfer backend first captures FULL decode graphs of speculative
verify steps below compute capability 9.0 (v1/attention/backends/flashinfer.py
``_use_fa2_native_decode`` returns UNIFORM_BATCH in 0.33). Before, it reported
UNIFORM_SINGLE_TOKEN_DECODE there and vLLM fell back to PIECEWISE graphs ("CUDAGraphMode.
FULL_AND_PIECEWISE is not supported with spec-decode for attention backend FlashInferBackend
... setting cudagraph_mode=PIECEWISE": a 0.20.2 log on RTX 3090s, and vLLM issue #54992 on
0.27.1), with the draft left eager."""


def spec_decode_full_graphs(
    spec: ModelSpec,
    gpu: GpuSpec,
    version: EngineVersion,
    *,
    kv_cache_dtype: str,
    decode_query_len: int,
) -> bool:
    """Whether FULL decode graphs survive speculative decoding (config/compilation.py: FULL
    with a decode query longer than one token needs an attention backend of UNIFORM_BATCH
    support). An FP8 KV cache on compute capability 8.x or 12.x runs through FlashInfer
    (FlashAttention 2 has no FP8 cache; 10.x's FlashInfer decodes through TRT-LLM, which
    takes uniform batches), which before ``FLASHINFER_SPEC_FULL_GRAPHS`` took single-token
    decodes only."""
    if decode_query_len <= 1 or spec.is_mla or version.release >= FLASHINFER_SPEC_FULL_GRAPHS:
        return True
    flashinfer = kv_cache_dtype.startswith("fp8") and gpu.compute_capability[0] in (8, 12)
    return not flashinfer


def capture_sizes(max_num_seqs: int, max_num_batched_tokens: int, *, largest: int = 512) -> int:
    """How many batch sizes vLLM (0.12+) captures (``capture_size_list``)."""
    return len(capture_size_list(max_num_seqs, max_num_batched_tokens, largest=largest))
