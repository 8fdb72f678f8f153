"""An estimate for people: the table, the memory bar and the verdict. Pure: returns strings."""

from __future__ import annotations

from oominfer.hardware.hardware import Hardware
from oominfer.memory.breakdown import MemoryBreakdown
from oominfer.model.spec import ModelSpec
from oominfer.planning.document import Prediction
from oominfer.units import format_bytes

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


def memory_bar(b: Prediction, *, width: int = BAR_WIDTH) -> list[tuple[str, str, str]]:
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


def verdict(b: Prediction) -> tuple[bool, str]:
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


def bar_line(b: Prediction) -> str:
    """The memory bar as plain text (colour is added by the CLI where it prints)."""
    return "".join(glyph for glyph, _, _ in memory_bar(b, width=BAR_WIDTH))
