"""The roofline of one engine step on one GPU: bytes over bandwidth, FLOPs over peak, the
tensor-parallel all-reduces over the interconnect, and a per-step floor. Times in seconds.

vLLM runs every running request's next token, and any prompt chunk scheduled beside them, in
one forward pass (a "step"). A step reads each weight once (for MoE, the experts its tokens
were routed to) and every running request's KV cache, and computes 2 FLOPs per active
parameter per token (the LM head's only at each request's last token, where vLLM samples).
Whichever of memory and compute takes longer bounds the step; the
all-reduces and the launch floor add to it.

The efficiency constants are fitted on shared/calibration/throughput_points.jsonl
(``python bench/speed.py`` prints the fit and the error on every point).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Literal

if TYPE_CHECKING:
    from oominfer.hardware.gpu import GpuSpec

Bound = Literal["memory", "compute", "host"]
"""What bounds a decode step: HBM bandwidth, FLOPs, or (the transformers engine) the host
launching each layer's kernels."""

# Fitted on the 21 vLLM points of throughput_points.jsonl that bench/speed.py can place
# (dense and MoE, L4 to B200, TP 1-8, bf16/fp8/AWQ; steady closed loops through
# ``predict``, bursts of all prompts at once through ``predict_burst``): a grid over
# BANDWIDTH_EFFICIENCY, COMPUTE_EFFICIENCY, GEMM_HALF_TOKENS, LAYER_FLOOR_S,
# SEQUENCE_STEP_S and MOE_LAYER_FLOOR_S, minimising the median errors of output tokens/s
# and TPOT, their worst factors and a tenth of TTFT's median error. The all-reduce
# latencies and the 4-bit and eager factors are set by hand from their points (t07, t10,
# t18); the step floor and the request overhead from the single-stream points (t01, t03).
BANDWIDTH_EFFICIENCY: Final = 0.70
"""Decode reads weights and KV cache at this share of the HBM bandwidth (single-stream
dense points sit at 1.15-1.6x the pure bandwidth bound, floor included), and of any memory
the catalog does not name as GDDR (the GB10's LPDDR5X: its three points sit within 12%)..."""
GDDR_BANDWIDTH_EFFICIENCY: Final = 0.85
"""... and at this share of a graphics card's GDDR6, GDDR6X or GDDR7 (RTX 3090 to RTX PRO
6000, L4, L40S, A10G, RTX A6000): a discrete card's GDDR streams closer to its datasheet
peak than HBM does. One stream of Qwen2.5-7B on an RTX 4090 (vLLM 0.25.1) reads its 14.1 GB
a token in 15.9 ms, 0.88 of the card's 1,008 GB/s, where an H100's single streams reach
about 0.7 of its 3,350. At the HBM share the 25 vLLM points on GDDR cards of the two sets
came out 13% slow in output tokens/s and 18% in TPOT (medians, signed), at this share 0%
and +2%; the medians of all points moved from 13.3% to 11.5% (shared set) and 13.1% to
11.7% (gathered) in tokens/s, 18.0% to 16.7% in the gathered TPOT (bench/speed.py). The
4-bit kernels keep their own shares (FOUR_BIT_BANDWIDTH_EFFICIENCY: t07 is an L4's)."""
MOE_READ_HALF_BANDWIDTH_GBPS: Final = 12000.0
"""The fused-MoE kernels read the experts a step touches at a share of what dense GEMMs reach
that falls with the memory's speed, 1 / (1 + bandwidth / this): their fixed costs per expert
block (tokens sorted and padded per expert, one small GEMM each) hide behind slow memory and
show on fast HBM. 0.78 on an H100, 0.71 on an H200, 0.60 on a B200, 0.98 on a GB10's
LPDDR5x. Set on the MoE points of both sets (Mixtral, Nemotron-3-Nano, DeepSeek-R1, gpt-oss;
GB10 to B200, one to 1,000 streams): one share for every GPU (0.64) left the GB10's
Nemotron at 0.44x its measured tokens/s. First 8,000; 12,000 since a fifth gathering
(tests/data/calibration/extra_throughput_points.jsonl s2: gpt-oss-120b at TP 2, 4 and 8 on
H100s, 4 to 64 streams, SemiAnalysis InferenceX; Qwen3-30B-A3B on one H100), where 8,000
read the experts of 64 streams 1.3-1.7x slower than measured: over the gathered set's 180
vLLM points the median error of output tokens/s went from 14.4% to 13.8% and of TPOT from
19.3% to 18.3% (the shared set's medians did not move), and to 13.1% and 18.0% once the
steady state's prompt chunks came whole (performance._steady_step)."""
COMPUTE_EFFICIENCY: Final = 0.40
"""GEMMs of a step reach this share of the dense tensor-core peak on the datacenter GPUs
from Hopper on (compute capability 9.x and 10.x: H100, H200, GH200, B200)..."""
COMPUTE_EFFICIENCY_MMA: Final = 0.50
"""... and this share on the GPUs before them and beside them (Volta to Ada, and the
Blackwell workstation and consumer cards, compute capability 12.x). Hopper's warpgroup and
Blackwell's tcgen05 tensor cores do two and four times the A100's tensor FLOPs per SM and
clock, and vLLM's steps (the GEMMs with the attention, norms, sampling and launches between
them) keep a smaller share of that peak busy. Gathered measurements of the same models and
benchmarks on both (tests/data/calibration/extra_throughput_points.jsonl, gpustack's
performance lab, vLLM 0.11: Qwen3-14B, Qwen3-32B, gpt-oss-20b and -120b, Qwen3-235B on A100s
and H100s) put an H100 at 1.2-1.8x an A100 on prompt-heavy bursts where the datasheets'
peaks say 3.2x; the RTX 4090, RTX A6000 and RTX PRO 6000 points were predicted 1.2-1.5x slow
at the one share. On the 105 gpustack points this split takes the median error of output
tokens/s from 18.1% to 14.5% and of TPOT from 19.2% to 18.6%, on the earlier gathered points
from 11.5% / 16.8% to 10.4% / 13.3% (worst TPOT 2.24x to 1.87x), and on the shared set from
13.7% / 15.8% to 13.4% / 17.9%."""
MOE_COMPUTE_SHARE: Final = 0.75
"""The fused-MoE kernels reach at most this share of the dense GEMMs' FLOPs/s on the routed
experts' work (tokens sorted and padded per expert, one small GEMM per expert block)..."""
MOE_HALF_WIDTH: Final = 700
"""... and half of that where one GPU's slice of an expert is this many columns wide:
tensor parallelism without expert parallelism splits every expert's intermediate width
(DeepSeek-R1's 2,048 into 256 at TP 8), and such skinny GEMMs fill the tensor cores badly.
The two are solved on the prompt-bound bursts of gathered measurements
(tests/data/calibration/extra_throughput_points.jsonl: gpt-oss-20b on one H100, 32.4k
prompt tokens/s, predicted 1.37x that at the dense rate; DeepSeek-R1 at TP 8 on H200s,
15.1k, predicted 1.78x), and leave Mixtral at TP 2 (7,168 columns a GPU, t17) where it was.
Only the large prompt chunks feel it: the shortfall is added at full tensor-core fill. These
are quantized experts (block FP8, MXFP4), whose kernels load scales per block beside the
weights..."""
MOE_HALF_WIDTH_16BIT: Final = 300
"""... while 16-bit experts lose far less on a skinny slice. The one skinny 16-bit MoE
measured, Qwen3-235B in bf16 at TP 8 (192 columns a GPU; gpustack's performance lab, A100s
and H100s, vLLM 0.11), ran its 2k-32k-token prompts 1.4-1.7x (A100) and 1.9-2.0x (H100)
faster than the quantized half-width predicted, where its FP8 checkpoint at TP 4 (384
columns) sat within 18% of it. At 300 the A100 points come within 5% (H100 0.70-0.77x),
Qwen3-30B-A3B's 2k prompt on an A100 moves from 2.1x to 1.7x its TTFT, Mixtral (TP 2) does not
move, and the gathered set's TPOT points off by over 2x go from 10 to 5."""
GEMM_HALF_TOKENS: Final = 64
"""Tokens in a step at which its GEMMs reach half of COMPUTE_EFFICIENCY x the peak."""
GEMM_MIN_TOKENS: Final = 16
"""One tensor-core tile of rows (Marlin's and the MMA's m16): fewer tokens fill it as badly
as this many. Without it a 4-bit single stream came out compute-bound at 1/65 of the peak:
Qwen2.5-14B AWQ and GPTQ on an A100 (Qwen's speed benchmark, vLLM 0.6.3: 92.7 and 98.0
tokens/s, twice the 16-bit 46.3) were predicted at 60; now 108. t10 (a 7B AWQ at 104 tokens/s
where the same source's 16-bit run is 1.86x its bandwidth bound: overheads its README notes)
had matched only through that artifact, and is now 1.73x."""
STEP_FLOOR_S: Final = 0.35e-3
"""A step's fixed cost with CUDA graphs: scheduling, sampling, detokenizing."""
LAYER_FLOOR_S: Final = 24e-6
"""Per decoder layer and step: the kernels a layer launches cost this even when they move
few bytes (norms, rotary, attention metadata)."""
SEQUENCE_STEP_S: Final = 20e-6
"""Per running request and step: the scheduler, sampler and detokenizer touch each request
(CPU work that grows with the batch, not hidden by CUDA graphs)."""
MOE_LAYER_FLOOR_S: Final = 10e-6
"""Per MoE layer and step on top: routing, token permutation and the grouped GEMM."""
MLA_LAYER_FLOOR_S: Final = 180e-6
"""Per multi-head latent attention layer (DeepSeek V2/V3/R1, Kimi K2) and step on top: the
latent path launches several times the kernels of grouped-query attention (the q and kv
low-rank projections and their norms, rotary on a split head, the absorbed up-projections
as batched GEMMs before and after the MLA kernel and its metadata), and its MoE routes by
groups with a shared expert beside. Set on the one vLLM point of such a model (t34,
DeepSeek-R1 AWQ on 8 H100s, one stream: 16.1 ms a token, 4.9 ms without this, 183 us a
layer); vLLM 0.13's DeepSeek-V3.2 on 8 H20s at 30 tokens/s a stream (vllm issue #30832)
is slower still. SGLang's fused DeepSeek kernels run faster (t35, secondary)."""
EAGER_LAYER_S: Final = 60e-6
"""Per layer and step without CUDA graphs (enforce_eager): Python launches every kernel."""
REQUEST_OVERHEAD_S: Final = 8e-3
"""Per request before its first step: HTTP, tokenizing, admission (TTFT's floor)."""
ALL_REDUCE_LATENCY_S: Final[dict[str, float]] = {"nvlink": 8e-6, "pcie": 30e-6}
"""One all-reduce's latency, whatever its size (two per layer with tensor parallelism)."""
FOUR_BIT_BANDWIDTH_EFFICIENCY: Final[dict[str, float]] = {"marlin": 0.55, "plain": 0.70}
"""4-bit weight kernels dequantize on the fly: Marlin (awq_marlin/gptq_marlin, what vLLM picks
for AWQ/GPTQ checkpoints on compute capability 8.0+) reads at a lower share of the bandwidth
(t10). The older kernels that ``--quantization awq`` forces read single-stream decode at the
16-bit share: their one point (t07, L4, batch 1, eager) has 22.9 ms TPOT for 5.2 GB of
weights, 1.32x the pure bandwidth bound (0.45 left it at 1.57x)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Chip:
    """What the roofline reads of one GPU of the plan (catalog figures, derated)."""

    bandwidth: float
    """Bytes per second the weights and KV cache are read at."""
    expert_bandwidth: float
    """Bytes per second the routed experts are read at (``moe_read_share`` of ``bandwidth``)."""
    flops: float
    """FLOPs per second the GEMMs reach at the weights' compute dtype."""
    link: float
    """Bytes per second one GPU sends to its tensor-parallel peers."""
    all_reduce_latency_s: float
    eager: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class Stage:
    """The share of the model one GPU holds (1/tp of each layer, 1/pp of the layers)."""

    dense_bytes: float
    """Weight bytes read by every step: everything but the routed experts."""
    expert_bytes: float
    """Weight bytes of the routed experts."""
    experts_per_token_share: float
    """k/E: the share of a layer's experts one token is routed to (0: dense)."""
    flops_per_token: float
    """2 x active parameters on this GPU."""
    head_flops_per_token: float = 0.0
    """The LM head's part of ``flops_per_token``: vLLM computes logits only at each scheduled
    request's last token, not at every prompt token."""
    expert_flops_per_token: float = 0.0
    """The routed experts' part of ``flops_per_token`` (run at moe_compute_share)."""
    expert_width: int = 0
    """Columns of one expert's intermediate layer on this GPU."""
    quantized_experts: bool = False
    """The experts' weights are quantized (FP8, MXFP4, int4): their fused-MoE kernels lose
    more on skinny experts (``moe_compute_share``)."""
    attention_flops_per_context_token: float
    """Attention FLOPs per new token per token of context it attends to (QK^T and AV)."""
    kv_bytes_per_token: float
    state_bytes_per_seq: float
    layers: int
    moe_layers: int
    mla_layers: int = 0
    tp: int
    all_reduce_bytes_per_token: float
    """Bytes one token's activations take in one all-reduce (hidden x dtype)."""
    sparse_topk: int = 0
    """DeepSeek sparse attention: a query attends to this many cached tokens at most
    (``index_topk``); 0 for dense attention."""
    sparse_kv_bytes_per_token: float = 0.0
    """The part of ``kv_bytes_per_token`` read only for those tokens (the latent); the rest
    (the indexer's keys) is read for every cached token."""
    index_flops_per_context_token: float = 0.0
    """The indexer's scoring FLOPs per new token per cached token (every rank computes all
    of it: the indexer is replicated)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StepTime:
    """One step's time and what bounds it."""

    seconds: float
    bound: Bound


