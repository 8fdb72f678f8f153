"""A fit for people: the flags, the levers, the memory bars and the verification. Pure."""

from __future__ import annotations

import shlex

from oominfer.engines.vllm import to_vllm_args
from oominfer.planning.document import Plan
from oominfer.report.breakdown import bar_line, verdict
from oominfer.units import format_bytes


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
    lines.append("  " + shlex.join(to_vllm_args(plan.settings)))
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
            _, line = verdict(plan.baseline)
            lines.append(f"  vLLM defaults {bar_line(plan.baseline)}")
            lines.append(f"  (defaults: {line})")
        lines.append(verdict(plan.predicted)[1])
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
    else:
        lines.append("Not verified (--no-verify, or no engine here): run `oominfer fit` where "
                     "the engine is installed to prove it.")  # fmt: skip
    return lines
