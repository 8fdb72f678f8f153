"""The engine knobs oominfer tunes, under vLLM's own names, and their argv form."""

from __future__ import annotations

from dataclasses import dataclass

from oominfer.dtypes import (
    DTYPES,
    KV_CACHE_DTYPES,
    QUANTIZATIONS,
    Dtype,
    KvCacheDtype,
    Quantization,
)
from oominfer.errors import InvalidSettingError

TRANSFORMERS_ONLY = frozenset({"bitsandbytes", "int8"})
"""In-flight bitsandbytes quantization: vLLM 0.32 has no loader for it (transformers only)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class VllmSettings:
    """Serving settings. Field names match vLLM's engine arguments (``--max-model-len``...)."""

    dtype: Dtype = "auto"
    """Compute dtype; ``auto`` is the checkpoint's 16-bit dtype (bf16 falls back to fp16 on
    GPUs older than compute capability 8.0)."""
    quantization: Quantization | None = None
    """Weight quantization; None keeps the checkpoint's own format."""
    kv_cache_dtype: KvCacheDtype = "auto"
    """KV-cache element type; ``fp8`` halves it."""
    gpu_memory_utilization: float = 0.92
    """Fraction of the GPU's total memory vLLM may claim, in (0, 1] (vllm/config/cache.py)."""
    max_model_len: int | None = None
    """Prompt plus output tokens of one sequence; None lets vLLM derive it from config.json."""
    max_num_seqs: int | None = None
    """Sequences scheduled at once; None takes vLLM's default for the GPU."""
    max_num_batched_tokens: int | None = None
    """Tokens per scheduler step (the prefill chunk); None takes vLLM's default for the GPU."""
    enforce_eager: bool = False
    """Disable CUDA graphs: frees their memory, costs decode speed."""
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    cpu_offload_gb: float = 0
    """GiB of weights per GPU kept in host memory and streamed in each forward pass."""
    kv_cache_memory_bytes: int | None = None
    """A fixed KV-cache size instead of one derived from gpu_memory_utilization."""

    def __post_init__(self) -> None:
        """Reject settings vLLM would reject, with the flag to change."""
        if self.dtype not in DTYPES:
            raise InvalidSettingError(f"unknown --dtype {self.dtype!r}.")
        if self.quantization is not None and self.quantization not in QUANTIZATIONS:
            raise InvalidSettingError(f"unknown --quantization {self.quantization!r}.")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise InvalidSettingError(f"unknown --kv-cache-dtype {self.kv_cache_dtype!r}.")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise InvalidSettingError(
                f"--gpu-memory-utilization must be in (0, 1], got {self.gpu_memory_utilization}.",
                hint="Try --gpu-memory-utilization 0.92 (vLLM's default).",
            )
        for flag, value in (
            ("--max-model-len", self.max_model_len),
            ("--max-num-seqs", self.max_num_seqs),
            ("--max-num-batched-tokens", self.max_num_batched_tokens),
            ("--tensor-parallel-size", self.tensor_parallel_size),
            ("--pipeline-parallel-size", self.pipeline_parallel_size),
            ("--kv-cache-memory-bytes", self.kv_cache_memory_bytes),
        ):
            if value is not None and value < 1:
                raise InvalidSettingError(f"{flag} must be a positive integer, got {value}.")
        if self.cpu_offload_gb < 0:
            raise InvalidSettingError(f"--cpu-offload-gb must be >= 0, got {self.cpu_offload_gb}.")

    @property
    def world_size(self) -> int:
        """GPUs one replica uses."""
        return self.tensor_parallel_size * self.pipeline_parallel_size


def to_vllm_args(settings: VllmSettings) -> list[str]:
    """The ``vllm serve`` flags for these settings, one token per list item.

    Written out flag by flag (not a loop over fields) so that each flag can be found with
    grep and checked against ``vllm serve --help`` by the contract test.
    """
    s = settings
    args = ["--dtype", s.dtype, "--gpu-memory-utilization", f"{s.gpu_memory_utilization:g}"]
    if s.quantization is not None and s.quantization not in TRANSFORMERS_ONLY:
        args += ["--quantization", s.quantization]
    if s.kv_cache_dtype != "auto":
        args += ["--kv-cache-dtype", s.kv_cache_dtype]
    if s.max_model_len is not None:
        args += ["--max-model-len", str(s.max_model_len)]
    if s.max_num_seqs is not None:
        args += ["--max-num-seqs", str(s.max_num_seqs)]
    if s.max_num_batched_tokens is not None:
        args += ["--max-num-batched-tokens", str(s.max_num_batched_tokens)]
    if s.enforce_eager:
        args += ["--enforce-eager"]
    if s.tensor_parallel_size != 1:
        args += ["--tensor-parallel-size", str(s.tensor_parallel_size)]
    if s.pipeline_parallel_size != 1:
        args += ["--pipeline-parallel-size", str(s.pipeline_parallel_size)]
    if s.cpu_offload_gb:
        args += ["--cpu-offload-gb", f"{s.cpu_offload_gb:g}"]
    if s.kv_cache_memory_bytes is not None:
        args += ["--kv-cache-memory-bytes", str(s.kv_cache_memory_bytes)]
    return args
