"""What vLLM reserves besides weights and KV cache: the profiling run's activation peak,
non-torch memory, CUDA graphs, and the batch defaults that size them."""

from __future__ import annotations

from typing import Final, Protocol

from oominfer.base.units import GiB, KiB, MiB, format_bytes
from oominfer.hardware.gpu import GpuSpec
from oominfer.hardware.hardware import Hardware
from oominfer.model.spec import ModelSpec
from oominfer.rules.attention import graph_counts
from oominfer.rules.versions import EngineVersion

# Memory the engine holds after profiling beyond weights and activations: cuBLAS and
# attention workspaces, persistent input and sampler buffers; with tensor parallelism the
# NCCL and custom all-reduce buffers too. The single-GPU V1 logs that print it show 0.02-0.14
# GiB; 128 MiB gives the least median KV-cache error on both calibration sets
# (bench/calibration.py: 0.9% and 1.6%) with the rotary cache counted in the weights
# (memory/weights.py rope_cache_bytes), where 200 MiB had absorbed it.
NON_TORCH_BYTES: Final = 128 * MiB
NON_TORCH_TP_BYTES: Final = 350 * MiB
# Tensor parallelism over PCIe: logs that print it show 0.17-0.30 GiB in all. The total,
# 0.47 GiB, gives the least median KV-cache error on both calibration sets (bench/
# calibration.py: 1.1% and 1.3% on the V1 logs; flat from 275 to 350 MiB, 350 keeping n15
# within 10%) once the weights hold the allocator's rounding (memory/weights.py
# allocator_rounding); 472 MiB had absorbed Qwen2.5's at TP 2-4.
# Over NVLink / NVSwitch NCCL opens many more channels than over PCIe (tens against two to
# four), each with its own per-protocol buffers on the GPU, and vLLM's custom all-reduce maps
# its IPC buffers: the non-torch memory vLLM prints at TP >= 2 is 0.17-0.30 GiB on PCIe
# cards (4090, L40S, 3090; TP 2-16) but 0.95-2.10 GiB on NVLink ones. The term is set so the
# total is the median of the four single-node NVLink logs found (A100-SXM4 TP8 0.7.1: 2.10;
# H100 TP4 0.10.2, c21: 1.84; H200 TP2 0.10.2: 1.38; B200 TP4 EP, 2026: 0.95), 1.61 GiB.
NON_TORCH_TP_NVLINK_BYTES: Final = 1506 * MiB


# What is not free when vLLM's worker takes its start-up snapshot on an otherwise empty GPU:
# the CUDA context (0.45-0.60 GiB in the logs that print "Free memory on device (free/total)":
# n14, c13, c14, c21 and the H200 TP2 server log, all 0.10.2; median 0.53 GiB), and from 0.11
# NCCL's init-time buffers, large over NVLink: a B200 TP4 log of 2026 starts with 2.47 GiB
# used (PR #25359 saw 4.5 GiB on H100s under Ray). Over PCIe they are taken as nil.
CUDA_CONTEXT_BYTES: Final = 544 * MiB
NCCL_INIT_NVLINK_BYTES: Final = 1986 * MiB


def startup_free_bytes(gpu: GpuSpec, tp: int, version: EngineVersion) -> int:
    """What vLLM sees free at its start-up snapshot on an empty GPU; it refuses to start when
    gpu_memory_utilization x total is more ("Free memory on device ... on startup is less
    than desired GPU memory utilization", v1/worker/utils.py ``request_memory``)."""
    used = CUDA_CONTEXT_BYTES
    if version.snapshot_after_nccl and tp > 1 and gpu.interconnect == "nvlink":
        used += NCCL_INIT_NVLINK_BYTES
    return gpu.cuda_total_bytes - used


def non_torch_bytes(gpu: GpuSpec, tp: int) -> int:
    """Non-torch memory of one GPU's engine: the base, plus the communication buffers of
    tensor parallelism, larger over NVLink than over PCIe."""
    if tp <= 1:
        return NON_TORCH_BYTES
    nvlink = gpu.interconnect == "nvlink"
    return NON_TORCH_BYTES + (NON_TORCH_TP_NVLINK_BYTES if nvlink else NON_TORCH_TP_BYTES)


