"""Live GPU detection through NVML, with a quiet fallback when there is no GPU or driver."""

from __future__ import annotations

import contextlib

from oominfer.base.errors import UnknownGpuError
from oominfer.hardware.gpu import CUDA_RESERVED_BYTES, GpuSpec, find_gpu


def detect_gpus() -> list[GpuSpec]:
    """The GPUs of this machine (total and free memory from NVML), or [] when none is seen."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return []
    try:
        found = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(handle)
            name = name.decode() if isinstance(name, bytes) else str(name)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            try:
                known: GpuSpec | None = find_gpu(name)
            except UnknownGpuError:
                known = None
            try:
                info = pynvml.nvmlDeviceGetMemoryInfo(handle)
                memory, free = int(info.total), int(info.free)
            except pynvml.NVMLError:
                # Integrated parts (the GB10 of a DGX Spark) share their memory with the CPU
                # and NVML answers "Not Supported": the catalog's totals, nothing on free.
                if known is None:
                    continue
                memory, free = known.memory_bytes, None
            cuda_total = known.cuda_total_bytes if known and known.memory_bytes == memory else None
            found.append(
                GpuSpec(
                    name=known.name if known else name,
                    memory_bytes=memory,
                    cuda_total_bytes=cuda_total or memory - CUDA_RESERVED_BYTES,
                    compute_capability=(int(major), int(minor)),
                    product_label=known.product_label if known else name.replace(" ", "-"),
                    marketing_name=name,
                    free_bytes=free,
                    # The datasheet figures the speed model reads come from the catalog.
                    memory_bandwidth_gbps=known.memory_bandwidth_gbps if known else None,
                    architecture=known.architecture if known else None,
                    tflops_16bit=known.tflops_16bit if known else None,
                    tflops_fp8=known.tflops_fp8 if known else None,
                    tops_int8=known.tops_int8 if known else None,
                    interconnect=known.interconnect if known else "pcie",
                    interconnect_gbps=known.interconnect_gbps if known else None,
                )
            )
        return found
    except pynvml.NVMLError:
        return []
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()
