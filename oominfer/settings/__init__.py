"""What the engine is told: which engine, on which device, and its knobs under vLLM's names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal, get_args

from oominfer.base.errors import InvalidSettingError

Dtype = Literal["auto", "bfloat16", "float16", "float32"]
"""The ``--dtype`` choices (vLLM also accepts ``half`` and ``float``: normalised by dtype_name)."""

KvCacheDtype = Literal["auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2"]
"""The ``--kv-cache-dtype`` choices; ``auto`` stores the cache in the model's dtype."""

Quantization = Literal[
    "awq", "awq_marlin", "gptq", "gptq_marlin", "fp8", "fp8_per_tensor", "bitsandbytes",
    "int8", "mxfp4", "compressed-tensors", "modelopt",
]  # fmt: skip
"""The ``--quantization`` choices, under vLLM's names. ``fp8`` loads an FP8 checkpoint;
``fp8_per_tensor`` quantizes 16-bit weights to FP8 at load time (vLLM >= 0.30 spelling).
``bitsandbytes`` is 4-bit NF4 and ``int8`` is LLM.int8: vLLM 0.32 dropped bitsandbytes, so
both load in flight through the transformers engine."""

DTYPES: Final = get_args(Dtype)
KV_CACHE_DTYPES: Final = get_args(KvCacheDtype)
QUANTIZATIONS: Final = get_args(Quantization)

_ALIASES: Final = {
    "half": "float16",
    "fp16": "float16",
    "bf16": "bfloat16",
    "float": "float32",
    "fp32": "float32",
    "f16": "float16",
    "f32": "float32",
}


def dtype_name(text: str) -> str:
    """Normalise a dtype spelling (``half``, ``bf16``, ``torch.bfloat16``) to vLLM's name."""
    name = text.lower().removeprefix("torch.")
    return _ALIASES.get(name, name)


ExecutorBackend = Literal["ray", "mp"]
"""vLLM's --distributed-executor-backend choices oominfer plans."""
Engine = Literal["vllm", "transformers"]
"""vLLM (paged KV cache, CUDA graphs) or oominfer's own transformers server."""
Device = Literal["cuda", "cpu"]
"""GPUs (CUDA), or the host's CPU and memory (vLLM's CPU backend, or transformers)."""

ENGINES: Final = get_args(Engine)
DEVICES: Final = get_args(Device)

TRANSFORMERS_ONLY: Final = frozenset({"bitsandbytes", "int8"})
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
    distributed_executor_backend: ExecutorBackend | None = None
    """``ray`` for a replica spanning nodes (vLLM refuses a world size larger than the GPUs
    it sees otherwise); None lets vLLM pick (multiprocessing inside a node)."""
    allow_deprecated_quantization: bool = False
    """Needed to load a checkpoint whose quantization method vLLM deprecated (fbgemm_fp8)."""

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
        if (
            self.max_num_seqs is not None
            and self.max_num_batched_tokens is not None
            and self.max_num_batched_tokens < self.max_num_seqs
        ):
            raise InvalidSettingError(
                f"--max-num-batched-tokens {self.max_num_batched_tokens} is below "
                f"--max-num-seqs {self.max_num_seqs}: vLLM needs a step to hold a token of "
                "every running sequence.",
                hint=f"Use --max-num-batched-tokens {self.max_num_seqs} or more.",
            )
        if self.cpu_offload_gb < 0:
            raise InvalidSettingError(f"--cpu-offload-gb must be >= 0, got {self.cpu_offload_gb}.")

    @property
    def world_size(self) -> int:
        """GPUs one replica uses."""
        return self.tensor_parallel_size * self.pipeline_parallel_size
