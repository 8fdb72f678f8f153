"""GPUs: the built-in catalog, name matching, and hand-described hardware.

Live detection through NVML lives in ``oominfer.hardware.nvml``; this module only reads the
package's static table.
"""

from __future__ import annotations

import difflib
import functools
import json
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any, Final, Literal

from oominfer.base.errors import InvalidSettingError, UnknownGpuError
from oominfer.base.units import GiB, MiB

# CUDA reports less total memory than NVML: the driver keeps some for itself. Measured on
# pairs of (nvidia-smi total, vLLM's total_gpu_memory) in calibration/: RTX 3090 24576 MiB vs
# 23.58 GiB (430 MiB), A10 23028 MiB vs 22.07 GiB (428 MiB), L40S 46068 MiB vs 44.42 GiB
# (582 MiB). Used only where the catalog has no printed CUDA total.
CUDA_RESERVED_BYTES: Final = 480 * MiB

Interconnect = Literal["nvlink", "pcie"]


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuSpec:
    """One kind of GPU."""

    name: str
    memory_bytes: int
    """Total memory as the driver (NVML, nvidia-smi) reports it."""
    cuda_total_bytes: int
    """Total memory as CUDA reports it: what vLLM multiplies by gpu_memory_utilization."""
    compute_capability: tuple[int, int] = (8, 0)
    product_label: str | None = None
    """The value of the Kubernetes node label nvidia.com/gpu.product."""
    marketing_name: str | None = None
    memory_bandwidth_gbps: float | None = None
    memory_type: str | None = None
    """The memory's technology as the datasheet names it: HBM3e, GDDR6X, LPDDR5X..."""
    architecture: str | None = None
    sm_count: int | None = None
    """Streaming multiprocessors (sizes TRITON_MLA's decode workspace)."""
    free_bytes: int | None = None
    """Memory free right now (live detection only): other processes may hold the rest."""
    tflops_16bit: float | None = None
    """Dense tensor-core TFLOPS in bf16/fp16 (fp32 accumulate), from the vendor datasheet."""
    tflops_fp8: float | None = None
    """Dense FP8 tensor-core TFLOPS; None where the GPU has no FP8 units (before Ada)."""
    tops_int8: float | None = None
    """Dense INT8 tensor-core TOPS; None where the GPU has no INT8 tensor cores."""
    interconnect: Interconnect = "pcie"
    """How tensor-parallel peers exchange activations: NVLink or PCIe."""
    interconnect_gbps: float | None = None
    """GPU-to-GPU bandwidth in GB/s, both directions together, as datasheets print it."""

    @property
    def supports_bf16(self) -> bool:
        """bfloat16 needs compute capability 8.0 (Ampere) or newer."""
        return self.compute_capability >= (8, 0)

    @property
    def supports_fp8(self) -> bool:
        """FP8 weights and KV cache need compute capability 8.9 (Ada, Hopper) or newer."""
        return self.compute_capability >= (8, 9)

    @classmethod
    def custom(
        cls,
        memory_bytes: int,
        *,
        compute_capability: tuple[int, int] = (8, 0),
        flag: str = "--gpu-memory",
    ) -> GpuSpec:
        """A GPU described only by its memory (``--gpu-memory 24GiB``).

        The size is taken as what CUDA reports, since that is what users read in vLLM's log.
        ``flag`` names the option the size came from, for the error.
        """
        if memory_bytes < GiB // 4:
            raise InvalidSettingError(
                f"{flag} {memory_bytes} bytes is too small for any model.",
                hint=f"Write the size with a unit, e.g. {flag} 24GiB.",
            )
        return cls(
            name=f"custom-{memory_bytes / GiB:g}GiB",
            memory_bytes=memory_bytes,
            cuda_total_bytes=memory_bytes,
            compute_capability=compute_capability,
        )


def _normalise(name: str) -> str:
    """Lower-case, without punctuation, spaces or vendor words: 'NVIDIA H100-80GB' -> 'h10080gb'."""
    name = name.lower()
    for word in ("nvidia", "geforce", "tesla"):
        name = name.replace(word, "")
    return re.sub(r"[^a-z0-9]", "", name)


