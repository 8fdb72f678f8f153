"""When nothing fits: the shortfall, and the ways out that would fit."""

from __future__ import annotations

import dataclasses
import math

from oominfer.errors import DoesNotFitError, InvalidSettingError
from oominfer.hardware.hardware import Hardware
from oominfer.memory.estimate import estimate
from oominfer.model.spec import ModelSpec, QuantSpec
from oominfer.planning.constraints import Constraints
from oominfer.planning.search import candidates, divisors
from oominfer.settings import VllmSettings
from oominfer.units import GiB, format_bytes


def does_not_fit(spec: ModelSpec, hardware: Hardware, c: Constraints) -> DoesNotFitError:
    """The error for a model that cannot fit, with the shortfall and the cheapest ways out."""
    engine = c.engine
    tp = max(divisors(spec, hardware.count) or [1])
    settings = VllmSettings(
        gpu_memory_utilization=c.gpu_memory_utilization or VllmSettings().gpu_memory_utilization,
        max_model_len=max(c.min_context, 1),
        max_num_seqs=c.concurrency or 1,
        enforce_eager=not hardware.is_cpu and engine == "vllm",
        tensor_parallel_size=tp,
        kv_cache_memory_bytes=c.kv_cache_memory_bytes,
    )
    b = estimate(spec, hardware=hardware, settings=settings, engine=engine)
    shortfall = max(b.shortfall_bytes, 1)
    ways = []
    if not hardware.is_cpu:
        for n in (2, 4, 8, 16, 32, 64):
            if n <= hardware.count:
                continue
            more = dataclasses.replace(hardware, count=n)
            try:
                candidates_n = candidates(spec, more, c)
                if next(candidates_n, None) is not None:
                    ways.append(f"--gpus {n}")
                    break
            except InvalidSettingError:
                continue
        if spec.quantization is None and not c.no_quantize:
            four_bit = dataclasses.replace(
                spec,
                quantization=QuantSpec(method="awq", bits=4, group_size=128),
                checkpoint=dataclasses.replace(spec.checkpoint, total_bytes=None),
            )
            if next(candidates(four_bit, hardware, c), None):
                ways.append("a 4-bit (AWQ/GPTQ) checkpoint of this model")
        if b.shortfall_bytes and engine == "vllm":
            ways.append(f"--allow-offload (about {math.ceil(shortfall / GiB)} GiB of weights)")
    if b.max_model_len_that_fits > 0:
        ways.append(f"--min-context {b.max_model_len_that_fits}")
    gpu = f"{hardware.count} x {hardware.gpu.name}" if not hardware.is_cpu else "this memory"
    return DoesNotFitError(
        f"{spec.model_id} does not fit {gpu} at context {c.min_context:,}: short by "
        f"{format_bytes(shortfall)} even with every lever turned.",
        shortfall_bytes=shortfall,
        ways_out=ways,
    )