# The dummy forward over max_num_batched_tokens tokens: the residual stream and a few
# hidden-size temporaries, the fused QKV output, and the MLP's gate/up output plus its
# activation (3 x intermediate) are alive at the MLP's peak.
HIDDEN_TEMPORARIES: Final = 4
MLP_TEMPORARIES: Final = 3

# CUDA graphs: the pool capture takes, per GPU, grows with the graphs captured (per
# release: rules.attention.graph_counts) times the layers each graph spans; a PIECEWISE
# graph holds one piece per layer, a FULL decode graph reuses their buffers (its own term
# fits to nil). Past two PCIe-only GPUs vLLM turns custom all-reduce off and NCCL's
# all-reduces are captured into every graph, each with its own buffers. V0's whole-model
# graphs and the early V1 runner (0.8-0.9) have constants of their own.
# A100-class GPUs (compute capability 8.0) hold more for an unquantized model, by era. Under
# the early V1 runner every graph does: Qwen3-8B took 2.24 GiB for 67 graphs (dp37, 0.9.2)
# and Qwen2-7B on a vGPU slice of an A100 1.56 (c10), where an L4's 0.9 pool (c08, the same
# 28 x 3584 language model) and c11 hold the early-V1 constant alone. From 0.10 only the
# FULL decode graphs do, and only under the CUDA 12 builds (before 0.20): Qwen3-8B's 51 + 35
# graphs took 2.44 GiB under 0.19.1 (g16-02) where the PIECEWISE term gives 0.55, and an
# unnamed 80 GB card (c16, 0.11, 67 + 67 graphs: 3.49 GiB; 79.33 GiB total, which A100s
# print) matches; but Qwen2-7B's 67 PIECEWISE-only graphs under 0.10.1.1 took 0.50 GiB on
# an A100-80GB (g17-01/02; 0.65 at TP 2, g17-03/04), what other GPUs hold. Quantized weights
# there (g8-01: FP8 through Marlin, 0.19.1, 51 + 35 graphs: 1.02 GiB, where the FULL term
# would add 2.52) and the CUDA 13 builds (g4-03: 0.23's own estimate for Qwen2.5-VL-7B, 0.53
# GiB; g17-07: Llama-3.1-8B under 0.31, 0.23) show no such excess. cuBLAS's GEMMs on sm80
# under CUDA 12, whose workspaces a captured graph may keep (from CUDA 12.2 cuBLAS allocates
# them itself, PyTorch PR #113994), would explain the quantization and CUDA conditions; why
# only FULL graphs from 0.10 is not known. The conditions are read off these logs, not a
# source. With the A100's excess its own term the early-V1 constant needs no width (the old
# width term had been dp37 against c11), and c08, once left out as a third of the other
# early-V1 pools, fits.
# Least absolute residuals over the calibration logs with a graph line that replay, the
# shared set and the gathered one (bench/fit_graphs.py: 0.7-0.26, 1-94 layers, TP 1-8;
# residuals there; 53 logs, median |residual| 0.08 GiB). c16 (its GPU unnamed and shared),
# dp54 (LoRA buffers), n13 (a negative figure) and the GB10's x09 and x13 (unified memory)
# are left out, as their notes say.
GRAPH_BYTES_PER_LAYER_PIECEWISE: Final = 300 * KiB
GRAPH_BYTES_PER_LAYER_FULL: Final = 0 * KiB
GRAPH_BYTES_PER_LAYER_NCCL: Final = 222 * KiB
GRAPH_BYTES_PER_LAYER_EARLY_V1: Final = 280 * KiB
GRAPH_BYTES_PER_LAYER_V0: Final = 182 * KiB
GRAPH_BYTES_PER_LAYER_SM80_EARLY_V1: Final = 690 * KiB
GRAPH_BYTES_PER_LAYER_SM80_FULL: Final = 1594 * KiB
# Models with recurrent-state layers (Gated DeltaNet, Mamba) run those layers inside their
# FULL decode graphs (PIECEWISE graphs leave them to run eagerly, between the pieces, as
# attention is): there a FULL graph holds as much per layer as a PIECEWISE one, and
# capturing them takes a fixed part besides. Set by hand on the three logs of such models that
# print the capture (none replays in bench/calibration.py, whose catalog lacks their
# checkpoints): Qwen3-Next-80B-A3B at TP2 on H200s, 67 + 67 graphs, 2.37 GiB (vLLM 0.10.2,
# a public server log); its W4A16 quantization at TP2 on L40S, 5 + 4 graphs, 0.79 GiB (n03,
# 0.13); Qwen3.6-27B, 5 + 4 graphs, 0.62 GiB (c20, 0.23). The bytes per layer alone gave
# 0.96, 0.07 and 0.10 GiB.
GRAPH_BYTES_RECURRENT_FIXED: Final = 512 * MiB