def _from_entry(entry: dict[str, Any]) -> GpuSpec:
    memory = int(entry["memory_bytes"])
    cuda_total = entry.get("cuda_total_bytes") or memory - CUDA_RESERVED_BYTES
    cc = entry.get("compute_capability") or [8, 0]
    return GpuSpec(
        name=str(entry["name"]),
        memory_bytes=memory,
        cuda_total_bytes=int(cuda_total),
        compute_capability=(int(cc[0]), int(cc[1])),
        product_label=entry.get("product_label"),
        marketing_name=entry.get("marketing_name"),
        memory_bandwidth_gbps=entry.get("memory_bandwidth_gbps"),
        memory_type=entry.get("memory_type"),
        architecture=entry.get("architecture"),
        sm_count=entry.get("sm_count"),
        tflops_16bit=entry.get("tflops_16bit"),
        tflops_fp8=entry.get("tflops_fp8"),
        tops_int8=entry.get("tops_int8"),
        interconnect="nvlink" if entry.get("interconnect") == "nvlink" else "pcie",
        interconnect_gbps=entry.get("interconnect_gbps"),
    )


@functools.cache
def _entries() -> tuple[dict[str, Any], ...]:
    """The raw rows of the package's gpus.json, read once."""
    text = resources.files("oominfer.data").joinpath("gpus.json").read_text(encoding="utf-8")
    return tuple(json.loads(text)["gpus"])


@functools.cache
def catalog() -> tuple[GpuSpec, ...]:
    """Every GPU in the built-in table, in table order."""
    return tuple(_from_entry(e) for e in _entries())


def _names(entry: dict[str, Any]) -> list[str]:
    """What a catalog row answers to: its name, aliases, marketing name and product label."""
    names = [entry["name"], *entry.get("aliases", [])]
    return names + [n for n in (entry.get("marketing_name"), entry.get("product_label")) if n]


def _words(name: str) -> str:
    """The words of a name in sorted order, without vendor words: 'A100 80GB SXM' and
    'A100-SXM-80GB' -> '80gb a100 sxm'."""
    words = re.split(r"[^a-z0-9]+", name.lower())
    return " ".join(sorted(w for w in words if w and w not in ("nvidia", "geforce", "tesla")))


@functools.cache
def _word_index() -> dict[str, GpuSpec]:
    """Every catalog name and alias by ``_words``, where those words name one GPU only."""
    found: dict[str, set[str]] = {}
    gpus: dict[str, GpuSpec] = {}
    for entry, gpu in zip(_entries(), catalog(), strict=True):
        for alias in _names(entry):
            found.setdefault(_words(alias), set()).add(gpu.name)
            gpus[_words(alias)] = gpu
    return {words: gpus[words] for words, kinds in found.items() if len(kinds) == 1}


@functools.cache
def _index() -> dict[str, GpuSpec]:
    index: dict[str, GpuSpec] = {}
    for entry, gpu in zip(_entries(), catalog(), strict=True):
        for alias in _names(entry):
            index.setdefault(_normalise(alias), gpu)
    return index


def find_gpu(name: str) -> GpuSpec:
    """Look a GPU up by name, case- and punctuation-insensitively.

    Raises:
        UnknownGpuError: no such GPU; the message suggests the closest names.
    """
    key = _normalise(name)
    index = _index()
    if key in index:
        return index[key]
    if (by_words := _word_index().get(_words(name))) is not None:
        return by_words  # the same words in another order: 'A100-80GB-SXM'
    close = difflib.get_close_matches(key, index, n=6, cutoff=0.5)
    suggestions = list(dict.fromkeys(index[c].name for c in close))[:3]
    hint = "Pass --gpu-memory 24GiB for a GPU that is not in the list (see `oominfer gpus`)."
    if suggestions:
        hint = f"Did you mean {', '.join(suggestions)}? " + hint
    raise UnknownGpuError(f"unknown GPU {name!r}.", hint=hint)
