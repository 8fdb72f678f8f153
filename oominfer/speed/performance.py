"""Predicted serving speed of a plan or an estimate: TTFT, TPOT, tokens/s and requests/s.

A closed loop of ``concurrency`` clients (vLLM's benchmark_serving --max-concurrency): the
scheduler runs as many of them as ``max_num_seqs`` and the KV cache allow, each step decodes
one token for every running request and computes prompt chunks of newly admitted ones
beside them (chunked prefill, ``max_num_batched_tokens`` tokens per step at most); the rest
wait. Step times come from ``oominfer.speed.roofline``.
"""

from __future__ import annotations

import collections
import heapq
import math
from dataclasses import dataclass
from typing import Final, Literal, NamedTuple

from oominfer.hardware.gpu import GpuSpec
from oominfer.memory.breakdown import MemoryBreakdown
from oominfer.memory.kv import indexer_key_bytes
from oominfer.memory.weights import role_bytes, weight_format
from oominfer.model.spec import ModelSpec
from oominfer.settings import EngineSettings
from oominfer.speed.roofline import (
    ALL_REDUCE_LATENCY_S,
    FOUR_BIT_BANDWIDTH_EFFICIENCY,
    REQUEST_OVERHEAD_S,
    Bound,
    Chip,
    Stage,
    StepTime,
    bandwidth_efficiency,
    compute_efficiency,
    moe_read_share,
    step_time,
)
from oominfer.speed.transformers import TransformersSpeed
from oominfer.speed.transformers import burst as transformers_burst
from oominfer.speed.transformers import closed_loop as transformers_closed_loop
from oominfer.speed.workload import Workload

LimitedBy = Literal["max_num_seqs", "kv_cache"]

# PCIe Gen4 x16, both directions: what a GPU with no interconnect figure is taken to have.
DEFAULT_LINK_GBPS = 64.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Performance:
    """How fast a plan serves a workload, all requests together. Times in seconds."""

    ttft_s: float
    """Time to first token, waiting for a batch slot included."""
    tpot_s: float
    """Time per output token after the first, per request."""
    output_tokens_per_s: float
    """Output tokens per second of all requests together."""
    requests_per_s: float
    concurrency: int
    """Requests that run at once: the asked concurrency, capped by max_num_seqs and by the
    requests of input_len + output_len tokens the KV cache holds."""
    input_len: int
    output_len: int
    bound: Bound
    """What bounds a decode step: HBM bandwidth ("memory"), FLOPs ("compute"), or the host
    launching eager kernels ("host", the transformers engine)."""
    requested_concurrency: int
    limited_by: LimitedBy | None = None
    """What capped the concurrency below the one asked, if anything."""
    asked_input_len: int | None = None
    """The prompt tokens asked, where prompt and output exceed max_model_len: vLLM refuses
    such requests, so the prediction is for ``input_len`` (the prompt cut to fit)."""
    asked_output_len: int | None = None
    """The output tokens asked, in that case (``output_len`` keeps them when it can)."""
    num_prompts: int | None = None
    """The requests of the benchmark run predicted (``predict_run``); None for the steady
    state of ``predict``."""


def _compute_flops(gpu: GpuSpec, method: str | None) -> float | None:
    """Peak FLOPs/s of the GEMMs in the weights' format on this GPU (dense tensor cores).

    FP8 checkpoints run W8A8 FP8 GEMMs where the GPU has FP8 units, else vLLM's Marlin
    W8A16 kernel (16-bit math); int8 W8A8 runs on INT8 tensor cores; 4-bit formats
    dequantize to 16-bit.
    """
    peak = gpu.tflops_16bit
    if method in ("fp8", "fp8_per_tensor", "modelopt", "compressed-tensors") and gpu.tflops_fp8:
        peak = gpu.tflops_fp8
    elif method == "int8" and gpu.tops_int8:
        peak = gpu.tops_int8
    return peak * 1e12 if peak else None


