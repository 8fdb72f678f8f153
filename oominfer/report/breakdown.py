"""An estimate for people: the table, the memory bar and the verdict. Pure: returns strings."""

from __future__ import annotations

from oominfer.base.units import counted, format_bytes
from oominfer.hardware.hardware import Hardware
from oominfer.memory.breakdown import MemoryBreakdown
from oominfer.memory.profile import (
    free_at_start,
    utilization_for_capture,
    utilization_for_startup,
)
from oominfer.model.spec import ModelSpec
from oominfer.planning.document import Prediction
from oominfer.settings import flag

BAR_WIDTH = 60
# (label, glyph, colour) of each bar segment, in the order vLLM allocates them. Every part
# has its own glyph, so the bar reads without colour (NO_COLOR, a pipe, a log file).
SEGMENTS = (
    ("weights", "█", "blue"),
    ("activations", "▓", "magenta"),
    ("non-torch", "▒", "yellow"),
    ("CUDA graphs", "░", "cyan"),
    ("draft, LoRA, encoder", "▞", "bright_magenta"),
    ("KV cache", "▚", "green"),
)
OVER = ("beyond the budget", "!", "red")
"""What lies beyond ``gpu_memory_utilization``'s budget: drawn in its place, after the parts
that fit, so a part that exceeds the budget shows as a run of ``!``."""
FREE = ("free", "·", "white")

Segment = tuple[str, str, str]
"""(glyphs, colour, legend) of one run of the bar."""


def _cells(sizes: list[int], width: int) -> list[int]:
    """Cells per size, summing to ``width``: every non-zero size gets at least one, the
    largest absorbs the rounding."""
    span = max(sum(sizes), 1)
    cells = [max(round(n * width / span), 1) if n else 0 for n in sizes]
    cells[cells.index(max(cells))] += width - sum(cells)
    return cells


def memory_bar(b: Prediction, *, width: int = BAR_WIDTH) -> list[Segment]:
    """The GPU's memory as segments scaled to ``width`` cells: the parts in the order vLLM
    allocates them up to the budget, then ``!`` for whatever exceeds the budget, then the
    memory left free. The legend names each part with its glyph and size (never negative)."""
    parts = [
        b.weights_bytes,
        b.activation_bytes,
        b.non_torch_bytes,
        b.cuda_graph_bytes,
        b.added_bytes,
        max(b.kv_cache_bytes, 0),
    ]
    budget = b.budget_bytes or b.total_bytes
    within, used = [], 0  # what of each part lies within the budget
    for size in parts:
        within.append(max(min(used + size, budget) - used, 0))
        used += size
    over, free = max(used - budget, 0), max(b.total_bytes - used, 0)
    drawn = _cells([*within, over, free], width)
    shown = [*parts, over, free]  # the legend names each part's whole size
    return [
        (glyph * cells, colour, f"{glyph} {label} {format_bytes(size)}")
        for (label, glyph, colour), size, cells in zip(
            (*SEGMENTS, OVER, FREE), shown, drawn, strict=True
        )
        if size
    ]


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
        ("  KV cache", _kv_row(b)),
        ("KV per token", format_bytes(b.kv_bytes_per_token)),
        ("KV tokens", f"{b.kv_cache_tokens:,}"),
        ("max_model_len", f"{b.max_model_len:,}"),
        ("longest that fits", f"{b.max_model_len_that_fits:,}"),
        ("max concurrency", f"{b.max_concurrency:g} x {b.max_model_len:,} tokens"),
    ]
    if b.state_bytes_per_seq:
        rows.insert(10, ("state per seq", format_bytes(b.state_bytes_per_seq)))
    rows[8:8] = _addition_rows(b)
    a = b.additions
    if a.data_parallel_size > 1:
        total = b.max_concurrency * a.data_parallel_size
        rows.append(("data parallel", f"{a.data_parallel_size} engines: {total:g} x "
                     f"{b.max_model_len:,} tokens in all"))  # fmt: skip
    if a.prefix_caching is not None and b.engine == "vllm":
        rows.append(("prefix caching", _prefix_caching(a.prefix_caching)))
    width = max(len(k) for k, _ in rows)
    return [f"{k:<{width}}  {v}" for k, v in rows]


