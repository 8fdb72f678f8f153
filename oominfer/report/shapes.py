"""The stable machine-readable shapes oominfer prints under ``--json``. Pure."""

from __future__ import annotations

import dataclasses
from typing import Any

from oominfer.base.errors import OominferError
from oominfer.hardware.hardware import Hardware
from oominfer.memory.breakdown import MemoryBreakdown
from oominfer.model.spec import ModelSpec
from oominfer.planning.document import Prediction
from oominfer.settings import EngineSettings


def breakdown_json(
    spec: ModelSpec, hardware: Hardware, settings: EngineSettings, b: MemoryBreakdown
) -> dict[str, Any]:
    """The stable machine-readable shape of one estimate (``--json``)."""
    return {
        "model": {
            "id": spec.model_id,
            "architecture": spec.architecture,
            "source": spec.source,
            "parameters": spec.checkpoint.float_params or spec.params.total,
            "max_position_embeddings": spec.max_position_embeddings,
            "quantization": spec.quantization.method if spec.quantization else None,
        },
        "hardware": {
            "gpu": hardware.gpu.name,
            "gpus": hardware.count,
            "memory_bytes": hardware.gpu.memory_bytes,
            "cuda_total_bytes": hardware.gpu.cuda_total_bytes,
            "compute_capability": ".".join(map(str, hardware.gpu.compute_capability)),
        },
        "engine": b.engine,
        "settings": {
            **dataclasses.asdict(settings),
            "dtype": b.dtype,
            "max_model_len": b.max_model_len,
            "max_num_seqs": b.max_num_seqs,
            "max_num_batched_tokens": b.max_num_batched_tokens,
        },
        "per_gpu": dataclasses.asdict(Prediction.of(b)),
    }


def error_json(
    kind: str, exit_code: int, message: str, hint: str | None = None, **data: Any
) -> dict[str, Any]:
    """The one shape of every failure under ``--json``: ``error`` (a stable snake_case kind),
    ``exit_code``, ``message``, ``hint`` (null when none), then the error's facts as data
    (``shortfall_bytes`` and ``ways_out`` when it does not fit)."""
    return {"error": kind, "exit_code": exit_code, "message": message, "hint": hint, **data}


def error_json_of(err: OominferError) -> dict[str, Any]:
    """The ``--json`` shape of an expected failure."""
    return error_json(err.kind, int(err.exit_status), err.message, err.hint, **err.data())
