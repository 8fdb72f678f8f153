"""What the user asks of a plan: the engine, the objective, the floors and caps."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeVar, get_args

from oominfer.base.errors import InvalidSettingError
from oominfer.rules.versions import LATEST_VLLM, EngineVersion
from oominfer.settings import DECLARED, Dtype, Engine
from oominfer.settings import flag as flag_of
from oominfer.speed.workload import INPUT_LEN, OUTPUT_LEN, Workload

T = TypeVar("T")
Prefer = Literal["balanced", "context", "throughput", "quality"]
"""What the plan trades for what (planning/costs.py orders the levers for each):

- ``balanced`` (the default): vLLM's defaults when they fit; else give up context down to a
  practical length before anything else, then the cheapest levers in quality and speed.
- ``context``: the longest context (up to ``--max-model-len`` or the trained length), with
  whatever levers that takes.
- ``throughput``: the most output tokens/s the speed model predicts for the typical request
  (``--input-len``/``--output-len``), then the most concurrent requests, CUDA graphs on.
- ``quality``: no quantization of weights or KV cache; the context shrinks instead.
"""
PREFERENCES: Final = get_args(Prefer)

PRACTICAL_CONTEXT: Final = 8192
"""The context a plan gives up only when nothing else is left, when ``--min-context`` is not
given: long enough for chat and most RAG prompts (capped at the model's trained length)."""
SHORTEST_CONTEXT: Final = 2048
"""Without ``--min-context`` no plan serves less than this (or the trained length): a shorter
context turns away ordinary prompts, so it is reported as not fitting, with the way out."""
SHORTEST_USEFUL: Final = 128
"""No context below this is planned, even when asked for: a chat template and a short
question already take about a hundred tokens, so the engine would refuse every prompt."""
TYPICAL_LENGTH: Final = 4096
"""Tokens (prompt + output) of a typical request, for the concurrency the plan promises."""


def check_useful_context(tokens: int | None, flag: str) -> None:
    """Refuse a context no engine can serve a prompt in.

    Raises:
        InvalidSettingError: ``tokens`` is below SHORTEST_USEFUL.
    """
    if tokens is not None and 0 < tokens < SHORTEST_USEFUL:
        raise InvalidSettingError(
            f"{flag} {tokens:,} is too short to serve: a chat template and a short question "
            f"alone take about {SHORTEST_USEFUL} tokens.",
            hint=f"Pass {flag} {SHORTEST_USEFUL} or more ({flag} 4k, {flag} 32k).",
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Constraints:
    """What the user asks of the plan."""

    engine: Engine = "vllm"
    """The engine to plan for."""
    dtype: Dtype = "auto"
    """The compute dtype; ``auto`` is the GPU's best 16-bit type for the checkpoint."""
    prefer: Prefer = "balanced"
    min_context: int | None = None
    """The shortest context acceptable (--min-context); None: the practical length
    (PRACTICAL_CONTEXT), given up only when nothing else fits."""
    typical_length: int = TYPICAL_LENGTH
    """Tokens of a typical request (--typical-length): the concurrency is counted in these."""
    concurrency: int | None = None
    """Requests of the typical length that must run at once (--concurrency)."""
    input_len: int = INPUT_LEN
    """Prompt tokens of a typical request (--input-len), for the predicted speed."""
    output_len: int = OUTPUT_LEN
    """Generated tokens of a typical request (--output-len), for the predicted speed."""
    max_tpot: float | None = None
    """Latency requirement: seconds per output token at most (--max-tpot)."""
    max_ttft: float | None = None
    """Latency requirement: seconds to the first token at most (--max-ttft)."""
    max_model_len: int | None = None
    """The context required (--max-model-len): as to vLLM, exactly this many tokens or no
    plan; None (``auto``, ``-1``) is the longest that fits."""
    no_quantize: bool = False
    allow_offload: bool = False
    gpu_memory_utilization: float | None = None
    """Fixed by the user; otherwise vLLM's default."""
    kv_cache_memory_bytes: int | None = None
    """CPU serving: the KV-cache budget (vLLM's --kv-cache-memory-bytes)."""
    gpus_per_node: int = 8
    """GPUs of one node: tensor parallelism stays within a node, pipeline stages span nodes."""
    engine_version: str | None = None
    """The vLLM release to plan for (``0.33``, ``vllm 0.32.0``); None until the planning
    context resolves it (``oominfer.planning.context``)."""
    requested: Mapping[str, Any] = field(default_factory=dict)
    """Engine settings the user named (``max_num_seqs``, ``enforce_eager``, ...: EngineSettings
    field names) besides the ones above: each is a requirement, as it is to vLLM."""

    def __post_init__(self) -> None:
        """Reject constraints that cannot hold together."""
        if self.prefer not in PREFERENCES:
            raise InvalidSettingError(f"--prefer must be one of {', '.join(PREFERENCES)}.")
        for flag, value in (
            ("--min-context", self.min_context),
            ("--typical-length", self.typical_length),
            ("--concurrency", self.concurrency),
            ("--max-model-len", self.max_model_len),
            ("--gpus-per-node", self.gpus_per_node),
            ("--input-len", self.input_len),
            ("--output-len", self.output_len),
        ):
            if value is not None and value < 1:
                raise InvalidSettingError(f"{flag} must be positive, got {value}.")
        check_useful_context(self.max_model_len, flag_of("max_model_len"))
        check_useful_context(self.min_context, "--min-context")
        unknown = sorted(set(self.requested) - {d.name for d in DECLARED})
        if unknown:
            raise InvalidSettingError(f"unknown engine settings: {', '.join(unknown)}.")
        if (
            self.max_model_len is not None
            and self.min_context is not None
            and self.max_model_len < self.min_context
        ):
            raise InvalidSettingError(
                f"--max-model-len {self.max_model_len} is below --min-context {self.min_context}."
            )

        for flag, seconds in (("--max-tpot", self.max_tpot), ("--max-ttft", self.max_ttft)):
            if seconds is not None and seconds <= 0:
                raise InvalidSettingError(f"{flag} must be a positive number of seconds.")

    def workload(self, running: int) -> Workload:
        """The requests the speed is predicted for: --concurrency of them when asked, else
        as many as the plan runs at once."""
        return Workload(
            input_len=self.input_len,
            output_len=self.output_len,
            concurrency=max(self.concurrency or running, 1),
        )

    @property
    def has_latency_requirement(self) -> bool:
        """--max-tpot or --max-ttft was given."""
        return self.max_tpot is not None or self.max_ttft is not None

    def context_cap(self, trained: int) -> int:
        """The longest context a plan may have: the user's max_model_len, else the model's
        trained length (the one rule; ``PlanningContext.context_cap`` asks it)."""
        return min(trained, self.max_model_len or trained)

    def floor(self, trained: int) -> int:
        """The context below which a plan only goes when nothing else is left (the one asked
        for, when --max-model-len names one)."""
        if self.max_model_len is not None:
            return self.max_model_len
        return min(self.min_context or PRACTICAL_CONTEXT, trained)

    def hard_floor(self, trained: int) -> int:
        """The context no plan goes below: --max-model-len (a requirement), --min-context,
        else SHORTEST_CONTEXT (capped at the trained length)."""
        if self.max_model_len is not None:
            return self.max_model_len
        return self.min_context or min(SHORTEST_CONTEXT, trained)

    def wants(self, name: str, default: Any = None) -> Any:
        """The value the user required for engine setting ``name``, else ``default``."""
        return self.requested.get(name, default)

    def wants_list(self, name: str, options: list[T]) -> list[T]:
        """``options`` for a lever, or only the value the user required for it."""
        return [self.requested[name]] if name in self.requested else options

    @property
    def vllm_version(self) -> EngineVersion:
        """The vLLM release whose memory profile and rules the plan follows: the one the
        planning context resolved (``oominfer.planning.context``); constraints that never went
        through it (library calls straight into the planner) follow the latest release."""
        return EngineVersion.parse(self.engine_version) if self.engine_version else LATEST_VLLM

    @property
    def quantizes_kv(self) -> bool:
        """An FP8 KV cache is allowed (not with ``--prefer quality``)."""
        return self.prefer != "quality"

    @property
    def quantizes_weights(self) -> bool:
        """Weight quantization is allowed (not with --no-quantize or ``--prefer quality``)."""
        return not self.no_quantize and self.prefer != "quality"
