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
            info = pynvml.nvmlDeviceGetMemoryInfo(handle)
            memory = int(info.total)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            try:
                known = find_gpu(name)
                cuda_total = known.cuda_total_bytes if known.memory_bytes == memory else None
            except UnknownGpuError:
                known, cuda_total = None, None
            found.append(
                GpuSpec(
                    name=known.name if known else name,
                    memory_bytes=memory,
                    cuda_total_bytes=cuda_total or memory - CUDA_RESERVED_BYTES,
                    compute_capability=(int(major), int(minor)),
                    product_label=known.product_label if known else name.replace(" ", "-"),
                    marketing_name=name,
                    free_bytes=int(info.free),
                    # The datasheet figures the speed model reads come from the catalog.
                    memory_bandwidth_gbps=known.memory_bandwidth_gbps if known else None,
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
