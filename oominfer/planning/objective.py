"""The objective: which of the configurations that fit is best for what the user prefers."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Final

from oominfer.hardware.hardware import Hardware
from oominfer.memory.profile import vllm_defaults
from oominfer.model.spec import ModelSpec
from oominfer.planning.constraints import Constraints, Prefer
from oominfer.planning.costs import Costs, concurrency_steps, halvings, throughput_steps
from oominfer.planning.search import Candidate
from oominfer.planning.speed import performance_of

QUANTIZATION_RANK: Final = {
    None: 0,
    "fp8_per_tensor": 1,
    "fp8": 1,
    "int8": 2,
    "bitsandbytes": 3,
}
"""Quality cost of each in-flight weight format (a checkpoint's own format costs nothing
more: its accuracy is what the model is)."""


def costs(
    cand: Candidate,
    spec: ModelSpec,
    hardware: Hardware,
    c: Constraints,
    *,
    tokens_per_s: float | None = None,
    best_tokens_per_s: float | None = None,
) -> Costs:
    """The costs ``cand`` pays, against vLLM's defaults on this hardware; its throughput
    (--prefer throughput: ``tokens_per_s`` where already predicted) against
    ``best_tokens_per_s``, the best of the candidates compared (its own when not given)."""
    s = cand.settings
    default_chunk, default_seqs = vllm_defaults(hardware, version=c.vllm_version)
    throughput = 0
    if c.prefer == "throughput":
        rate = _tokens_per_s(cand, spec, hardware, c) if tokens_per_s is None else tokens_per_s
        throughput = throughput_steps(rate, best_tokens_per_s or rate)
    return Costs(
        cpu_offload=math.ceil(s.cpu_offload_gb),
        below_floor=max(0, c.floor(spec.max_position_embeddings) - cand.context),
        idle_gpus=cand.idle_gpus,
        fewer_seqs=halvings(default_seqs, s.max_num_seqs or default_seqs),
        eager=int(s.enforce_eager),
        weight_quantization=QUANTIZATION_RANK.get(s.quantization, 1),
        smaller_chunk=halvings(default_chunk, s.max_num_batched_tokens or default_chunk),
        gpus=s.world_size,
        kv_quantization=int(s.kv_cache_dtype != "auto"),
        pipeline=s.pipeline_parallel_size,
        shorter_context=-cand.context,
        less_concurrency=-concurrency_steps(cand.total_running),
        less_throughput=throughput,
    )


def _tokens_per_s(cand: Candidate, spec: ModelSpec, hardware: Hardware, c: Constraints) -> float:
    """The candidate's predicted output tokens/s over all replicas (0 where none is)."""
    perf = performance_of(cand, spec, hardware, c)
    return perf.output_tokens_per_s if perf else 0.0


def best(
    found: Iterable[Candidate],
    spec: ModelSpec,
    hardware: Hardware,
    c: Constraints,
    prefer: Prefer | None = None,
) -> Candidate | None:
    """The candidate ``prefer`` (default: the constraints') likes best; None if none."""
    order = prefer or c.prefer
    # Each candidate's speed is predicted once, for its own cost and for the best's.
    scored: list[tuple[Candidate, float | None]] = [
        (cand, _tokens_per_s(cand, spec, hardware, c) if c.prefer == "throughput" else None)
        for cand in found
    ]
    top = max((rate for _, rate in scored if rate is not None), default=None)
    picked = min(
        scored,
        key=lambda pair: costs(
            pair[0], spec, hardware, c, tokens_per_s=pair[1], best_tokens_per_s=top
        ).key(order),
        default=None,
    )
    return picked[0] if picked is not None else None