def chip(gpu: GpuSpec, settings: EngineSettings, spec: ModelSpec) -> Chip | None:
    """The roofline's view of one GPU of the plan; None where the catalog lacks its
    bandwidth or FLOPs (a GPU given only by its memory)."""
    method = settings.quantization or (spec.quantization.method if spec.quantization else None)
    fmt = weight_format(spec, settings.quantization)
    flops = _compute_flops(gpu, fmt.method if fmt else None)
    if not gpu.memory_bandwidth_gbps or flops is None:
        return None
    efficiency = bandwidth_efficiency(gpu)
    if fmt is not None and fmt.bits <= 4 and fmt.method in ("awq", "gptq"):
        kernel = "plain" if method in ("awq", "gptq") and settings.quantization else "marlin"
        efficiency = FOUR_BIT_BANDWIDTH_EFFICIENCY[kernel]
    link = (gpu.interconnect_gbps or DEFAULT_LINK_GBPS) / 2 * 1e9
    return Chip(
        bandwidth=gpu.memory_bandwidth_gbps * 1e9 * efficiency,
        expert_bandwidth=gpu.memory_bandwidth_gbps * 1e9 * efficiency * moe_read_share(gpu),
        flops=flops * compute_efficiency(gpu),
        link=link,
        all_reduce_latency_s=ALL_REDUCE_LATENCY_S[gpu.interconnect],
        eager=settings.enforce_eager,
    )


def stage(spec: ModelSpec, settings: EngineSettings, b: MemoryBreakdown) -> Stage:
    """The share of the model one GPU holds, from the estimate of that GPU."""
    tp, pp = settings.tensor_parallel_size, settings.pipeline_parallel_size
    p = spec.params
    fmt = weight_format(spec, settings.quantization)
    per = role_bytes(spec, dtype=b.dtype, quantization=settings.quantization)
    experts = sum(p.layer_experts)
    linear = sum(p.layer_linear)
    # Byte shares of the parts by role, as the estimator counts them (weights.py).
    expert_b = experts * per.experts
    linear_b = linear * per.linear
    rest_b = (p.total - experts - linear) * per.other
    total_b = expert_b + linear_b + rest_b or 1.0
    # A step reads one embedding row per token, not the table (unless it is the LM head),
    # and one row of each per-layer table.
    tables = p.per_layer_embedding
    unread = tables + (0 if spec.tie_word_embeddings else p.embedding - tables)
    unread_b = unread * per.other
    expert_bytes = b.weights_bytes * expert_b / total_b
    dense_bytes = b.weights_bytes * (total_b - expert_b - unread_b) / total_b
    share = spec.num_experts_per_tok / spec.num_experts if spec.num_experts else 0.0
    active = p.total - experts * (1 - share) - unread
    moe_layers = sum(1 for n in p.layer_experts if n)
    shared = spec.layer_kinds.count("shared")
    # DeepSeek sparse attention: the indexer's key of every layer is read and scored for
    # every cached token, the latent for the top-k only.
    indexers = math.ceil((spec.attention_layers - len(spec.indexer_shared_layers)) / pp)
    topk = spec.indexer_topk if spec.indexer_head_dim else 0
    latent = b.kv_bytes_per_token - indexers * indexer_key_bytes(spec) if topk else 0
    scoring = 2 * spec.indexer_heads * spec.indexer_head_dim * indexers if topk else 0
    return Stage(
        dense_bytes=dense_bytes,
        expert_bytes=expert_bytes,
        experts_per_token_share=share,
        flops_per_token=2 * active / (tp * pp),
        head_flops_per_token=2 * spec.vocab_size * spec.hidden_size / (tp * pp),
        expert_flops_per_token=2 * experts * share / (tp * pp),
        quantized_experts=fmt is not None,
        # Each GPU's slice of an expert's intermediate width: the whole of it with expert
        # parallelism (whole experts spread over the GPUs), else 1/tp of it.
        expert_width=(spec.moe_intermediate_size or spec.intermediate_size)
        // (1 if settings.enable_expert_parallel else tp),
        # QK^T and AV: 2 FLOPs each per head dimension, per attended token.
        attention_flops_per_context_token=4
        * spec.num_attention_heads
        * spec.head_dim
        * (spec.attention_layers + shared)
        / (tp * pp),
        # A KV-shared layer reads its source layer's cache again.
        kv_bytes_per_token=b.kv_bytes_per_token
        * (spec.attention_layers + shared)
        / max(spec.attention_layers, 1),
        state_bytes_per_seq=b.state_bytes_per_seq,
        layers=math.ceil(spec.num_layers / pp),
        moe_layers=math.ceil(moe_layers / pp),
        mla_layers=math.ceil(spec.attention_layers / pp) if spec.is_mla else 0,
        tp=tp,
        all_reduce_bytes_per_token=spec.hidden_size * 2,
        sparse_topk=topk,
        sparse_kv_bytes_per_token=max(latent, 0),
        index_flops_per_context_token=scoring,
    )


