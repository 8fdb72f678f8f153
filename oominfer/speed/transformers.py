"""The transformers engine's speed: a decode step bound by the host, prompts by FLOPs.

oominfer's transformers server (engines/transformers/scheduler.py) batches continuously: each
iteration prefills the newly admitted prompts together, then runs one eager decode step for
every running sequence and samples on the host. Measured on an H100 and an H200 with
real-size architectures (tests/data/calibration/device_transformers.jsonl), a decode step
took 22-160 ms whatever the batch (1-32) and context (1,024-8,192): 4-30x what the GPU needs
to read the weights and the cache. The step is the host launching each layer's kernels one
by one from Python, so it grows with the layers; the GPU's roofline only matters where it is
slower still (a large model on a slow card). A long prompt is the GPU's work: its prefill
reaches about half the dense peak (flash SDPA and cuBLAS over one long row block;
PREFILL_COMPUTE_EFFICIENCY), and a short one costs one host-bound pass.
"""

from __future__ import annotations

import dataclasses
from typing import Final

from oominfer.hardware.gpu import GpuSpec
from oominfer.model.spec import ModelSpec
from oominfer.speed.roofline import Bound, Chip, Stage, StepTime, compute_efficiency, step_time
from oominfer.speed.workload import Workload

HOST_STEP_S: Final = 0.035
"""Host time of one eager pass that does not grow with the layers: the masks, positions and
rotary tables built once per pass, the embedding, the final norm and the LM head's launches.
Fitted with ``HOST_SECONDS_PER_LAYER`` on the 99 decode steps of 20 models measured on the
lent H100 and H200 (runs 1-5): median error 14.9%, where a per-layer cost alone (2.1 ms) had
20.4% and missed the small models (Gemma-3-1B and Gemma-2-2B, 26 layers, took 75-99 ms a
step, as long as 40-layer models)."""

HOST_SECONDS_PER_LAYER: Final = 1.0e-3
"""Host time of one eager decode pass per decoder layer, beyond ``HOST_STEP_S``: each
layer's kernels launched one by one from Python, its attention dominated by cuDNN SDPA's
host work (52-58% of the host time in a profiled Gemma step). A host twice as fast or as
slow as the lent machines' moves every transformers TPOT by about that much."""

PREFILL_HOST_FACTOR: Final = 1.4
"""A prompt's pass costs the host more than a decode pass (masks and positions over the
whole prompt, larger launches, a new attention shape for cuDNN): 512-token prefills took a
median 1.4x the model's decode pass (25 of them, runs 1-5)."""

SCHEDULER_STEP_S: Final = 0.010
"""The scheduler's own work per iteration (sampling and its host sync, each sequence's
text and stop checks): the median gap between the scheduler's TPOT and the runner's bare
step for the same model (12 bursts on the H100)."""

PREFILL_COMPUTE_EFFICIENCY: Final = 0.50
"""Share of the dense 16-bit peak a long prompt's prefill reaches, its LM head computed at
the last token only (the runner's ``logits_to_keep=1``): the least median error over the 65
measured prefills of 10 architectures on the H100 and H200 (13.9%; 0.55 had been fitted
while the head was counted at every prompt token, 15.8%)."""

MOE_HOST_FACTOR: Final = 1.5
"""A mixture-of-experts layer costs the host more than a dense one (routing, sorting and
regrouping the tokens, the grouped GEMMs' offsets): 1.3-1.8x the dense layers measured in
the same run (Qwen3-30B-A3B on both GPUs, Mixtral-8x7B and DeepSeek-V2-Lite on the H200)."""


def host_seconds(spec: ModelSpec) -> float:
    """One decode pass's host time: the floor of every decode step."""
    moe_layers = sum(1 for n in spec.params.layer_experts if n)
    layers = spec.num_layers + (MOE_HOST_FACTOR - 1) * moe_layers
    return HOST_STEP_S + layers * HOST_SECONDS_PER_LAYER


def transformers_chip(chip: Chip, gpu: GpuSpec) -> Chip:
    """The roofline's chip with the transformers engine's prefill efficiency."""
    return dataclasses.replace(
        chip, flops=chip.flops / compute_efficiency(gpu) * PREFILL_COMPUTE_EFFICIENCY
    )


