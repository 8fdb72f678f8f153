"""When nothing fits: how far it is from fitting, and the ways out that would fit.

Every way out named is checked with the planner itself (a catalog checkpoint, a GPU count,
offloading, a shorter floor), so the message never suggests what does not fit either.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from typing import Final

from oominfer.base.errors import DoesNotFitError, InvalidSettingError, ModelError
from oominfer.base.units import GiB, counted, format_bytes
from oominfer.hardware.gpu import find_gpu
from oominfer.hardware.hardware import Hardware
from oominfer.memory.breakdown import MemoryBreakdown
from oominfer.memory.profile import free_at_start, utilization_for_startup
from oominfer.model.catalog import quantized_siblings
from oominfer.model.load import load_spec
from oominfer.model.spec import ModelSpec, QuantSpec
from oominfer.planning.constraints import Constraints
from oominfer.planning.costs import WEIGHT_ONLY_FP8
from oominfer.planning.refusals import check_checkpoint
from oominfer.planning.search import (
    anything_fits,
    candidates,
    estimate_for,
    kv_cache_dtypes,
    required,
    roomiest,
    weight_formats,
    with_offload,
)
from oominfer.settings import EngineSettings, flag

GPU_COUNTS = (2, 4, 8, 16, 32, 64)
"""GPU counts tried as a way out."""
HOST_MEMORY_GIB = (8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048)
"""Host memory sizes (GiB) tried as a way out on the CPU."""


def _closest(
    spec: ModelSpec, hardware: Hardware, c: Constraints
) -> tuple[MemoryBreakdown, EngineSettings]:
    """The most that fits under the user's own constraints: the widest layout, the smallest
    weight format and KV-cache dtype they allow, eager, one sequence (or the concurrency
    asked for) at the floor, with every setting they named kept. Of the weight formats, the
    one closest to fitting."""
    base = dataclasses.replace(
        roomiest(spec, hardware, c),
        max_model_len=c.floor(spec.max_position_embeddings),
        max_num_seqs=c.concurrency or 1,
    )
    kv = c.wants_list("kv_cache_dtype", kv_cache_dtypes(spec, hardware, c))[-1]
    found: list[tuple[MemoryBreakdown, EngineSettings]] = []
    for quant in c.wants_list("quantization", weight_formats(spec, hardware, c)):
        settings = required(dataclasses.replace(base, quantization=quant, kv_cache_dtype=kv), c)
        try:
            found.append((estimate_for(spec, hardware, settings, c), settings))
        except InvalidSettingError:
            continue
    if not found:
        settings = required(base, c)
        return estimate_for(spec, hardware, settings, c), settings
    return min(found, key=lambda pair: (not pair[0].fits, pair[0].shortfall_bytes))


def _held_back(spec: ModelSpec, hardware: Hardware, c: Constraints) -> Iterator[str]:
    """The levers the user's preference or flags held back that would fit, each with the
    flag that releases it."""
    released = next(
        (
            other
            for other in ("balanced", "context")
            if c.prefer == "quality"
            and anything_fits(spec, hardware, dataclasses.replace(c, prefer=other))
        ),
        None,
    )
    if released is not None:
        yield f"--prefer {released} (quantized weights or an FP8 KV cache, held back by quality)"
    elif (
        c.prefer == "quality"
        and c.engine == "vllm"
        and not hardware.is_cpu
        and spec.quantization is None
        and anything_fits(
            spec, hardware, dataclasses.replace(c, prefer="balanced", engine="transformers")
        )
    ):
        yield (
            "--prefer balanced --engine transformers (bitsandbytes int8 or nf4 weights, held "
            "back by quality)"
        )
    if c.no_quantize and anything_fits(spec, hardware, dataclasses.replace(c, no_quantize=False)):
        yield "drop --no-quantize (quantized weights)"
    if (
        c.engine == "vllm"
        and not hardware.is_cpu
        and c.quantizes_weights
        and spec.quantization is None
        and anything_fits(spec, hardware, dataclasses.replace(c, engine="transformers"))
    ):
        yield "--engine transformers (bitsandbytes int8 or nf4 weights, which vLLM lacks here)"
    for name, value in c.requested.items():
        rest = {k: v for k, v in c.requested.items() if k != name}
        if anything_fits(spec, hardware, dataclasses.replace(c, requested=rest)):
            shown = "" if value is True else f" {value}"
            yield f"without {flag(name)}{shown}"
    if c.max_model_len is not None:
        longest = max(
            (
                cand.context
                for cand in candidates(spec, hardware, dataclasses.replace(c, max_model_len=None))
            ),
            default=0,
        )
        if longest:
            yield f"{flag('max_model_len')} {longest} (the longest that fits)"


def _fitting_requests(spec: ModelSpec, hardware: Hardware, c: Constraints) -> int:
    """The most requests of the typical length that do run at once without --concurrency."""
    free = dataclasses.replace(c, concurrency=None)
    return max((cand.total_running for cand in candidates(spec, hardware, free)), default=0)


def _kv_layout(spec: ModelSpec) -> str:
    """The KV cache as the model has it: sliding-window and global layers counted apart."""
    full = sum(1 for k in spec.layer_kinds if k == "full")
    sliding = sum(1 for k in spec.layer_kinds if k == "sliding")
    if not sliding or not spec.sliding_window:
        return ""
    return (
        f" ({full} global layers cache every token, {sliding} sliding-window layers at most "
        f"{spec.sliding_window:,})"
    )


def _ways_out(spec: ModelSpec, hardware: Hardware, c: Constraints) -> Iterator[str]:
    """Changes that would fit, cheapest in quality first."""
    if hardware.is_cpu:
        if c.engine == "vllm" and anything_fits(
            spec, hardware, dataclasses.replace(c, engine="transformers")
        ):
            yield "--engine transformers (int8/nf4 weights on the CPU)"
        here = hardware.gpu.cuda_total_bytes
        for gib in HOST_MEMORY_GIB:
            if gib * GiB > here and anything_fits(spec, Hardware.cpu(gib * GiB), c):
                yield f"--memory {gib}GiB (if the host has it)"
                break
        return
    for name in quantized_siblings(spec):
        try:
            sibling = load_spec(name)
            check_checkpoint(sibling, hardware, c)
        except (ModelError, InvalidSettingError):
            continue
        if anything_fits(sibling, hardware, c) and sibling.quantization is not None:
            q = sibling.quantization
            yield f"the {q.bits:g}-bit {q.method} checkpoint {name} (in the catalog)"
            break
    else:
        if spec.quantization is None and c.quantizes_weights:
            four_bit = dataclasses.replace(
                spec,
                quantization=QuantSpec(method="awq", bits=4, group_size=128),
                checkpoint=dataclasses.replace(spec.checkpoint, total_bytes=None),
            )
            if anything_fits(four_bit, hardware, c):
                yield "a 4-bit (AWQ/GPTQ, int4) checkpoint of this model"
    if c.prefer not in WEIGHT_ONLY_FP8 and c.quantizes_weights and not hardware.gpu.supports_fp8:
        context = dataclasses.replace(c, prefer="context")
        if anything_fits(spec, hardware, context):
            yield "--prefer context (FP8 weights in flight, weight-only through Marlin on this GPU)"
    if c.engine == "transformers":
        # The transformers engine runs a model on one GPU; vLLM splits it over several.
        vllm = dataclasses.replace(c, engine="vllm")
        for n in (hardware.count, *(k for k in GPU_COUNTS if k > hardware.count)):
            if anything_fits(spec, dataclasses.replace(hardware, count=n), vllm):
                more = f" --gpus {n}" if n > hardware.count else ""
                yield f"--engine vllm{more} (it splits the model over GPUs; transformers: one)"
                break
        yield from _bigger_gpu(spec, hardware, c)
        return
    for n in GPU_COUNTS:
        if n > hardware.count and anything_fits(spec, dataclasses.replace(hardware, count=n), c):
            nodes = math.ceil(n / c.gpus_per_node)
            where = f" ({nodes} nodes of {c.gpus_per_node})" if nodes > 1 else ""
            yield f"--gpus {n}{where}"
            break
    yield from _bigger_gpu(spec, hardware, c)
    if c.engine == "vllm" and not c.allow_offload:
        offload = with_offload(spec, hardware, dataclasses.replace(c, allow_offload=True))
        if offload:
            gib = math.ceil(offload[0].settings.cpu_offload_gb)
            yield f"--allow-offload ({gib} GiB of weights per GPU in host memory, slow)"
    if c.min_context is not None:
        shorter = dataclasses.replace(c, min_context=None)
        found = next(candidates(spec, hardware, shorter), None)
        if found is not None:
            yield f"--min-context {found.context}"


RENTED_GPUS: Final = (
    "T4-16GB", "L4-24GB", "A10G-24GB", "L40S-48GB", "A100-SXM-40GB", "A100-SXM-80GB",
    "H100-SXM-80GB", "H200-SXM-141GB", "B200-180GB",
)  # fmt: skip
"""The GPU kinds a way out may name: those the clouds rent by the hour, by memory."""


def _bigger_gpu(spec: ModelSpec, hardware: Hardware, c: Constraints) -> Iterator[str]:
    """The rented GPU kind (RENTED_GPUS) with the least memory above this one's on which
    the same count fits."""
    here = hardware.gpu.cuda_total_bytes
    bigger = sorted(
        (g for g in map(find_gpu, RENTED_GPUS) if g.cuda_total_bytes > here),
        key=lambda g: g.cuda_total_bytes,
    )
    for gpu in bigger:
        if anything_fits(spec, dataclasses.replace(hardware, gpu=gpu), c):
            count = f", {hardware.count} of them" if hardware.count > 1 else ""
            yield f"--gpu {gpu.name} ({format_bytes(gpu.cuda_total_bytes)}{count})"
            return


def does_not_fit(spec: ModelSpec, hardware: Hardware, c: Constraints) -> DoesNotFitError:
    """The error for a model that cannot fit: the closest plan under the user's own
    constraints and its shortfall (need minus budget), and the ways out, those a preference
    or flag held back first."""
    b, closest = _closest(spec, hardware, c)
    where = hardware.describe()
    floor = c.floor(spec.max_position_embeddings)
    ways = list(_held_back(spec, hardware, c))
    if b.startup_short_bytes > 0:
        # Only a utilization the user gave gets here (the planner lowers its own).
        util = utilization_for_startup(b)
        why = (
            f"at {flag('gpu_memory_utilization')} {closest.gpu_memory_utilization:g} vLLM asks "
            f"for {format_bytes(b.budget_bytes)} per GPU at start, but {free_at_start(b)}"
        )
        ways.insert(0, f"{flag('gpu_memory_utilization')} {util:.2f}")
        shortfall = b.startup_short_bytes
    elif b.kv_cache_bytes <= 0:
        need = b.non_kv_bytes
        per = "" if hardware.is_cpu else " per GPU"
        why = (
            f"the weights and activations of the closest plan ({_describe(b, closest)}) need "
            f"{format_bytes(need)}{per}, the budget is {format_bytes(b.budget_bytes)} "
            f"(short by {format_bytes(max(need - b.budget_bytes, 0))} before any KV cache)"
        )
        shortfall = max(need - b.budget_bytes, 1)
    elif c.concurrency and b.max_model_len_that_fits >= floor:
        fitting = _fitting_requests(spec, hardware, c)
        why = (
            f"{counted(c.concurrency, 'request')} of {counted(c.typical_length, 'token')} do "
            f"not fit at once; {fitting:,} do"
        )
        if fitting:
            ways.insert(0, f"--concurrency {fitting}")
        shortfall = b.shortfall_bytes
    else:
        asked = flag("max_model_len") if c.max_model_len is not None else "the floor"
        why = (
            f"the KV cache left in the closest plan ({_describe(b, closest)}) holds "
            f"{counted(b.max_model_len_that_fits, 'token')} per request{_kv_layout(spec)}, "
            f"fewer than the {floor:,} of {asked}"
        )
        shortfall = max(
            b.shortfall_bytes, b.kv_bytes_per_token * (floor - b.max_model_len_that_fits)
        )
    ways += [w for w in _ways_out(spec, hardware, c) if w not in ways]
    return DoesNotFitError(
        f"{spec.model_id} does not fit {where} with the levers these constraints allow: {why}.",
        shortfall_bytes=max(shortfall, 1),
        ways_out=ways,
    )


def _describe(b: MemoryBreakdown, s: EngineSettings) -> str:
    """The closest plan's shape in a few words (its layout where it spans GPUs)."""
    parts = []
    if s.tensor_parallel_size * s.pipeline_parallel_size > 1 or b.engine == "vllm":
        parts.append(f"TP {s.tensor_parallel_size} x PP {s.pipeline_parallel_size}")
    parts.append(f"{s.quantization} weights" if s.quantization else f"{b.dtype} weights")
    if s.kv_cache_dtype != "auto":
        parts.append(f"{s.kv_cache_dtype} KV cache")
    if s.enforce_eager:
        parts.append("eager")
    return ", ".join(parts)