def _asked(asked: Workload, served: Workload) -> dict[str, int | None]:
    """``Performance``'s asked lengths: the workload's own where ``_within`` cut it."""
    if served == asked:
        return {"asked_input_len": None, "asked_output_len": None}
    return {"asked_input_len": asked.input_len, "asked_output_len": asked.output_len}


def _within(workload: Workload, max_len: int) -> Workload:
    """The workload cut to the context: vLLM refuses longer requests, so a prompt longer
    than max_model_len - output_len is taken as that long (output kept when it can be)."""
    if workload.total_len <= max_len:
        return workload
    output = min(workload.output_len, max(max_len // 2, 1))
    return Workload(
        input_len=max(max_len - output, 1), output_len=output, concurrency=workload.concurrency
    )


def predict(
    spec: ModelSpec,
    *,
    gpu: GpuSpec,
    settings: EngineSettings,
    breakdown: MemoryBreakdown,
    workload: Workload,
) -> Performance | None:
    """Predicted speed of ``workload`` on one replica of the plan.

    Returns None where there is nothing to predict from: a GPU without catalog figures or
    a KV cache that holds no request of the workload's length. The transformers engine's
    steps are modelled apart (``oominfer.speed.transformers``).
    """
    if not breakdown.fits:
        return None
    c = chip(gpu, settings, spec)
    if c is None:
        return None
    w = _within(workload, breakdown.max_model_len)
    s = stage(spec, settings, breakdown)
    pp = settings.pipeline_parallel_size
    room = breakdown.running_at(w.total_len)
    running = min(w.concurrency, room)
    if running < 1:
        return None
    limited: LimitedBy | None = None
    if running < w.concurrency:
        limited = "max_num_seqs" if room >= breakdown.max_num_seqs else "kv_cache"
    if breakdown.engine == "transformers":
        t = transformers_closed_loop(spec, gpu=gpu, stage=s, chip=c, workload=w, running=running)
        wait = 0.0
        if w.concurrency > running:  # the others wait for a slot: Little's law
            wait = (w.concurrency - running) / t.requests_per_s
        return _transformers_performance(t, workload, w, running=running, wait=wait,
                                         limited=limited)  # fmt: skip
    # Decode: every running request's next token; the other requests' prompts are computed
    # in the same steps, (running - 1) x input_len tokens over output_len steps on average.
    # With pipeline parallelism vLLM keeps one batch in flight per stage (the engine's batch
    # queue): the running requests go through in pp microbatches, and a request's next
    # token waits for all pp of them to pass its stage.
    decode = _steady_step(s, c, w, running, breakdown.max_num_batched_tokens, pp)
    tpot = decode.seconds * pp
    ttft = (
        REQUEST_OVERHEAD_S
        + _prefill_seconds(s, c, w, running, breakdown.max_num_batched_tokens) * pp
    )
    if running > 1:  # a new request waits, on average, for half the step in flight
        ttft += tpot / 2
    cycle = ttft + (w.output_len - 1) * tpot
    rps = running / cycle
    if w.concurrency > running:  # the others wait for a slot: closed loop, Little's law
        ttft += (w.concurrency - running) / rps
    return _performance(workload, w, ttft=ttft, tpot=tpot, rps=rps, running=running,
                        bound=decode.bound, limited=limited)  # fmt: skip


def _performance(
    asked: Workload,
    w: Workload,
    *,
    ttft: float,
    tpot: float,
    rps: float,
    running: int,
    bound: Bound,
    limited: LimitedBy | None = None,
    num_prompts: int | None = None,
) -> Performance:
    """``Performance`` of a closed loop or a run: ``w`` served of the ``asked`` workload."""
    return Performance(
        ttft_s=ttft,
        tpot_s=tpot,
        output_tokens_per_s=rps * w.output_len,
        requests_per_s=rps,
        concurrency=running,
        input_len=w.input_len,
        output_len=w.output_len,
        bound=bound,
        requested_concurrency=w.concurrency,
        limited_by=limited,
        num_prompts=num_prompts,
        **_asked(asked, w),
    )


def _transformers_performance(
    t: TransformersSpeed,
    asked: Workload,
    w: Workload,
    *,
    running: int,
    wait: float = 0.0,
    limited: LimitedBy | None = None,
    num_prompts: int | None = None,
) -> Performance:
    """``Performance`` of the transformers engine's speed (``oominfer.speed.transformers``)."""
    return _performance(asked, w, ttft=t.ttft_s + wait, tpot=t.tpot_s, rps=t.requests_per_s,
                        running=running, bound=t.bound, limited=limited,
                        num_prompts=num_prompts)  # fmt: skip


def _steady_step(s: Stage, c: Chip, w: Workload, running: int, budget: int, pp: int) -> StepTime:
    """The mean step of one of the ``pp`` stages in the steady state: its share of the
    ``running`` requests generating, the others' prompts computed beside them, (running - 1)
    x input_len tokens over output_len steps.

    Where those prompts fit in fewer chunks than there are steps, they come as whole chunks
    (what the step's token budget leaves beside the decodes) in a few steps, the rest decode
    alone: the mean of the two kinds, each timed as it runs. A MoE step reads the experts
    its tokens touch, which a prompt chunk nearly all touches and a few decodes do not:
    spreading the prompt tokens thinly over every step counts those reads in every step.
    Where the chunks outnumber the steps, every step carries prompt tokens, spread evenly.
    """
    context = w.input_len + w.output_len / 2
    decodes = running / pp
    prompts = (running - 1) / pp  # the other requests' prompts a cycle computes
    room = max(budget - decodes, 1)
    chunks = prompts * math.ceil(w.input_len / room)
    if prompts <= 0 or chunks >= w.output_len:
        return step_time(
            s, c, decodes=decodes, context=context,
            prefill_tokens=prompts * w.input_len / w.output_len,
            prefill_context=w.input_len / 2,
            prefill_sequences=prompts / w.output_len,
        )  # fmt: skip
    alone = step_time(s, c, decodes=decodes, context=context)
    mixed = step_time(
        s, c, decodes=decodes, context=context,
        prefill_tokens=prompts * w.input_len / chunks,
        prefill_context=w.input_len / 2,
        prefill_sequences=prompts / chunks,
    )  # fmt: skip
    share = chunks / w.output_len
    seconds = (1 - share) * alone.seconds + share * mixed.seconds
    bound = mixed.bound if share * mixed.seconds > (1 - share) * alone.seconds else alone.bound
    return StepTime(seconds=seconds, bound=bound)


def _prefill_seconds(s: Stage, c: Chip, w: Workload, running: int, chunk: int) -> float:
    """Steps that compute one prompt in chunks of what max_num_batched_tokens leaves
    beside the other running requests' decodes."""
    others = running - 1
    room = max(chunk - others, 1)
    seconds, done = 0.0, 0
    while done < w.input_len:
        n = min(room, w.input_len - done)
        step = step_time(
            s,
            c,
            decodes=others,
            context=w.input_len + w.output_len / 2,
            prefill_tokens=n,
            prefill_context=done + n / 2,
        )
        seconds += step.seconds
        done += n
    return seconds


FOOTPRINT_SPAN: Final = 1024
"""Tokens over which a request's KV cache share is taken per token (``_footprint``)."""

SIMULATED_WAVES: Final = 16
"""``predict_run`` steps through at most this many batches of requests (a batch: as many as
run at once) and extends the rest at their pace."""

JUMP_MIN_STEPS: Final = 8
"""``_run_burst`` takes a stretch of at least this many decode-only steps in which nothing
can happen (no answer done, no prompt admitted, no preemption) in one go: a run of long
answers is thousands of such steps a request."""


def predict_burst(
    spec: ModelSpec,
    *,
    gpu: GpuSpec,
    settings: EngineSettings,
    breakdown: MemoryBreakdown,
    requests: int,
    input_len: int,
    output_len: int,
    spread: bool,
) -> Performance | None:
    """Predicted speed of ``requests`` requests sent all at once and run to the end (vLLM's
    benchmark_throughput, or benchmark_serving at request rate inf): ``predict_run`` with
    every request in flight from the start."""
    return predict_run(
        spec,
        gpu=gpu,
        settings=settings,
        breakdown=breakdown,
        workload=Workload(input_len=input_len, output_len=output_len, concurrency=requests),
        prompts=requests,
        spread=spread,
    )


def predict_run(
    spec: ModelSpec,
    *,
    gpu: GpuSpec,
    settings: EngineSettings,
    breakdown: MemoryBreakdown,
    workload: Workload,
    prompts: int,
    spread: bool,
) -> Performance | None:
    """Predicted speed of a benchmark run of ``prompts`` requests, at most
    ``workload.concurrency`` in flight (vLLM's benchmark_serving --num-prompts with
    --max-concurrency; all at once when the concurrency is at least the prompts), as it
    reports it: output tokens over the run's duration; TTFT and TPOT the means over requests,
    the TTFT of each from when its client sent it, the TPOT of each its decode time over its
    tokens after the first.

    Unlike the steady closed loop of ``predict``, the run has a start and an end, and it is
    stepped through as vLLM's scheduler runs it: every step decodes one token for each
    request that has its first, and gives what is left of max_num_batched_tokens to the
    prompts in arrival order (chunked prefill), admitting new requests while fewer than the
    concurrency and max_num_seqs run and the KV cache holds their prompt, and preempting the
    last admitted when the cache is full (``_run_burst``); the last ones drain at an ever
    smaller batch. A request that decodes while prompts are computed beside it sees those
    longer steps in its TPOT. With ``spread`` the output lengths vary around ``output_len``
    (real chat data such as ShareGPT, taken as exponential); without it every request
    generates exactly ``output_len`` tokens.
    """
    if not breakdown.fits:
        return None
    c = chip(gpu, settings, spec)
    if c is None:
        return None
    w = _within(workload, breakdown.max_model_len)
    s = stage(spec, settings, breakdown)
    pp = settings.pipeline_parallel_size
    room = breakdown.running_at(w.total_len)
    cap = min(prompts, w.concurrency, room)
    if cap < 1:
        return None
    if breakdown.engine == "transformers":
        # All sent at once: stepped as the scheduler admits them. A run that queues is taken
        # at its closed loop's steady pace (its ramp and drain are not stepped through).
        if cap < prompts:
            t = transformers_closed_loop(spec, gpu=gpu, stage=s, chip=c, workload=w, running=cap)
        else:
            t = transformers_burst(
                spec, gpu=gpu, stage=s, chip=c, requests=prompts, input_len=w.input_len,
                output_len=w.output_len, max_prefill_tokens=breakdown.max_model_len,
            )  # fmt: skip
        # A queued run is given at its steady pace: no run length is claimed for it.
        runs = None if cap < prompts else prompts
        return _transformers_performance(t, workload, w, running=cap, num_prompts=runs)
    # Past SIMULATED_WAVES batches a closed loop repeats itself: step through that many and
    # extend the duration at the pace of their middle half. Requests that queue (more in
    # flight than run) wait longer the later they come: those runs are stepped to the end.
    queued = w.concurrency > cap
    simulated = prompts if queued else min(prompts, SIMULATED_WAVES * cap)
    outputs = _output_lengths(simulated, w.output_len, spread)
    # The scheduler runs up to max_num_seqs; the KV cache limits them as it fills.
    seqs = min(prompts, w.concurrency, breakdown.max_num_seqs)
    footprint = _footprint(breakdown, w)
    chunk = breakdown.max_num_batched_tokens
    run = _run_burst(s, c, w, outputs, cap=seqs, chunk=chunk, pp=pp, footprint=footprint)
    if run is None:
        return None
    first, finish, clock, bound_at_full, _ = run
    # The client sends request j when the (j - concurrency + 1)-th answer is done.
    done = sorted(finish)
    sent = [0.0 if j < w.concurrency else done[j - w.concurrency] for j in range(simulated)]
    ttfts = [f - t for f, t in zip(first, sent, strict=True)]
    tpots = {
        j: (finish[j] - first[j]) / (outputs[j] - 1) for j in range(simulated) if outputs[j] > 1
    }
    ttft_sum, tpot_sum, tpot_n = sum(ttfts), sum(tpots.values()), len(tpots)
    if simulated < prompts:
        # The rest arrive as the middle half did: at its pace, with its TTFT and TPOT. The
        # pace is taken per output token, so that requests of varied lengths (``spread``)
        # finishing in the middle half weigh as much as they generate.
        quarter = simulated // 4
        middle = range(quarter, 3 * quarter)
        rest = prompts - simulated
        order = sorted(range(simulated), key=finish.__getitem__)
        paced = sum(outputs[j] for j in order[quarter + 1 : 3 * quarter + 1])
        per_token = (done[3 * quarter] - done[quarter]) / max(paced, 1)
        clock += rest * sum(outputs) / simulated * per_token
        ttft_sum += rest * sum(ttfts[j] for j in middle) / max(len(middle), 1)
        steady = [tpots[j] for j in middle if j in tpots]
        if steady:
            tpot_sum += rest * sum(steady) / len(steady)
            tpot_n += rest
    total = clock + REQUEST_OVERHEAD_S
    tokens = sum(outputs) * prompts / simulated
    bound = bound_at_full or step_time(s, c, decodes=cap, context=w.total_len).bound
    asked = min(w.concurrency, prompts)
    return Performance(
        ttft_s=REQUEST_OVERHEAD_S + ttft_sum / prompts,
        tpot_s=tpot_sum / tpot_n if tpot_n else 0.0,
        output_tokens_per_s=tokens / total,
        requests_per_s=prompts / total,
        concurrency=cap,
        input_len=w.input_len,
        output_len=w.output_len,
        bound=bound,
        requested_concurrency=asked,
        limited_by=None
        if cap >= asked
        else ("max_num_seqs" if cap >= breakdown.max_num_seqs else "kv_cache"),
        num_prompts=prompts,
        **_asked(workload, w),
    )


class _Run(NamedTuple):
    """A burst stepped through (``_run_burst``)."""

    first: list[float]
    """Each request's first-token time."""
    finish: list[float]
    """Each request's last-token time."""
    clock: float
    """The run's duration."""
    bound_at_full: Bound | None
    """What bounded the first step with every slot decoding, if one came."""
    preemptions: int
    """Requests pushed out of the KV cache to make room (each computed again)."""


def _run_burst(
    s: Stage,
    c: Chip,
    w: Workload,
    outputs: list[int],
    *,
    cap: int,
    chunk: int,
    pp: int,
    footprint: tuple[float, float],
) -> _Run | None:
    """Step a burst through vLLM's scheduler: each step decodes one token for every request
    that has its first and gives what is left of ``chunk`` tokens to the prompts in queue
    order, admitting new requests while fewer than ``cap`` run and the KV cache has room for
    its whole prompt (None where nothing could run).

    The KV cache is not reserved for a request's whole length: vLLM admits a prompt when its
    prompt's blocks are free, and when the running requests' next tokens find no free block
    it preempts the last one admitted (its blocks freed, its prompt and the tokens it had
    generated computed again when it is readmitted, first in the queue). So a burst of short
    prompts with long answers runs more requests at once than fit at their whole length,
    and pays for it in preemptions. ``footprint`` is a request's share of the pool as
    a + b x its tokens (``_footprint``).

    Admission on the whole prompt is vLLM's ``scheduler_reserve_full_isl`` (PR #37307, on by
    default in 0.33). Releases before it admitted on the first chunk alone, which can
    thrash on prompts near the pool's size, but the measured 32k- and 4k-token prompt runs of
    vLLM 0.11 (gpustack's performance lab, tests/data/calibration/) ran as if the whole prompt
    had been checked: admitted on its first chunk, their TPOT came out 5-11x the measured.
    """
    a, b = footprint
    requests = len(outputs)
    first = [0.0] * requests
    finish = [0.0] * requests
    generated = [0] * requests  # tokens out so far
    need = [w.input_len] * requests  # prompt tokens to compute (again, after a preemption)
    base = [0] * requests  # tokens in its cache when it began decoding
    started = [0] * requests  # the step it began decoding after
    # Bumped when a request leaves the cache (preempted or done): stale heap and order
    # entries are skipped.
    epoch = [0] * requests
    decoding: list[tuple[int, int, int]] = []  # (step done after, request, epoch)
    n_dec = base_sum = started_sum = 0
    running = 0  # requests holding cache: decoding, or with a prompt begun
    order: list[tuple[int, int]] = []  # (request, epoch) in admission order
    waiting = collections.deque(range(requests))
    prompting, done_prompt = -1, 0  # the prompt begun, and its tokens computed
    used = 0.0  # share of the KV cache held
    clock, step = 0.0, 0
    bound_at_full: Bound | None = None
    preemptions = 0

    def preempt_last() -> int:
        """Free the last admitted running request; returns it."""
        nonlocal n_dec, base_sum, started_sum, running, used, prompting, done_prompt
        nonlocal preemptions
        preemptions += 1
        while True:
            j, e = order.pop()
            if epoch[j] == e:
                break
        epoch[j] += 1
        running -= 1
        if j == prompting:
            used -= a + b * done_prompt
            prompting, done_prompt = -1, 0
        else:
            tokens = base[j] + step - started[j]
            generated[j] += step - started[j]
            need[j] = w.input_len + generated[j]
            n_dec -= 1
            base_sum -= base[j]
            started_sum -= started[j]
            used -= a + b * tokens
        waiting.appendleft(j)
        return j

    while n_dec or prompting >= 0 or waiting:
        # Every decode's next token needs room: preempt from the last admitted until it fits.
        # The one left alone runs on: vLLM starts only where a max_model_len request fits (a
        # longer-than-mean answer of ``spread`` may pass the line's estimate of its share).
        preempted = False
        while n_dec and used + b * n_dec > 1.0 and running > 1:
            preempt_last()
            preempted = True
        budget = max(chunk * pp - n_dec, 0)
        if n_dec and prompting < 0:
            while decoding and decoding[0][2] != epoch[decoding[0][1]]:
                heapq.heappop(decoding)  # stale: left the cache
            admits = (
                budget > 0
                and waiting
                and running < cap
                and used + b * (n_dec + need[waiting[0]]) + a <= 1.0
            )
            # Nothing changes until the next answer is done or the cache fills: the steps
            # before either are decode-only (admission stays shut: the cache only fills).
            quiet = decoding[0][0] - step - 1
            if b > 0:
                quiet = min(quiet, int((1.0 - used) / (b * n_dec)) - 1)
            full_seen = bound_at_full is not None or n_dec < cap
            if not admits and quiet >= JUMP_MIN_STEPS and full_seen:
                context = (base_sum + step * n_dec - started_sum) / n_dec
                clock += _decode_stretch(s, c, n_dec=n_dec, pp=pp, steps=quiet, context=context)
                used += b * n_dec * quiet
                step += quiet
                continue
        prefill, context_sum, sequences = 0, 0.0, 0
        finished_prompts: list[int] = []
        while budget > 0:
            if prompting < 0:
                # vLLM admits no new request in a step that preempted one.
                if preempted or not waiting or running >= cap:
                    break
                j = waiting[0]
                n = min(budget, need[j])
                # Its whole prompt must fit beside the running ones' next tokens.
                if running and used + b * (n_dec + need[j]) + a > 1.0:
                    break
                waiting.popleft()
                prompting, done_prompt = j, 0
                order.append((j, epoch[j]))
                running += 1
                used += a
            else:
                j = prompting
                n = min(budget, need[j] - done_prompt)
                while used + b * (n_dec + n) > 1.0 and order and running > 1:
                    if preempt_last() == j:
                        break
                    preempted = True
                if prompting != j:
                    break
            prefill += n
            sequences += 1
            context_sum += n * (done_prompt + n / 2)
            budget -= n
            done_prompt += n
            used += b * n
            if done_prompt >= need[j]:
                finished_prompts.append(j)
                prompting, done_prompt = -1, 0
        if not n_dec and not prefill:  # nothing could run
            return None
        context = (base_sum + step * n_dec - started_sum) / n_dec if n_dec else 0.0
        t = step_time(
            s,
            c,
            decodes=n_dec / pp,
            context=context,
            prefill_tokens=prefill / pp,
            prefill_context=context_sum / prefill if prefill else 0.0,
            prefill_sequences=sequences / pp,
        )
        if bound_at_full is None and n_dec >= cap:
            bound_at_full = t.bound
        clock += t.seconds * pp
        used += b * n_dec
        step += 1
        while decoding and decoding[0][0] <= step:
            _, j, e = heapq.heappop(decoding)
            if e != epoch[j]:
                continue
            n_dec -= 1
            base_sum -= base[j]
            started_sum -= started[j]
            used -= a + b * (base[j] + step - started[j])
            epoch[j] += 1
            running -= 1
            finish[j] = clock
        for j in finished_prompts:
            if not generated[j]:
                first[j] = clock
            generated[j] += 1
            finish[j] = clock
            left = outputs[j] - generated[j]
            if left <= 0:
                epoch[j] += 1
                running -= 1
                used -= a + b * need[j]
                continue
            base[j], started[j] = need[j], step
            n_dec += 1
            base_sum += need[j]
            started_sum += step
            heapq.heappush(decoding, (step + left, j, epoch[j]))
    return _Run(first, finish, clock, bound_at_full, preemptions)


def _decode_stretch(s: Stage, c: Chip, *, n_dec: int, pp: int, steps: int, context: float) -> float:
    """Seconds of ``steps`` decode-only steps of ``n_dec`` requests whose mean context starts
    at ``context`` and grows a token a step: Simpson's rule over the first, middle and last
    step (exact where the step's time is linear or quadratic in the context; where it
    turns from memory- to compute-bound within the stretch, off by far under a step)."""

    def at(i: float) -> float:
        return step_time(s, c, decodes=n_dec / pp, context=context + i).seconds

    last = steps - 1
    return steps * (at(0) + 4 * at(last / 2) + at(last)) / 6 * pp


def _footprint(breakdown: MemoryBreakdown, w: Workload) -> tuple[float, float]:
    """A request's share of the KV cache as a + b x its tokens: the line through its share
    at its prompt's length and at a length far enough past it (FOOTPRINT_SPAN tokens at
    least) that whole blocks average out; sliding windows and per-sequence state count as
    ``requests_at`` counts them."""
    short = max(w.input_len, 1)
    long = max(w.total_len, short + FOOTPRINT_SPAN)
    held_short, held_long = breakdown.requests_at(short), breakdown.requests_at(long)
    if held_short <= 0 or held_long <= 0:  # no pool to fill (a plan that does not fit)
        return 0.0, 0.0
    at_short = 1.0 / held_short
    b = max((1.0 / held_long - at_short) / (long - short), 0.0)
    return max(at_short - b * short, 0.0), b


def _output_lengths(requests: int, mean: int, spread: bool) -> list[int]:
    """Each request's output tokens in arrival order: ``mean`` each, or with ``spread``
    the quantiles of an exponential of that mean, in an order unrelated to their size."""
    if not spread:
        return [mean] * requests
    stride = next(p for p in (7919, 104729, 1) if math.gcd(p, requests) == 1)
    return [
        max(1, round(-mean * math.log(1 - ((i * stride) % requests + 0.5) / requests)))
        for i in range(requests)
    ]
