"""What each lever costs, as data: the one place the planner's objective is written down.

A candidate plan is scored by the levers it turns (``Costs``); each ``--prefer`` compares
candidates by those costs in its own order (``ORDER``), most important first. The principles
(../shared/advice/README.md): do no harm when vLLM's defaults fit; give up context, down to a
practical length, before quality or speed; keep CUDA graphs and vLLM's concurrency cap unless
nothing else is left; an FP8 KV cache before quantized weights; the fewest GPUs per replica.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from oominfer.planning.constraints import Prefer


@dataclass(frozen=True, slots=True)
class LeverCost:
    """One cost a plan can pay, and why it is a cost."""

    name: str
    why: str


LEVER_COSTS: Final = (
    LeverCost(
        "cpu_offload",
        "weights kept in host memory are copied over PCIe in every forward pass: several times "
        "slower; the last resort, only with --allow-offload",
    ),
    LeverCost(
        "below_floor",
        "a context shorter than the practical floor (--min-context, else 8,192 tokens) turns "
        "real prompts away",
    ),
    LeverCost(
        "idle_gpus",
        "a GPU given and left idle serves nothing: a layout or replicas that use it hold more "
        "KV cache or serve more requests",
    ),
    LeverCost(
        "fewer_seqs",
        "max_num_seqs caps running requests and reserves no memory: lowering it frees only the "
        "profiling run's sampler and graph sizes, and throttles every short request",
    ),
    LeverCost("eager", "without CUDA graphs every decode step pays the kernel launches: slower"),
    LeverCost(
        "weight_quantization",
        "FP8 or 4-bit weights cost accuracy, more than an FP8 KV cache does",
    ),
    LeverCost(
        "smaller_chunk",
        "a smaller prefill chunk (max_num_batched_tokens) lowers the activation peak but "
        "prefills long prompts in more steps",
    ),
    LeverCost(
        "gpus",
        "each GPU more in a replica is one replica fewer, and tensor parallelism adds "
        "communication to every layer",
    ),
    LeverCost("kv_quantization", "an FP8 KV cache doubles the tokens held for little accuracy"),
    LeverCost("pipeline", "pipeline stages add bubbles; tensor parallel inside a node comes first"),
    LeverCost("shorter_context", "above the floor, a shorter context is the cheapest lever"),
    LeverCost(
        "less_concurrency", "fewer requests of a typical length run at once: less throughput"
    ),
    LeverCost(
        "less_throughput",
        "fewer output tokens a second over all replicas (predicted by the speed model for "
        "--input-len/--output-len requests)",
    ),
)
"""Every cost, most expensive first in the balanced order."""

ORDER: Final[dict[Prefer, tuple[str, ...]]] = {
    "balanced": tuple(c.name for c in LEVER_COSTS),
    "context": (
        "cpu_offload", "shorter_context", "idle_gpus", "fewer_seqs", "eager", "weight_quantization",
        "smaller_chunk", "gpus", "kv_quantization", "pipeline", "less_concurrency",
    ),
    "throughput": (
        "cpu_offload", "below_floor", "idle_gpus", "less_throughput", "eager", "pipeline", "gpus",
        "less_concurrency", "fewer_seqs", "weight_quantization", "smaller_chunk", "kv_quantization",
        "shorter_context",
    ),
    "quality": (
        "cpu_offload", "weight_quantization", "kv_quantization", "below_floor", "idle_gpus",
        "fewer_seqs",
        "eager", "smaller_chunk", "gpus", "pipeline", "shorter_context", "less_concurrency",
    ),
}  # fmt: skip
"""The costs each ``--prefer`` compares, most important first."""

WEIGHT_ONLY_FP8: Final[frozenset[Prefer]] = frozenset({"context", "throughput"})
"""The objectives that quantize weights in flight to FP8 on a GPU without FP8 tensor cores
(compute capability below 8.9). vLLM runs them there through Marlin as weight-only FP8
(dequantized in every matmul, uncalibrated); an operator who wants the room by default
takes a calibrated pre-quantized checkpoint instead, which the does-not-fit error names."""

_WHY: Final = {c.name: c.why for c in LEVER_COSTS}


def why(name: str) -> str:
    """The sentence that says why a lever costs what it costs."""
    return _WHY[name]


@dataclass(frozen=True, slots=True, kw_only=True)
class Costs:
    """The costs one candidate pays; every field is lower-is-better."""

    cpu_offload: int
    """GiB of weights offloaded."""
    below_floor: int
    """Tokens the context falls short of the floor."""
    idle_gpus: int
    """GPUs given that the layout and its replicas leave unused."""
    fewer_seqs: int
    """Halvings of max_num_seqs below vLLM's default."""
    eager: int
    weight_quantization: int
    """0: the checkpoint's own format; 1: FP8; 2: int8; 3: 4-bit."""
    smaller_chunk: int
    """Halvings of max_num_batched_tokens below vLLM's default."""
    gpus: int
    """GPUs per replica."""
    kv_quantization: int
    pipeline: int
    """Pipeline stages."""
    shorter_context: int
    """Minus the context."""
    less_concurrency: int
    """Minus the concurrency of typical requests over all replicas, in steps of sqrt(2)."""
    less_throughput: int = 0
    """Steps of 10% the predicted output tokens/s over all replicas falls below the best
    candidate's (``throughput_steps``; 0 where the objective does not ask for it)."""

    def key(self, prefer: Prefer) -> tuple[int, ...]:
        """The sort key of ``prefer`` (smaller is better)."""
        return tuple(getattr(self, name) for name in ORDER[prefer])

    def turned(self, other: Costs) -> list[str]:
        """The costs this candidate pays that ``other`` does not (context and concurrency,
        which are traded not turned, left out)."""
        return [
            c.name
            for c in LEVER_COSTS
            if c.name not in ("shorter_context", "less_concurrency", "less_throughput")
            and getattr(self, c.name) > getattr(other, c.name)
        ]


def halvings(default: int, value: int) -> int:
    """How many halvings take ``default`` down to ``value`` (0 when not below)."""
    return max(0, math.ceil(math.log2(default / value))) if value < default else 0


THROUGHPUT_NONE: Final = 10**6
"""The steps of a candidate with no predicted speed: behind every one that has one."""


def throughput_steps(tokens_per_s: float, best: float) -> int:
    """Steps of 10% that output tokens/s falls below the ``best`` candidate's: within 10% of
    it is a tie (the speed model is good to ~25%), left to the next cost to break. Counted
    from the best, not in fixed bins, so that 2,653 and 2,753 tie where fixed bins split them."""
    if tokens_per_s <= 0:
        return THROUGHPUT_NONE
    return max(0, int(math.log(best / tokens_per_s) / math.log(1.1)))


def concurrency_steps(requests: int) -> int:
    """Concurrency in steps of sqrt(2), so that one request more or less is no reason to turn
    a lever."""
    return int(2 * math.log2(requests)) if requests >= 1 else -1
