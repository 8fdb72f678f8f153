"""What the user asks of a plan: the engine, the objective, the floors and caps."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal, get_args

from oominfer.errors import InvalidSettingError
from oominfer.settings import Dtype, Engine

Prefer = Literal["context", "throughput", "quality"]
PREFERENCES: Final = get_args(Prefer)


@dataclass(frozen=True, slots=True, kw_only=True)
class Constraints:
    """What the user asks of the plan."""

    engine: Engine = "vllm"
    """The engine to plan for."""
    dtype: Dtype = "auto"
    """The compute dtype; ``auto`` is the GPU's best 16-bit type for the checkpoint."""
    prefer: Prefer = "context"
    min_context: int = 1
    """The shortest context acceptable (--min-context)."""
    concurrency: int | None = None
    """Sequences that must run at once (--concurrency)."""
    max_model_len: int | None = None
    """A cap on the context (--max-model-len)."""
    no_quantize: bool = False
    allow_offload: bool = False
    gpu_memory_utilization: float | None = None
    """Fixed by the user; otherwise vLLM's default."""
    kv_cache_memory_bytes: int | None = None
    """CPU serving: the KV-cache budget (vLLM's --kv-cache-memory-bytes)."""
    gpus_per_node: int = 8
    """GPUs of one node: tensor parallelism stays within a node, pipeline stages span nodes."""

    def __post_init__(self) -> None:
        """Reject constraints that cannot hold together."""
        if self.prefer not in PREFERENCES:
            raise InvalidSettingError(f"--prefer must be one of {', '.join(PREFERENCES)}.")
        if self.min_context < 1:
            raise InvalidSettingError(f"--min-context must be positive, got {self.min_context}.")
        if self.concurrency is not None and self.concurrency < 1:
            raise InvalidSettingError(f"--concurrency must be positive, got {self.concurrency}.")
        if self.gpus_per_node < 1:
            raise InvalidSettingError(
                f"--gpus-per-node must be positive, got {self.gpus_per_node}."
            )
        if self.max_model_len is not None and self.max_model_len < self.min_context:
            raise InvalidSettingError(
                f"--max-model-len {self.max_model_len} is below --min-context {self.min_context}."
            )