def _addition_rows(b: MemoryBreakdown) -> list[tuple[str, str]]:
    """The operator additions' lines (memory/additions.py), those in use."""
    a, rows = b.additions, []
    if a.speculative_method:
        draft = a.speculative_weights_bytes + a.speculative_graph_bytes
        kv = format_bytes(a.speculative_kv_bytes_per_token)
        rows.append((f"  draft ({a.speculative_method})",
                     f"{format_bytes(draft)} (+{kv} KV per token)"))  # fmt: skip
    if a.lora_bytes:
        host = format_bytes(a.lora_cpu_cache_bytes)
        rows.append(("  LoRA slots", f"{format_bytes(a.lora_bytes)} (CPU cache: {host} of host "
                     "memory)"))  # fmt: skip
    if a.vision_tower_bytes:
        rows.append(("  vision tower", f"{format_bytes(a.vision_tower_bytes)} of the weights"))
    if a.multimodal_bytes:
        kind = a.encoder_modality
        items = f"{a.encoder_items} {kind}{'s' if a.encoder_items != 1 else ''}"
        rows.append(("  encoder cache", f"{format_bytes(a.multimodal_bytes)} ({items} profiled)"))
    if a.experts_per_gpu:
        rows.append(("  experts (EP)", f"{a.experts_per_gpu} per GPU, "
                     f"{format_bytes(a.expert_weights_bytes)} of the weights"))  # fmt: skip
    return rows


def _prefix_caching(on: bool) -> str:
    """What prefix caching does to the count above: it holds no memory of its own."""
    if on:
        return "on: requests that share a prompt prefix hold its blocks once, so more fit"
    return "off: every request holds its own blocks, shared prefix or not"


def _kv_row(b: MemoryBreakdown) -> str:
    """The KV cache's size, or what is missing when nothing is left for it."""
    if b.kv_cache_bytes >= 0:
        return format_bytes(b.kv_cache_bytes)
    return f"none: the rest needs {format_bytes(-b.kv_cache_bytes)} more than the budget"


def verdict(b: Prediction) -> tuple[bool, str]:
    """(fits, one-line verdict with the shortfall and the fix)."""
    if b.fits:
        return True, (
            f"FITS: the KV cache holds {counted(b.kv_cache_tokens, 'token')}: "
            f"{counted(b.max_concurrency, 'request')} of {counted(b.max_model_len, 'token')}."
        )
    if b.overcommitted_bytes > 0:
        room = b.total_bytes - b.non_kv_bytes
        return False, (
            f"DOES NOT FIT: the {format_bytes(b.kv_cache_bytes)} KV cache asked for does not fit "
            f"beside {format_bytes(b.non_kv_bytes)} of weights and activations in the GPU's "
            f"{format_bytes(b.total_bytes)} (short by {format_bytes(b.overcommitted_bytes)}); "
            f"try --kv-cache-memory-bytes {max(room, 0) // 2**20}MiB or less."
        )
    if b.startup_short_bytes > 0:
        return False, (
            f"DOES NOT FIT: vLLM asks for {format_bytes(b.budget_bytes)} at start "
            f"({flag('gpu_memory_utilization')} {b.budget_bytes / b.total_bytes:.2f} of "
            f"{format_bytes(b.total_bytes)}), but {free_at_start(b)}; "
            f"try {flag('gpu_memory_utilization')} {utilization_for_startup(b):.2f}."
        )
    if b.post_capture_short_bytes > 0 and b.kv_cache_bytes > 0:
        return False, (
            f"DOES NOT FIT: this vLLM release sizes the KV cache without its "
            f"{format_bytes(b.cuda_graph_bytes)} of CUDA graphs and captures them afterwards "
            f"above the budget, where with the sampler's warm-up they lack "
            f"{format_bytes(b.post_capture_short_bytes)} (CUDA out of memory after capture); "
            f"try {flag('gpu_memory_utilization')} {utilization_for_capture(b):.2f} or "
            f"{flag('enforce_eager')}."
        )
    if b.kv_cache_bytes <= 0:
        over = b.non_kv_bytes - b.budget_bytes
        return False, (
            f"DOES NOT FIT: weights and activations need {format_bytes(b.non_kv_bytes)} but the "
            f"budget is {format_bytes(b.budget_bytes)} (short by {format_bytes(max(over, 0))}, "
            f"{format_bytes(b.shortfall_bytes)} with one request's KV cache)."
        )
    fix = (
        f"{flag('max_model_len')} {b.max_model_len_that_fits}"
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
