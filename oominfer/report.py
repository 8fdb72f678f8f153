"""Human tables and JSON shapes of estimates. Pure: returns strings and dicts."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from oominfer.estimate import Hardware, MemoryBreakdown
from oominfer.settings import VllmSettings
from oominfer.spec import ModelSpec
from oominfer.units import format_bytes

if TYPE_CHECKING:
    from oominfer.fit import FitResult

BAR_WIDTH = 60
# (label, glyph, colour) of each bar segment, in the order vLLM allocates them.
SEGMENTS = (
    ("weights", "█", "blue"),
    ("activations", "▓", "magenta"),
    ("non-torch", "▒", "yellow"),
    ("CUDA graphs", "░", "cyan"),
    ("KV cache", "█", "green"),
    ("free", "·", "white"),
)


def breakdown_json(
    spec: ModelSpec, hardware: Hardware, settings: VllmSettings, b: MemoryBreakdown
) -> dict[str, Any]:
    """The stable machine-readable shape of one estimate (``--json``)."""
    return {
        "model": {
            "id": spec.model_id,
            "architecture": spec.architecture,
            "source": spec.source,
            "parameters": spec.checkpoint.float_params or spec.params.total,
            "max_position_embeddings": spec.max_position_embeddings,
            "quantization": spec.quantization.method if spec.quantization else None,
        },
        "hardware": {
            "gpu": hardware.gpu.name,
            "gpus": hardware.count,
            "memory_bytes": hardware.gpu.memory_bytes,
            "cuda_total_bytes": hardware.gpu.cuda_total_bytes,
            "compute_capability": ".".join(map(str, hardware.gpu.compute_capability)),
        },
        "engine": b.engine,
        "settings": {
            **dataclasses.asdict(settings),
            "dtype": b.dtype,
            "max_model_len": b.max_model_len,
            "max_num_seqs": b.max_num_seqs,
            "max_num_batched_tokens": b.max_num_batched_tokens,
        },
        "per_gpu": {
            "total_bytes": b.total_bytes,
            "budget_bytes": b.budget_bytes,
            "weights_bytes": b.weights_bytes,
            "activation_bytes": b.activation_bytes,
            "non_torch_bytes": b.non_torch_bytes,
            "cuda_graph_bytes": b.cuda_graph_bytes,
            "kv_cache_bytes": b.kv_cache_bytes,
            "kv_bytes_per_token": b.kv_bytes_per_token,
            "state_bytes_per_seq": b.state_bytes_per_seq,
            "block_size": b.block_size,
            "kv_cache_tokens": b.kv_cache_tokens,
            "max_model_len_that_fits": b.max_model_len_that_fits,
            "max_concurrency": b.max_concurrency,
            "fits": b.fits,
            "shortfall_bytes": b.shortfall_bytes,
        },
    }


def memory_bar(b: MemoryBreakdown, *, width: int = BAR_WIDTH) -> list[tuple[str, str, str]]:
    """The GPU's memory as (glyphs, colour, legend) segments, scaled to ``width`` cells."""
    kv = max(b.kv_cache_bytes, 0)
    used = b.non_kv_bytes + kv
    parts = [
        b.weights_bytes,
        b.activation_bytes,
        b.non_torch_bytes,
        b.cuda_graph_bytes,
        kv,
        max(b.total_bytes - used, 0),
    ]
    scale = width / max(b.total_bytes, used, 1)
    out = []
    for (label, glyph, colour), size in zip(SEGMENTS, parts, strict=True):
        cells = round(size * scale)
        if size and not cells:
            cells = 1
        out.append((glyph * cells, colour, f"{label} {format_bytes(size)}"))
    return out


