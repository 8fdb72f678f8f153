"""Engines oominfer launches: their argv, and how to read their logs. Pure."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class ProbeStatus(enum.Enum):
    """How a launch of the engine ended."""

    READY = "ready"
    KV_CACHE_TOO_SMALL = "kv_cache_too_small"
    """max_model_len does not fit the KV cache; the engine may say what would."""
    NO_KV_MEMORY = "no_kv_memory"
    """Nothing was left for the KV cache after weights and activations."""
    OUT_OF_MEMORY = "out_of_memory"
    """An allocation failed (CUDA or host memory)."""
    INSUFFICIENT_FREE_MEMORY = "insufficient_free_memory"
    """Other processes hold memory the engine was told it could use."""
    UNSUPPORTED = "unsupported"
    """The engine cannot run this model, quantization or setting."""
    ILLEGAL_INSTRUCTION = "illegal_instruction"
    """A process died with SIGILL: the CPU advertises an instruction set (AMX) it traps."""
    TIMEOUT = "timeout"
    CRASHED = "crashed"

    @property
    def is_memory(self) -> bool:
        """True for the outcomes a smaller configuration can fix."""
        return self in (
            ProbeStatus.KV_CACHE_TOO_SMALL,
            ProbeStatus.NO_KV_MEMORY,
            ProbeStatus.OUT_OF_MEMORY,
            ProbeStatus.INSUFFICIENT_FREE_MEMORY,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class LogFacts:
    """What an engine's log says about its outcome and its memory."""

    status: ProbeStatus | None
    """None while the log shows neither success nor a known failure."""
    detail: str = ""
    """The engine's own line that decided the status."""
    estimated_max_model_len: int | None = None
    weights_bytes: int | None = None
    kv_cache_bytes: int | None = None
    kv_cache_tokens: int | None = None
    fragmented: bool = False
    """An out-of-memory report with much memory reserved but unallocated."""
    phase: str = "starting"
