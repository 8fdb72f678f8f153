"""When nothing fits: how far it is from fitting, and the ways out that would fit.

Every way out named is checked with the planner itself (a catalog checkpoint, a GPU count,
offloading, a shorter floor), so the message never suggests what does not fit either.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator

from oominfer.base.errors import DoesNotFitError, InvalidSettingError, ModelError
from oominfer.base.units import format_bytes
from oominfer.hardware.hardware import Hardware
from oominfer.memory.breakdown import MemoryBreakdown
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
    roomiest,
    with_offload,
)

GPU_COUNTS = (2, 4, 8, 16, 32, 64)
"""GPU counts tried as a way out."""


def _closest(spec: ModelSpec, hardware: Hardware, c: Constraints) -> MemoryBreakdown:
    """The most that fits: the widest layout, the smallest formats, eager, one sequence at
    the floor."""
    settings = dataclasses.replace(
        roomiest(spec, hardware, c),
        max_model_len=c.floor(spec.max_position_embeddings),
        max_num_seqs=1,
    )
    return estimate_for(spec, hardware, settings, c)


def _ways_out(spec: ModelSpec, hardware: Hardware, c: Constraints) -> Iterator[str]:
    """Changes that would fit, cheapest in quality first."""
    if hardware.is_cpu:
        if c.engine == "vllm" and anything_fits(
            spec, hardware, dataclasses.replace(c, engine="transformers")
        ):
            yield "--engine transformers (int8/nf4 weights on the CPU)"
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
    for n in GPU_COUNTS:
        if n > hardware.count and anything_fits(spec, dataclasses.replace(hardware, count=n), c):
            nodes = math.ceil(n / c.gpus_per_node)
            where = f" ({nodes} nodes of {c.gpus_per_node})" if nodes > 1 else ""
            yield f"--gpus {n}{where}"
            break
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


def does_not_fit(spec: ModelSpec, hardware: Hardware, c: Constraints) -> DoesNotFitError:
    """The error for a model that cannot fit, with the shortfall and the ways out."""
    b = _closest(spec, hardware, c)
    where = hardware.describe()
    floor = c.floor(spec.max_position_embeddings)
    if b.kv_cache_bytes <= 0:
        need = b.non_kv_bytes
        why = (
            f"the weights and activations need {format_bytes(need)} per GPU, the budget is "
            f"{format_bytes(b.budget_bytes)} (short by {format_bytes(need - b.budget_bytes)})"
        )
        shortfall = max(need - b.budget_bytes, 1)
    elif c.concurrency and b.max_model_len_that_fits >= floor:
        why = f"{c.concurrency} requests of {c.typical_length:,} tokens do not fit at once"
        shortfall = b.shortfall_bytes
    else:
        why = (
            f"the KV cache left holds {b.max_model_len_that_fits:,} tokens per request, "
            f"fewer than the {floor:,} asked for"
        )
        shortfall = max(
            b.shortfall_bytes, b.kv_bytes_per_token * (floor - b.max_model_len_that_fits)
        )
    return DoesNotFitError(
        f"{spec.model_id} does not fit {where} even with every lever turned: {why}.",
        shortfall_bytes=max(shortfall, 1),
        ways_out=list(_ways_out(spec, hardware, c)),
    )
