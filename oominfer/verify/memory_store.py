"""The KV cache engines measured on this machine beside the model's prediction, one JSON line
per model x GPU x engine release, so the next estimate of the same setup starts from what was
measured: what the model missed of the memory besides the KV cache is taken from it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oominfer.memory.breakdown import MemoryBreakdown
from oominfer.settings import EngineSettings
from oominfer.verify.cache import cache_dir
from oominfer.verify.jsonl import find, keep, store_key


@dataclass(frozen=True, slots=True, kw_only=True)
class MeasuredMemory:
    """An engine's "Available KV cache memory" on one setup, and the model's for it."""

    kv_cache_bytes: int
    predicted_kv_cache_bytes: int
    layout: dict[str, Any]
    """What the memory besides the KV cache depends on (memory_layout): the correction holds
    for an estimate with the same."""
    engine_version: str = ""
    measured_at: str = ""

    @property
    def offset_bytes(self) -> int:
        """Bytes of non-KV memory the engine held beyond the model's (negative: fewer)."""
        return self.predicted_kv_cache_bytes - self.kv_cache_bytes


def memory_layout(settings: EngineSettings, b: MemoryBreakdown) -> dict[str, Any]:
    """The settings the memory besides the KV cache depends on, as vLLM resolves them (the
    utilization and the context do not move it)."""
    s = settings
    return {
        "dtype": b.dtype,
        "quantization": s.quantization,
        "kv_cache_dtype": s.kv_cache_dtype,
        "tensor_parallel_size": s.tensor_parallel_size,
        "pipeline_parallel_size": s.pipeline_parallel_size,
        "data_parallel_size": s.data_parallel_size,
        "enable_expert_parallel": s.enable_expert_parallel,
        "enforce_eager": s.enforce_eager,
        "max_num_seqs": b.max_num_seqs,
        "max_num_batched_tokens": b.max_num_batched_tokens,
        "cpu_offload_gb": s.cpu_offload_gb,
        "speculative_config": s.speculative_config,
        "enable_lora": s.enable_lora,
    }


def store_path() -> Path:
    """memory.jsonl beside the verified plans (OOMINFER_CACHE_DIR, else the user's cache)."""
    return cache_dir() / "memory.jsonl"


def remember_memory(model_id: str, gpu: str, measured: MeasuredMemory) -> None:
    """Keep (replace) the measurement of this model x GPU x engine release."""
    fields = {
        "kv_cache_bytes": measured.kv_cache_bytes,
        "predicted_kv_cache_bytes": measured.predicted_kv_cache_bytes,
        "layout": measured.layout,
    }
    keep(store_path(), model_id, gpu, engine_version=measured.engine_version,
         measured_at=measured.measured_at, fields=fields)  # fmt: skip


def recall_memory(model_id: str, gpu: str, engine_version: str) -> MeasuredMemory | None:
    """The measurement of this model x GPU x engine release, if one was kept."""
    return find(store_path(), store_key(model_id, gpu, engine_version), _measured)


def _measured(e: dict[str, Any]) -> MeasuredMemory:
    return MeasuredMemory(
        kv_cache_bytes=int(e["kv_cache_bytes"]),
        predicted_kv_cache_bytes=int(e["predicted_kv_cache_bytes"]),
        layout=dict(e["layout"]),
        engine_version=str(e.get("engine_version", "")),
        measured_at=str(e.get("measured_at", "")),
    )
