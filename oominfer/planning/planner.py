"""The planner: do no harm, else search the levers and pick by an objective. Pure.

1. Do no harm: when vLLM's defaults fit on the fewest GPUs that hold the model, the plan is
   vLLM's defaults (and the spare GPUs serve replicas).
2. Otherwise every configuration on the lever grid is scored by the estimator (``search``)
   and the objective of ``--prefer`` picks one (``objective``, with the lever costs in
   ``costs``). The chosen plan names each lever turned, why and the bytes it saved
   (``levers``), and the nearest plans the other objectives would pick (``alternatives``).
3. When nothing fits, the error gives the shortfall and the ways out that would fit
   (``no_fit``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from oominfer.base.errors import InvalidSettingError
from oominfer.hardware.hardware import Hardware
from oominfer.memory.breakdown import MemoryBreakdown
from oominfer.model.spec import ModelSpec
from oominfer.planning.constraints import Constraints, Prefer
from oominfer.planning.document import Alternative, Concurrency, Lever
from oominfer.planning.layout import Layout, idle_reason, layouts, on_layout
from oominfer.planning.levers import explain
from oominfer.planning.no_fit import does_not_fit
from oominfer.planning.objective import best, costs
from oominfer.planning.refusals import check_checkpoint, check_requested, engine_for
from oominfer.planning.search import (
    Candidate,
    candidates,
    default_settings,
    estimate_for,
    required,
    settle,
    with_offload,
)
from oominfer.planning.speed import fastest_within, latency_asked, performance_of
from oominfer.settings import Dtype, Engine, EngineSettings
from oominfer.speed import Performance

ALTERNATIVES: tuple[tuple[Prefer, str], ...] = (
    ("context", "longest context"),
    ("throughput", "most tokens/s"),
    ("quality", "native precision"),
    ("balanced", "balanced"),
)
"""The objectives whose picks are shown beside the plan, and what each is best at."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanResult:
    """The chosen configuration, its breakdown, the levers turned, and what was set aside."""

    engine: Engine = "vllm"
    """The engine the plan runs on (a bitsandbytes checkpoint moves it to transformers)."""
    settings: EngineSettings
    breakdown: MemoryBreakdown
    levers: tuple[Lever, ...]
    baseline: MemoryBreakdown | None
    """vLLM's defaults on the same hardware (None when they cannot even be estimated)."""
    candidates: int
    replicas: int = 1
    idle_gpus: int = 0
    """GPUs given that the layout and its replicas leave unused."""
    idle_reason: str = ""
    concurrency: Concurrency | None = None
    performance: Performance | None = None
    """The predicted speed of the typical request (None where it cannot be predicted)."""
    alternatives: tuple[Alternative, ...] = ()
    defaults_fit: bool = False
    """The plan is vLLM's defaults (do no harm)."""