def touched_expert_share(share: float, tokens: float) -> float:
    """Share of a layer's experts that ``tokens`` tokens routed to top-k of E touch.

    Each token picks k of E experts; an expert is missed by all of them with probability
    (1 - k/E)^tokens (routing taken as independent and uniform).
    """
    if share <= 0 or tokens <= 0:
        return 0.0
    missed: float = (1.0 - min(share, 1.0)) ** tokens
    return 1.0 - missed


def compute_efficiency(gpu: GpuSpec) -> float:
    """The share of ``gpu``'s dense tensor-core peak a step's GEMMs reach:
    COMPUTE_EFFICIENCY on the datacenter GPUs from Hopper on, COMPUTE_EFFICIENCY_MMA on the
    others."""
    return COMPUTE_EFFICIENCY if gpu.compute_capability[0] in (9, 10) else COMPUTE_EFFICIENCY_MMA


def bandwidth_efficiency(gpu: GpuSpec) -> float:
    """The share of ``gpu``'s memory bandwidth a step's reads reach:
    GDDR_BANDWIDTH_EFFICIENCY on GDDR memory, BANDWIDTH_EFFICIENCY on the rest."""
    gddr = (gpu.memory_type or "").upper().startswith("GDDR")
    return GDDR_BANDWIDTH_EFFICIENCY if gddr else BANDWIDTH_EFFICIENCY