GRAPH_ESTIMATE_RATIO: Final = 1.15
"""From 0.20 vLLM sizes the KV cache after reserving its own estimate of the graph pool
("Estimated CUDA graph memory", PR #38284), which the logs that print both put at
0.98-1.21x the pool capture then takes: c20 0.61 / 0.62 GiB (5 + 4 graphs), c01 1.10 /
0.96, and a public GLM TP4 log on B200s 4.99 / 4.13 ("CUDA graph pool memory: 4.13 GiB
(actual), 4.99 GiB (estimated)"); the median."""


def graph_estimate_excess(graphs: int, version: EngineVersion) -> int:
    """What vLLM's graph-memory estimate reserves beyond the pool ``graphs`` (0 before 0.20,
    whose KV cache is sized without the graphs). vLLM counts the whole estimate in the peak
    activation it prints; the estimate counts the excess there too."""
    if not version.graphs_in_budget:
        return 0
    return int(graphs * (GRAPH_ESTIMATE_RATIO - 1))


def graph_era(version: EngineVersion) -> str:
    """Which per-graph constant a release's capture follows: V0's whole-model graphs, the
    early V1 runner (0.8-0.9), or the piecewise capture of 0.10 onwards."""
    if not version.v1:
        return "V0"
    return "EARLY_V1" if version.release < (0, 10) else "PIECEWISE"


def sm80_graph_excess(gpu: GpuSpec, version: EngineVersion, *, quantized: bool) -> str | None:
    """Which of an A100's graphs hold more (GRAPH_BYTES_PER_LAYER_SM80_*): "EARLY_V1" (every
    graph of 0.8-0.9), "FULL" (the FULL decode graphs of 0.10-0.19), or None: quantized
    weights, another GPU, V0, or a CUDA 13 build. A GPU described only by its size is not
    taken for an A100."""
    a100_class = gpu.compute_capability == (8, 0) and gpu.architecture == "ampere"
    if not a100_class or quantized or not version.v1 or not version.cuda12_build:
        return None
    return "EARLY_V1" if graph_era(version) == "EARLY_V1" else "FULL"


def pcie_only(gpu: GpuSpec) -> bool:
    """No NVLink between GPUs of this kind (consumer, L4/L40/A10 and PCIe data-center cards,
    or peers that the catalog's interconnect says talk over PCIe or a network)."""
    return gpu.interconnect == "pcie"


def cuda_graph_bytes(
    *,
    layers: int,
    gpu: GpuSpec,
    tp: int,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    largest: int,
    version: EngineVersion,
    recurrent: bool = False,
    decode_query_len: int = 1,
    full_graphs: bool = True,
    pinned: bool = False,
    quantized: bool = False,
) -> int:
    """Memory CUDA-graph capture takes per GPU (what "Graph capturing finished ... took"
    prints), whether or not the release reserves it before sizing the KV cache.
    ``recurrent``: the model has recurrent-state layers (GRAPH_BYTES_RECURRENT_FIXED);
    ``decode_query_len`` and ``full_graphs``: speculative decoding's decode step and whether
    its FULL graphs survive, ``pinned`` the model's own largest size
    (``rules.attention.graph_counts``); ``quantized``: the weights run through quantized
    kernels, not cuBLAS (``sm80_graph_excess``)."""
    piecewise, full = graph_counts(
        version,
        max_num_seqs,
        max_num_batched_tokens,
        largest=largest,
        recurrent=recurrent,
        decode_query_len=decode_query_len,
        full_graphs=full_graphs,
        pinned=pinned,
    )
    per_piece = {
        "V0": GRAPH_BYTES_PER_LAYER_V0,
        "EARLY_V1": GRAPH_BYTES_PER_LAYER_EARLY_V1,
        "PIECEWISE": GRAPH_BYTES_PER_LAYER_PIECEWISE,
    }[graph_era(version)]
    per_full = per_piece if recurrent else GRAPH_BYTES_PER_LAYER_FULL
    total = layers * (per_piece * piecewise + per_full * full)
    if recurrent and full:
        total += GRAPH_BYTES_RECURRENT_FIXED
    if tp > 2 and pcie_only(gpu):
        total += layers * GRAPH_BYTES_PER_LAYER_NCCL * (piecewise + full)
    excess = sm80_graph_excess(gpu, version, quantized=quantized)
    if excess == "EARLY_V1":
        total += layers * GRAPH_BYTES_PER_LAYER_SM80_EARLY_V1 * piecewise
    elif excess == "FULL":
        total += layers * GRAPH_BYTES_PER_LAYER_SM80_FULL * full
    return total


