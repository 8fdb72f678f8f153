"""A fit for people: the flags, the levers, the memory bars and the verification. Pure."""

from __future__ import annotations

import shlex

from oominfer.base.units import counted, format_bytes
from oominfer.planning.document import Alternative, Concurrency, Plan
from oominfer.report.breakdown import bar_line, verdict
from oominfer.report.speed import speed_phrase
from oominfer.settings import EngineSettings, engine_args


def lever_phrase(name: str, s: EngineSettings) -> str:
    """A cost from planning/costs.py in words, for the settings that pay it."""
    match name:
        case "weight_quantization":
            return f"{s.quantization} weights"
        case "kv_quantization":
            return f"an {s.kv_cache_dtype} KV cache"
        case "eager":
            return "no CUDA graphs"
        case "fewer_seqs":
            return f"max_num_seqs {s.max_num_seqs}"
        case "smaller_chunk":
            return f"a {s.max_num_batched_tokens}-token prefill chunk"
        case "gpus":
            return f"{s.world_size} GPUs per replica"
        case "pipeline":
            return f"{s.pipeline_parallel_size} pipeline stages"
        case "cpu_offload":
            return f"{s.cpu_offload_gb:g} GiB offloaded"
        case "below_floor":
            return "a context below the practical floor"
        case _:
            return name


def serves_line(s: EngineSettings, concurrency: Concurrency | None, replicas: int) -> str:
    """What a plan serves: its context, the requests of a typical length at once, replicas."""
    text = f"{counted(s.max_model_len or 0, 'token')} per request"
    if concurrency is not None:
        text += (
            f"; {counted(concurrency.typical_requests, 'request')} of "
            f"{counted(concurrency.typical_length, 'token')} at once "
            f"(full length: {concurrency.full_length_requests:g})"
        )
    if replicas > 1:
        text += f"; {replicas} replicas of {s.world_size} GPU{'s' if s.world_size > 1 else ''}"
    return text


def _alternative(alt: Alternative) -> list[str]:
    trade = []
    if alt.turns:
        trade.append("turns " + ", ".join(lever_phrase(n, alt.settings) for n in alt.turns))
    if alt.spares:
        trade.append("spares " + ", ".join(alt.spares).replace("_", " "))
    line = (
        f"  {alt.flag:<20} {alt.name}: {serves_line(alt.settings, alt.concurrency, alt.replicas)}"
        + (f" ({'; '.join(trade)})" if trade else "")
    )
    if alt.performance is None:
        return [line]
    return [line, f"  {'':<20} predicted: {speed_phrase(alt.performance)}"]


def _speed(plan: Plan) -> list[str]:
    """The plan's predicted speed, and beside it each alternative's, in tokens/s and
    latency (the trade-off view)."""
    p = plan.performance
    if p is None:
        return []
    lines = [
        f"Predicted speed ({counted(p.concurrency, 'request')} at once of {p.input_len:,} prompt + "
        f"{p.output_len:,} output tokens, {p.bound}-bound): {speed_phrase(p)}, "
        f"{p.requests_per_s:,.2f} requests/s."
    ]
    if p.limited_by is not None:
        lines.append(
            f"  ({p.requested_concurrency} asked; {p.limited_by.replace('_', ' ')} caps the "
            "requests at once, the rest wait for a slot.)"
        )
    others = [a for a in plan.alternatives if a.performance is not None]
    if others:
        lines.append(f"  {'this plan':<34} {speed_phrase(p)}")
        for alt in others:
            assert alt.performance is not None
            lines.append(f"  {alt.flag:<34} {speed_phrase(alt.performance)}")
    return lines


def fit_report(plan: Plan, *, cached: bool = False) -> list[str]:
    """The short human report of a fit: settings, levers, memory bars, verification.

    Args:
        plan: the plan (its prediction and vLLM's defaults are drawn beside each other).
        cached: the plan came from the cache of verified plans.
    """
    gpu = plan.gpu
    where = (
        f"the CPU with {format_bytes(gpu.get('cuda_total_bytes', 0))}"
        if plan.device == "cpu"
        else f"{gpu.get('count', 1)} x {gpu.get('name', 'GPU')}"
    )
    lines = [f"Plan for {plan.model_id} on {where} ({plan.engine})", ""]
    lines.append("  " + shlex.join(engine_args(plan.settings, plan.engine)))
    lines.append("")
    lines.append("Serves: " + serves_line(plan.settings, plan.concurrency, plan.replicas) + ".")
    lines.extend(_speed(plan))
    if plan.idle_gpus:
        s = "s" if plan.idle_gpus > 1 else ""
        lines.append(f"Idle: {plan.idle_gpus} GPU{s}: {plan.idle_reason}.")
    lines.append("")
    lines.append("Levers:")
    for lever in plan.levers:
        saved = f"; saves {format_bytes(lever.saved_bytes)}" if lever.saved_bytes else ""
        cost = f"; costs: {lever.cost}" if lever.cost and lever.cost != "none" else ""
        lines.append(f"  {lever.name} = {lever.value}: {lever.reason}{saved}{cost}")
    if plan.predicted is not None:
        lines.append("")
        lines.append(f"  this plan     {bar_line(plan.predicted)}")
        if plan.baseline is not None:
            fits, line = verdict(plan.baseline)
            # A bar of defaults that do not fit would look like the plan's (the same pool,
            # too small for one request): the verdict says it instead.
            label = "vLLM defaults" if plan.engine == "vllm" else "defaults     "
            if fits:
                lines.append(f"  {label} {bar_line(plan.baseline)}")
            lines.append(f"  ({label.strip()}: {line})")
        lines.append(verdict(plan.predicted)[1])
    if plan.alternatives:
        lines.append("")
        lines.append("Set aside (each picked by its flag):")
        for alt in plan.alternatives:
            lines.extend(_alternative(alt))
    v = plan.verification
    lines.append("")
    if cached and v is not None:
        lines.append(f"VERIFIED earlier ({v.verified_at}, {v.engine_version}); from the cache.")
    elif v is not None:
        tokens = f"{v.kv_cache_tokens:,} KV tokens" if v.kv_cache_tokens else "KV cache ready"
        peak = f", peak {format_bytes(v.peak_bytes)} resident" if v.peak_bytes else ""
        lines.append(
            f"VERIFIED in {v.launches} launch(es), {v.load_seconds:.0f} s: {v.engine_version} "
            f"served {v.requests_ok} requests at the limits; {tokens}{peak}."
        )
        m = plan.measured
        if m is not None:
            predicted = (
                f"; {m.predicted_output_tokens_per_s:,.0f} predicted"
                if m.predicted_output_tokens_per_s
                else ""
            )
            lines.append(
                f"Measured: {m.output_tokens_per_s:,.0f} output tok/s for "
                f"{counted(m.concurrency, 'request')} at once of "
                f"{m.input_len}+{m.output_len} tokens{predicted}."
            )
    else:
        lines.append("Not verified (--no-verify, or no engine here): run `oominfer fit` where "
                     "the engine is installed to prove it.")  # fmt: skip
    return lines
