"""What one replica runs on: a kind of GPU and how many, or the host's CPU and memory."""

from __future__ import annotations

from dataclasses import dataclass

from oominfer.base.errors import InvalidSettingError
from oominfer.hardware.gpu import GpuSpec, find_gpu
from oominfer.settings import DEVICES, Device


@dataclass(frozen=True, slots=True, kw_only=True)
class Hardware:
    """The accelerator: a GPU kind and how many of it, or (``device="cpu"``) the memory of
    the host that vLLM's CPU backend or the transformers engine may use."""

    gpu: GpuSpec
    """The GPU kind; on the CPU, a stand-in whose memory is the budget."""
    count: int = 1
    device: Device = "cuda"

    def __post_init__(self) -> None:
        """Reject a non-positive GPU count or an unknown device."""
        if self.count < 1:
            raise InvalidSettingError(f"--gpus must be at least 1, got {self.count}.")
        if self.device not in DEVICES:
            raise InvalidSettingError(f"unknown device {self.device!r}; use cuda or cpu.")

    @classmethod
    def from_gpu(cls, name: str, count: int = 1) -> Hardware:
        """``count`` GPUs of a kind in the catalog (any spelling: ``h100``, ``NVIDIA L4``).

        Raises:
            UnknownGpuError: no such GPU; the message suggests the closest names.
        """
        return cls(gpu=find_gpu(name), count=count)

    @classmethod
    def custom(cls, memory_bytes: int, count: int = 1) -> Hardware:
        """``count`` GPUs known only by their memory (``--gpu-memory 24GiB``)."""
        return cls(gpu=GpuSpec.custom(memory_bytes), count=count)

    @classmethod
    def cpu(cls, memory_bytes: int | None = None) -> Hardware:
        """The host's CPU with ``memory_bytes`` for the engine (default: what is available)."""
        from oominfer.hardware.host import available_memory_bytes

        budget = memory_bytes if memory_bytes is not None else available_memory_bytes()
        return cls(gpu=GpuSpec.custom(budget, flag="--memory"), count=1, device="cpu")

    @classmethod
    def detect(cls, count: int | None = None, *, default: str | None = None) -> Hardware:
        """This machine's GPUs, read through NVML (total and free memory).

        Args:
            count: GPUs to plan for (default: all that were found).
            default: the GPU to assume when none is found (the CLI assumes an L4).

        Raises:
            InvalidSettingError: no GPU was found and no default was given.
        """
        from oominfer.hardware.nvml import detect_gpus

        found = detect_gpus()
        if found:
            return cls(gpu=found[0], count=count or len(found))
        if default is None:
            raise InvalidSettingError(
                "no NVIDIA GPU was found on this machine (NVML sees none).",
                hint="Name the GPU to plan for with Hardware.from_gpu('L4') or --gpu L4.",
            )
        return cls.from_gpu(default, count or 1)

    @property
    def is_cpu(self) -> bool:
        """True for vLLM's CPU backend or transformers on the host."""
        return self.device == "cpu"

    def describe(self) -> str:
        """``2 x H100-80GB``, or ``the CPU with 6.00 GiB``."""
        from oominfer.base.units import format_bytes

        if self.is_cpu:
            return f"the CPU with {format_bytes(self.gpu.cuda_total_bytes)}"
        return f"{self.count} x {self.gpu.name}"