# vLLM's CPU backend: the API server, the engine core and the torch runtime around the
# weights and the KV cache. Measured here: a 22M-parameter model with a 1 GiB KV cache has a
# process tree of about 3 GB resident (../shared/ENVIRONMENT.md), so about 2 GiB besides the
# two.
CPU_RUNTIME_BYTES: Final = 2 * GiB


def vllm_defaults(
    hardware: Hardware, *, version: EngineVersion, world_size: int = 1
) -> tuple[int, int]:
    """vLLM's (max_num_batched_tokens, max_num_seqs) for its OpenAI server on this device,
    under ``version``.

    vllm/engine/arg_utils.py ``_get_default_max_num_seqs_and_batched_tokens``, read in each
    release: >= 160 GiB: (16384, 1024), a tier added in 0.28 (B200 and B300 had the next one
    before); >= 70 GiB: (8192, 1024), where from 0.9 an A100 is kept off it (PR #17885) and
    from 0.33 a GB10; else (2048, 256); CPU: (2048 x world, 128 x world). Before 0.33 NVML's
    memory query failed on the GB10 (compute capability 12.1) and the tiers saw 0 bytes (GB10
    logs of 0.13 and 0.18 print max_num_batched_tokens=2048): the small tier either way.
    """
    release = version.release
    gpu = hardware.gpu
    if hardware.is_cpu:
        return 2048 * world_size, 128 * world_size
    if gpu.compute_capability == (12, 1):
        return 2048, 256
    if gpu.cuda_total_bytes >= 160 * GiB and release >= (0, 28):
        return 16384, 1024
    a100 = "a100" in gpu.name.lower() and release >= (0, 9)
    if gpu.cuda_total_bytes >= 70 * GiB and not a100:
        return 8192, 1024
    return 2048, 256


def forward_bytes(spec: ModelSpec, *, tokens: int, dtype_size: int, tp: int) -> int:
    """Peak of one forward pass over ``tokens`` tokens above the weights: per token, a few
    hidden-size temporaries plus the fused QKV output and the MLP's gate/up output and
    activation (experts: top-k of them), split across TP ranks. The same in every engine."""
    inter = spec.intermediate_size
    if spec.is_moe:
        inter = max(spec.moe_intermediate_size * max(spec.num_experts_per_tok, 1), inter)
    qkv = (spec.num_attention_heads + 2 * spec.num_kv_heads) * spec.head_dim
    per_token = HIDDEN_TEMPORARIES * spec.hidden_size + (MLP_TEMPORARIES * inter + qkv) // tp
    return tokens * per_token * dtype_size


def moe_chunk_tokens(version: EngineVersion) -> int | None:
    """The most tokens the fused-MoE kernel runs at a time: vllm/envs.py
    VLLM_FUSED_MOE_CHUNK_SIZE's default, 32,768 up to 0.11 and 16,384 from 0.12 (read in
    each release's envs.py); None from 0.18, where the chunking went (vLLM PR #34086)."""
    if version.release >= (0, 18):
        return None
    return 16384 if version.release >= (0, 12) else 32768


MODULAR_MOE_RELEASE: Final = (0, 14)
"""The release from which the unquantized and FP8 fused-MoE layers run through the modular
kernel (vLLM 0.14: ``self.kernel(...)`` in unquantized_fused_moe_method.py and fp8.py; 0.13
still called ``fused_experts``), whose experts take their buffers from the worker's
persistent workspace (v1/worker/workspace.py) at the shapes ``workspace_shapes`` asks."""