def breakdown_table(spec: ModelSpec, hardware: Hardware, b: MemoryBreakdown) -> list[str]:
    """Lines of the human report, uncoloured."""
    gpu = hardware.gpu
    per = " per GPU" if hardware.count > 1 else ""
    rows = [
        ("model", f"{spec.model_id} ({spec.architecture}, {spec.source})"),
        ("hardware", f"{hardware.count} x {gpu.name} ({format_bytes(b.total_bytes)} usable)"),
        ("engine", f"{b.engine}, {b.dtype}"),
        (f"budget{per}", format_bytes(b.budget_bytes)),
        ("  weights", format_bytes(b.weights_bytes)),
        ("  activations", format_bytes(b.activation_bytes)),
        ("  non-torch", format_bytes(b.non_torch_bytes)),
        ("  CUDA graphs", format_bytes(b.cuda_graph_bytes)),
        ("  KV cache", format_bytes(b.kv_cache_bytes)),
        ("KV per token", format_bytes(b.kv_bytes_per_token)),
        ("KV tokens", f"{b.kv_cache_tokens:,}"),
        ("max_model_len", f"{b.max_model_len:,}"),
        ("longest that fits", f"{b.max_model_len_that_fits:,}"),
        ("max concurrency", f"{b.max_concurrency:g} x {b.max_model_len:,} tokens"),
    ]
    if b.state_bytes_per_seq:
        rows.insert(10, ("state per seq", format_bytes(b.state_bytes_per_seq)))
    width = max(len(k) for k, _ in rows)
    return [f"{k:<{width}}  {v}" for k, v in rows]


def verdict(b: MemoryBreakdown) -> tuple[bool, str]:
    """(fits, one-line verdict with the shortfall and the fix)."""
    if b.fits:
        return True, (
            f"FITS: {b.kv_cache_tokens:,} KV tokens hold {b.max_concurrency:g} requests of "
            f"{b.max_model_len:,} tokens."
        )
    if b.kv_cache_bytes <= 0:
        return False, (
            f"DOES NOT FIT: weights and activations need {format_bytes(b.non_kv_bytes)} but the "
            f"budget is {format_bytes(b.budget_bytes)}; no memory is left for the KV cache "
            f"(short by {format_bytes(b.shortfall_bytes)})."
        )
    fix = (
        f"--max-model-len {b.max_model_len_that_fits}"
        if b.max_model_len_that_fits
        else "--quantization or more GPUs"
    )
    return False, (
        f"DOES NOT FIT: one request of {b.max_model_len:,} tokens needs "
        f"{format_bytes(b.kv_bytes_per_token * b.max_model_len)} of KV cache, "
        f"{format_bytes(b.kv_cache_bytes)} is left (short by {format_bytes(b.shortfall_bytes)}); "
        f"try {fix}."
    )


def _bar_line(b: MemoryBreakdown) -> str:
    """The memory bar as plain text (colour is added by the CLI where it prints)."""
    return "".join(glyph for glyph, _, _ in memory_bar(b, width=BAR_WIDTH))


def fit_report(spec: ModelSpec, hardware: Hardware, result: FitResult, *, device: str) -> list[str]:
    """The short human report of a fit: settings, levers, memory bars, verification."""
    import shlex

    from oominfer.settings import to_vllm_args

    plan = result.plan
    where = (
        f"{hardware.count} x {hardware.gpu.name}"
        if device == "cuda"
        else f"the CPU with {format_bytes(hardware.gpu.cuda_total_bytes)}"
    )
    lines = [f"Plan for {spec.model_id} on {where} ({plan.engine})", ""]
    lines.append("  " + shlex.join(to_vllm_args(plan.settings)))
    lines.append("")
    lines.append("Levers:")
    for lever in plan.levers:
        saved = f"; saves {format_bytes(lever.saved_bytes)}" if lever.saved_bytes else ""
        cost = f"; costs: {lever.cost}" if lever.cost and lever.cost != "none" else ""
        lines.append(f"  {lever.name} = {lever.value}: {lever.reason}{saved}{cost}")
    planned = result.planned
    if planned is not None:
        lines.append("")
        lines.append(f"  this plan     {_bar_line(planned.breakdown)}")
        if planned.baseline is not None:
            _, line = verdict(planned.baseline)
            lines.append(f"  vLLM defaults {_bar_line(planned.baseline)}")
            lines.append(f"  (defaults: {line})")
        lines.append(verdict(planned.breakdown)[1])
    v = plan.verification
    lines.append("")
    if result.cached and v is not None:
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