def decode_step(
    spec: ModelSpec, stage: Stage, chip: Chip, *, running: int, context: float
) -> StepTime:
    """One decode step for ``running`` sequences: the host's floor ("host"-bound), or the
    GPU's roofline where that is slower."""
    gpu = step_time(stage, chip, decodes=running, context=context)
    host = host_seconds(spec)
    return StepTime(seconds=host, bound="host") if host >= gpu.seconds else gpu


def prefill_seconds(spec: ModelSpec, stage: Stage, chip: Chip, *, tokens: int) -> float:
    """One prompt of ``tokens`` tokens: its FLOPs, or one host-bound pass if that is longer."""
    gpu = step_time(
        stage, chip, decodes=0, context=0, prefill_tokens=tokens,
        prefill_context=prefill_context(spec, tokens),
    ).seconds  # fmt: skip
    return max(PREFILL_HOST_FACTOR * host_seconds(spec), gpu)


def prefill_context(spec: ModelSpec, tokens: int) -> float:
    """Mean context a prompt's tokens attend to, as the kernels compute it: half the prompt
    under a causal SDPA, but the whole square in a sliding-window layer once the prompt
    passes the window, where SDPA gets an explicit mask and skips no tile (Mistral-7B-v0.1's
    32,768-token prefill on the H200: 2.90 s, against 1.50 s counted as causal)."""
    sliding = spec.sliding_layers
    if not sliding or not spec.sliding_window or tokens <= spec.sliding_window:
        return tokens / 2
    return tokens / 2 * (1 + sliding / max(spec.attention_layers, 1))


@dataclasses.dataclass(frozen=True, slots=True)
class TransformersSpeed:
    """A closed loop of ``running`` clients on the transformers server, steady state."""

    ttft_s: float
    tpot_s: float
    requests_per_s: float
    bound: Bound
    """"host" where the host's eager launches take longer than the GPU's roofline."""


def closed_loop(
    spec: ModelSpec,
    *,
    gpu: GpuSpec,
    stage: Stage,
    chip: Chip,
    workload: Workload,
    running: int,
) -> TransformersSpeed:
    """Each request's prompt is prefilled on its own when a slot frees (the scheduler stops
    the whole batch for it), then it decodes one token per step beside the others. Over a
    request's ``output_len`` steps the other ``running - 1`` requests are each replaced once,
    so its TPOT carries their prefills."""
    c = transformers_chip(chip, gpu)
    context = workload.input_len + workload.output_len / 2
    decode = decode_step(spec, stage, c, running=running, context=context)
    step = decode.seconds + SCHEDULER_STEP_S
    prefill = prefill_seconds(spec, stage, c, tokens=workload.input_len) + SCHEDULER_STEP_S
    tpot = step + (running - 1) * prefill / max(workload.output_len, 1)
    ttft = prefill + (step / 2 if running > 1 else 0.0)
    cycle = ttft + (workload.output_len - 1) * tpot
    return TransformersSpeed(
        ttft_s=ttft, tpot_s=tpot, requests_per_s=running / cycle, bound=decode.bound
    )


def burst(
    spec: ModelSpec,
    *,
    gpu: GpuSpec,
    stage: Stage,
    chip: Chip,
    requests: int,
    input_len: int,
    output_len: int,
    max_prefill_tokens: int,
) -> TransformersSpeed:
    """``requests`` prompts sent at once and run to the end (all of them running): admitted
    in prefill groups of at most ``max_prefill_tokens`` padded tokens, one decode step
    between groups, then ``output_len - 1`` steps for the whole batch. TTFT is the mean over
    requests of when their group's prefill ends; TPOT a request's steps after its first."""
    c = transformers_chip(chip, gpu)
    per_group = max(1, max_prefill_tokens // max(input_len, 1))
    context = input_len + output_len / 2
    clock, ttft_sum, admitted = 0.0, 0.0, 0
    while admitted < requests:
        group = min(per_group, requests - admitted)
        if admitted:  # the running batch takes a step before the next group is admitted
            clock += decode_step(spec, stage, c, running=admitted, context=input_len).seconds
            clock += SCHEDULER_STEP_S
        clock += prefill_seconds(spec, stage, c, tokens=group * input_len) + SCHEDULER_STEP_S
        ttft_sum += group * clock
        admitted += group
    decode = decode_step(spec, stage, c, running=requests, context=context)
    tpot = decode.seconds + SCHEDULER_STEP_S
    total = clock + (output_len - 1) * tpot
    return TransformersSpeed(
        ttft_s=ttft_sum / requests,
        tpot_s=tpot,
        requests_per_s=requests / total,
        bound=decode.bound,
    )