def moe_workspace_bytes(
    spec: ModelSpec,
    *,
    tokens: int,
    dtype_size: int,
    expert_slices: int,
    version: EngineVersion,
) -> int:
    """The fused-MoE kernel's buffers at the profiling run's token count.

    With N = 2 x the expert's intermediate size per rank (sliced over ``expert_slices``
    ranks: tensor x data parallel, or 1 with expert parallelism, where each rank holds whole
    experts) and K = hidden size, per token, in the model dtype:

    - before 0.14, vllm/model_executor/layers/fused_moe/fused_moe.py ``fused_experts_impl``:
      ``cache13`` holds top-k x max(N, K) (intermediate_cache1 and 3 share it),
      ``intermediate_cache2`` top-k x N / 2, and the output one x K;
    - from 0.14 (``MODULAR_MOE_RELEASE``), the modular kernel's experts
      (modular_kernel.py ``_allocate_buffers``): workspace13 top-k x max(N / 2, K), which
      the output shares, and workspace2 top-k x max(N, K). TritonExperts asks exactly
      that; the DeepGEMM and CUTLASS experts (N, K swapped between the two) and Marlin's
      (whose N is the intermediate size) come to the same sum.

    With many experts of a small intermediate size the K-wide buffers, which TP does not
    split, are most of it (Qwen3-235B: 8 x 4096 per token, twice from 0.14).
    """
    inter = max(spec.moe_intermediate_size, 1) // expert_slices
    top_k = max(spec.num_experts_per_tok, 1)
    n, k = 2 * inter, spec.moe_latent_size or spec.hidden_size
    if version.release >= MODULAR_MOE_RELEASE:
        per_token = top_k * (max(inter, k) + max(n, k))
    else:
        per_token = top_k * (max(n, k) + inter) + k
    limit = moe_chunk_tokens(version)
    chunk = tokens if limit is None else min(tokens, limit)
    workspace = chunk * per_token * dtype_size
    if spec.quantization is not None and spec.quantization.method == "fp8":
        # W8A8: the input and intermediate_cache2 are quantized to one byte each before
        # their GEMMs (``moe_kernel_quantize_input``), beside the 16-bit caches.
        workspace += chunk * (k + top_k * inter)
    return workspace


def activation_bytes(
    spec: ModelSpec,
    *,
    tokens: int,
    seqs: int,
    dtype_size: int,
    tp: int,
    version: EngineVersion,
    expert_slices: int | None = None,
    speculative: bool = False,
) -> int:
    """Peak of vLLM's profiling run above the weights: a forward pass over ``tokens`` tokens
    (max_num_batched_tokens), then the dummy sampler over ``min(tokens, seqs)`` rows of
    logits; the larger of the two, as the forward's temporaries are gone by the sampler.

    Forward: per token, a few hidden-size temporaries plus the fused QKV output and the MLP's
    gate/up output and activation, split across TP ranks; for MoE models the fused-MoE
    workspaces instead of the MLP (``moe_workspace_bytes``).
    Sampler: logits [rows, vocab] in the model dtype plus what the release's top-k/top-p
    path holds per logit (``EngineVersion.sampler_bytes_per_logit_fp32``); with speculative
    decoding, the larger of that and the rejection sampler's (``sampler_bytes``).
    """
    if spec.is_moe:
        qkv = (spec.num_attention_heads + 2 * spec.num_kv_heads) * spec.head_dim
        per_token = HIDDEN_TEMPORARIES * spec.hidden_size + qkv // tp
        forward = tokens * per_token * dtype_size
        forward += moe_workspace_bytes(
            spec,
            tokens=tokens,
            dtype_size=dtype_size,
            expert_slices=tp if expert_slices is None else expert_slices,
            version=version,
        )
    else:
        forward = forward_bytes(spec, tokens=tokens, dtype_size=dtype_size, tp=tp)
    sampler = sampler_bytes(
        spec,
        tokens=tokens,
        seqs=seqs,
        dtype_size=dtype_size,
        version=version,
        speculative=speculative,
    )
    # The forward's temporaries are freed when it returns; only its output hidden states
    # stay alive through the sampler (v1/worker/gpu_model_runner.py ``profile_run``).
    hidden = tokens * spec.hidden_size * dtype_size
    return max(forward, hidden + sampler)