def plan(spec: ModelSpec, hardware: Hardware, constraints: Constraints) -> PlanResult:
    """The best configuration under ``constraints``, with the levers it turned.

    Raises:
        DoesNotFitError: nothing fits; the message gives the shortfall and the ways out.
        InvalidSettingError: the engine cannot run this checkpoint or dtype on this GPU.
    """
    c, switched = engine_for(spec, constraints)
    check_checkpoint(spec, hardware, c)
    check_requested(spec, hardware, c)
    found = list(candidates(spec, hardware, c))
    chosen = _defaults_that_fit(spec, hardware, c)
    defaults_fit = chosen is not None
    if c.has_latency_requirement:
        # A latency requirement is met, as any requirement is: the fastest plan that meets
        # it, vLLM's defaults included, else exit 3 with the closest.
        pool = [*found, *([chosen] if chosen is not None else [])]
        if pool:
            pick = fastest_within(pool, spec, hardware, c)
            defaults_fit = pick is chosen
            chosen = pick
    if chosen is None:
        chosen = best(found, spec, hardware, c)
        if chosen is not None:
            chosen = _worth_it(chosen, found, spec, hardware, c)
            chosen = _practical(chosen, spec, hardware, c)
    if chosen is None and c.allow_offload and not hardware.is_cpu:
        found = with_offload(spec, hardware, c)
        chosen = best(found, spec, hardware, c)
    if chosen is None:
        raise does_not_fit(spec, hardware, c)
    chosen = _with_dtype(spec, hardware, c, chosen)
    asked = frozenset(c.requested) | ({"max_model_len"} if c.max_model_len else set())
    if c.gpu_memory_utilization is not None:
        asked |= {"gpu_memory_utilization"}
    levers = explain(
        spec, hardware, chosen, engine=c.engine, version=c.vllm_version, asked=asked,
        longest=c.prefer == "context", latency=latency_asked(c),
    )  # fmt: skip
    if switched is not None:
        levers = (*levers[:1], switched, *levers[1:])
    return PlanResult(
        engine=c.engine,
        settings=chosen.settings,
        breakdown=chosen.breakdown,
        levers=levers,
        baseline=_baseline(spec, hardware, c),
        candidates=len(found),
        replicas=chosen.replicas,
        idle_gpus=chosen.idle_gpus,
        idle_reason=idle_reason(_layout(chosen), hardware, c.gpus_per_node),
        concurrency=concurrency(chosen),
        performance=performance_of(chosen, spec, hardware, c),
        alternatives=_alternatives(spec, hardware, c, chosen, found),
        defaults_fit=defaults_fit,
    )


def _layout(cand: Candidate) -> Layout:
    return Layout(cand.settings.tensor_parallel_size, cand.settings.pipeline_parallel_size)


def concurrency(cand: Candidate) -> Concurrency:
    """The plan's concurrency in typical requests and in full-length ones."""
    return Concurrency(
        typical_length=min(cand.typical_length, cand.context),
        typical_requests=cand.running,
        full_length_requests=cand.breakdown.max_concurrency,
    )


def _defaults_that_fit(spec: ModelSpec, hardware: Hardware, c: Constraints) -> Candidate | None:
    """vLLM's defaults on the fewest GPUs where they fit at full context and leave no GPU
    idle (the spare ones serve replicas), or None."""
    defaults = required(default_settings(spec, hardware, c), c)
    for layout in layouts(spec, hardware, c):
        found = settle(spec, hardware, c, on_layout(defaults, layout, c), layout)
        if found is not None and found.context == defaults.max_model_len and not found.idle_gpus:
            return found
    return None


MARGINAL: Final = 1.25
"""Eager mode or a max_num_seqs below FEW_SEQS must buy at least this much more context."""
FEW_SEQS: Final = 8


CONTEXT_STEP: Final = 8192
"""Contexts people configure are whole multiples of 8k tokens (8k, 16k, 32k, 40k, ...)."""


def _practical(cand: Candidate, spec: ModelSpec, hardware: Hardware, c: Constraints) -> Candidate:
    """A context given up is served at a whole multiple of CONTEXT_STEP tokens, not at the
    last token the pool holds: 35,072 tokens become 32,768 and the slack goes to
    concurrency (principle 3: shorten to a practical length). Not for ``--prefer context``
    (the longest is what was asked), a length the user named, or the model's own length."""
    trained = spec.max_position_embeddings
    if c.prefer == "context" or c.max_model_len is not None or cand.context >= trained:
        return cand
    rounded = cand.context // CONTEXT_STEP * CONTEXT_STEP
    if rounded == cand.context or rounded < c.floor(trained):
        return cand
    shorter = settle(spec, hardware, c, dataclasses.replace(cand.settings, max_model_len=rounded))
    return shorter if shorter is not None and shorter.context == rounded else cand