def moe_read_share(gpu: GpuSpec) -> float:
    """The share of the dense read rate the fused-MoE kernels reach on ``gpu``'s memory
    (MOE_READ_HALF_BANDWIDTH_GBPS)."""
    return 1 / (1 + (gpu.memory_bandwidth_gbps or 0) / MOE_READ_HALF_BANDWIDTH_GBPS)


def moe_compute_share(width: int, *, quantized: bool = True) -> float:
    """The share of the dense GEMMs' FLOPs/s the fused-MoE kernels reach with experts
    ``width`` columns wide on the GPU, quantized (MOE_HALF_WIDTH) or 16-bit
    (MOE_HALF_WIDTH_16BIT)."""
    if not width:
        return 1.0
    half = MOE_HALF_WIDTH if quantized else MOE_HALF_WIDTH_16BIT
    return MOE_COMPUTE_SHARE * width / (width + half)


def step_time(
    stage: Stage,
    chip: Chip,
    *,
    decodes: float,
    context: float,
    prefill_tokens: float = 0.0,
    prefill_context: float = 0.0,
    prefill_sequences: float = 1.0,
) -> StepTime:
    """Time of one step on one GPU.

    Args:
        stage: the model's share on this GPU.
        chip: the GPU.
        decodes: requests generating a token in this step.
        context: mean tokens of context of those requests (their KV cache read).
        prefill_tokens: prompt tokens computed in the same step (chunked prefill).
        prefill_context: mean context those prompt tokens attend to.
        prefill_sequences: prompts with a chunk in the step (each has logits computed).
    """
    tokens = decodes + prefill_tokens
    touched = touched_expert_share(stage.experts_per_token_share, tokens)
    kv_read = context * stage.kv_bytes_per_token
    attended, prefill_attended = context, prefill_context
    if stage.sparse_topk:
        # Sparse attention reads and attends to the top-k tokens' latents; the indexer
        # reads every token's key and scores it.
        attended = min(context, stage.sparse_topk)
        prefill_attended = min(prefill_context, stage.sparse_topk)
        kv_read -= (context - attended) * stage.sparse_kv_bytes_per_token
    read = stage.dense_bytes + decodes * (kv_read + stage.state_bytes_per_seq)
    memory = read / chip.bandwidth + stage.expert_bytes * touched / chip.expert_bandwidth
    attention = stage.attention_flops_per_context_token * (
        decodes * attended + prefill_tokens * prefill_attended
    ) + stage.index_flops_per_context_token * (decodes * context + prefill_tokens * prefill_context)
    # GEMMs over few tokens do not fill the tensor cores: the share of the peak reached
    # grows with the tokens of the step, half of it at GEMM_HALF_TOKENS.
    # Below one tensor-core tile of rows a GEMM costs what a tile does: a single stream's
    # step is as fast as its weight reads allow, 4-bit formats included.
    rows = max(tokens, GEMM_MIN_TOKENS)
    fill = rows / (rows + GEMM_HALF_TOKENS) if tokens > 0 else 1.0
    logits = decodes + (min(prefill_sequences, prefill_tokens) if prefill_tokens else 0.0)
    flops = tokens * (stage.flops_per_token - stage.head_flops_per_token)
    flops += logits * stage.head_flops_per_token
    compute = (flops + attention) / (chip.flops * fill)
    # The fused-MoE kernels' shortfall on the experts' FLOPs, at full tensor-core fill (it
    # tells over large prompt chunks, not in small decode steps).
    share = moe_compute_share(stage.expert_width, quantized=stage.quantized_experts)
    compute += tokens * stage.expert_flops_per_token * (1 / share - 1) / chip.flops
    floor = (
        STEP_FLOOR_S
        + SEQUENCE_STEP_S * decodes
        + LAYER_FLOOR_S * stage.layers
        + MOE_LAYER_FLOOR_S * stage.moe_layers
        + MLA_LAYER_FLOOR_S * stage.mla_layers
        + (EAGER_LAYER_S * stage.layers if chip.eager else 0.0)
    )
    comm = 0.0
    if stage.tp > 1:
        # Two all-reduces per layer (after attention, after the MLP); a ring moves
        # 2(tp-1)/tp of the buffer through each GPU's link.
        ring = 2 * (stage.tp - 1) / stage.tp
        size = tokens * stage.all_reduce_bytes_per_token * ring
        comm = 2 * stage.layers * (chip.all_reduce_latency_s + size / chip.link)
    bound: Bound = "memory" if memory >= compute else "compute"
    return StepTime(seconds=floor + comm + max(memory, compute), bound=bound)