def sampler_bytes(
    spec: ModelSpec,
    *,
    tokens: int,
    seqs: int,
    dtype_size: int,
    version: EngineVersion,
    speculative: bool = False,
) -> int:
    """The dummy sampler's peak: ``min(tokens, seqs)`` rows of logits in the model dtype and
    what the release's top-k/top-p path holds per logit. With speculative decoding the V1
    runner then runs the rejection sampler over as many rows of dummy target logits while
    the sampler's logits stay alive (v1/worker/gpu_model_runner.py ``_dummy_sampler_run``):
    the larger of the two (``EngineVersion.rejection_sampler_bytes_per_logit``)."""
    rows = min(tokens, seqs)
    per_logit = dtype_size + version.sampler_bytes_per_logit_fp32
    if speculative and version.v1 and not version.model_runner_v2:
        rejection = dtype_size + version.rejection_sampler_bytes_per_logit(dtype_size)
        per_logit = max(per_logit, rejection)
    return rows * spec.vocab_size * per_logit


POST_CAPTURE_MARGIN_BYTES: Final = 630 * MiB
"""What a release that captures CUDA graphs after sizing the KV cache (V1 before 0.20) needs
free beyond the graph pool and the sampler's warm-up, in the memory above
gpu_memory_utilization plus the freed profiling peak: allocator blocks, the capture's
cuBLAS and communication workspaces. The threshold on this count that separates the logs of
bench/calibration.py that failed from those that started, midway: c05 (Qwen3-30B-A3B, TP4 on
24 GB cards, 0.11) failed in the sampler warm-up after capture with 0.44 GiB to spare by
this count; the starts had 0.79 (c09), 1.42 (c08), 1.71 (dp37) GiB or more. (c16, which
failed with 3.42, shared its GPU with four engines and a foreign process.)"""


def post_capture_short(
    *,
    total: int,
    budget: int,
    activation: int,
    graphs: int,
    sampler: int,
    version: EngineVersion,
) -> int:
    """Bytes missing after the KV cache is allocated, where the release captures CUDA graphs
    and warms the sampler up outside its budget (0: enough, or a release that reserves the
    graphs inside the budget; vllm/v1/worker/gpu_worker.py ``compile_or_warm_up_model``).

    After the KV cache is allocated, what is free is the memory above the budget plus the
    profiling peak the budget held for activations (freed by then): the graph pool, then the
    sampler warm-up, must fit there with ``POST_CAPTURE_MARGIN_BYTES`` to spare.
    """
    if not version.graphs_after_kv_cache or graphs == 0:
        return 0
    free = total - budget + activation
    return max(0, graphs + sampler + POST_CAPTURE_MARGIN_BYTES - free)


class Budgeted(Protocol):
    """An estimate's GPU total and budget (MemoryBreakdown, or the Prediction a plan
    records)."""

    @property
    def total_bytes(self) -> int: ...
    @property
    def budget_bytes(self) -> int: ...


class CaptureShortfall(Budgeted, Protocol):
    """What ``utilization_for_capture`` reads of an estimate."""

    @property
    def post_capture_short_bytes(self) -> int: ...


class StartupShortfall(Budgeted, Protocol):
    """What ``utilization_for_startup`` reads of an estimate."""

    @property
    def startup_short_bytes(self) -> int: ...


def utilization_for_capture(b: CaptureShortfall) -> float:
    """The gpu_memory_utilization that leaves what ``b`` lacks after capture more room above
    the budget (rounded down to 0.01; at least 0.05)."""
    return _utilization_without(b, b.post_capture_short_bytes)


def utilization_for_startup(b: StartupShortfall) -> float:
    """The gpu_memory_utilization whose budget is free at vLLM's start-up snapshot (rounded
    down to 0.01; at least 0.05)."""
    return _utilization_without(b, b.startup_short_bytes)


def free_at_start(b: StartupShortfall) -> str:
    """Why a budget is refused at start, in the words every report uses."""
    free = format_bytes(b.budget_bytes - b.startup_short_bytes)
    return f"beside the CUDA context (and NCCL's buffers, over NVLink) only {free} is free then"


def _utilization_without(b: Budgeted, short: int) -> float:
    if b.total_bytes <= 0:
        return 0.0
    return max(0.05, int((b.budget_bytes - short) / b.total_bytes * 100) / 100)