def _worth_it(
    chosen: Candidate, found: list[Candidate], spec: ModelSpec, hardware: Hardware, c: Constraints
) -> Candidate:
    """``chosen``, unless it turns eager mode or a max_num_seqs below FEW_SEQS for marginal
    context: then the best plan without that lever.

    Without CUDA graphs every decode step is slower, and a handful of sequences throttles
    every short request; both are worth it only for 25% more context or to reach a length
    the user asked for (the floor), never for 114k tokens instead of 99k. The plan without
    it turns no lever the chosen one does not (eager mode is not traded for fewer
    sequences).
    """
    floor = c.floor(spec.max_position_embeddings)

    def few_seqs(cand: Candidate) -> bool:
        return (cand.settings.max_num_seqs or FEW_SEQS) < FEW_SEQS

    def eager(cand: Candidate) -> bool:
        return cand.settings.enforce_eager

    levers: tuple[tuple[str, Callable[[Candidate], bool]], ...] = (
        ("max_num_seqs", few_seqs),
        ("enforce_eager", eager),
    )
    pool = found
    for name, turns in levers:
        if name in c.requested:
            continue
        pool = [cand for cand in pool if not turns(cand)]
        if not turns(chosen):
            continue
        mine = costs(chosen, spec, hardware, c)
        # The plan without the lever, turning nothing else the chosen one does not.
        fair = [cand for cand in pool if not costs(cand, spec, hardware, c).turned(mine)]
        alt = best(fair, spec, hardware, c)
        if alt is None or (alt.context < floor <= chosen.context):
            continue
        if chosen.context < MARGINAL * alt.context:
            chosen = alt
    return chosen


def _with_dtype(spec: ModelSpec, hardware: Hardware, c: Constraints, cand: Candidate) -> Candidate:
    """The candidate with the dtype the engine will run written out (bf16 needs 8.0)."""
    chosen: Dtype = c.dtype if c.dtype != "auto" else cand.breakdown.dtype  # type: ignore[assignment]
    settings = dataclasses.replace(cand.settings, dtype=chosen)
    b = estimate_for(spec, hardware, settings, c)
    return dataclasses.replace(cand, settings=settings, breakdown=b)


def _baseline(spec: ModelSpec, hardware: Hardware, c: Constraints) -> MemoryBreakdown | None:
    """What vLLM's defaults would do on this hardware (one GPU per replica)."""
    try:
        return estimate_for(spec, hardware, default_settings(spec, hardware, c), c)
    except InvalidSettingError:
        return None


def _alternatives(
    spec: ModelSpec,
    hardware: Hardware,
    c: Constraints,
    chosen: Candidate,
    found: list[Candidate],
) -> tuple[Alternative, ...]:
    """What each other objective would pick, where it differs from the plan."""
    mine = costs(chosen, spec, hardware, c)
    out: list[Alternative] = []
    seen: dict[EngineSettings, int] = {dataclasses.replace(chosen.settings, dtype="auto"): -1}
    for prefer, name in ALTERNATIVES:
        if prefer == c.prefer:
            continue
        # Each objective with its own filters: --prefer quality quantizes nothing.
        other = dataclasses.replace(c, prefer=prefer)
        pool = [
            cand
            for cand in found
            if (other.quantizes_weights or cand.settings.quantization is None)
            and (other.quantizes_kv or cand.settings.kv_cache_dtype == "auto")
        ]
        pick = best(pool, spec, hardware, other)
        if pick is not None:
            pick = _practical(pick, spec, hardware, other)
        if pick is None or seen.get(pick.settings) == -1:
            continue
        if pick.settings in seen:  # the same plan is best at two things
            i = seen[pick.settings]
            out[i] = dataclasses.replace(
                out[i], name=f"{out[i].name}, {name}", flag=f"{out[i].flag} (or {prefer})"
            )
            continue
        seen[pick.settings] = len(out)
        pick = _with_dtype(spec, hardware, c, pick)
        theirs = costs(pick, spec, hardware, c)
        out.append(
            Alternative(
                name=name,
                flag=f"--prefer {prefer}",
                settings=pick.settings,
                replicas=pick.replicas,
                concurrency=concurrency(pick),
                performance=performance_of(pick, spec, hardware, c),
                turns=tuple(theirs.turned(mine)),
                spares=tuple(mine.turned(theirs)),
            )
        )
    return tuple(out)
