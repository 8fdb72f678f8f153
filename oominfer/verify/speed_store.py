"""The speeds engines measured on this machine, one JSON line per model x GPU x engine
release, so the next estimate of the same setup starts from what was measured."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from oominfer.speed import Measured
from oominfer.verify.cache import cache_dir
from oominfer.verify.jsonl import find, keep, store_key


def store_path() -> Path:
    """speed.jsonl beside the verified plans (OOMINFER_CACHE_DIR, else the user's cache)."""
    return cache_dir() / "speed.jsonl"


def remember(model_id: str, gpu: str, measured: Measured) -> None:
    """Keep (replace) the measurement of this model x GPU x engine release."""
    fields = {
        "output_tokens_per_s": measured.output_tokens_per_s,
        "predicted_output_tokens_per_s": measured.predicted_output_tokens_per_s,
        "concurrency": measured.concurrency,
        "input_len": measured.input_len,
        "output_len": measured.output_len,
    }
    keep(store_path(), model_id, gpu, engine_version=measured.engine_version,
         measured_at=measured.measured_at, fields=fields)  # fmt: skip


def recall(model_id: str, gpu: str, engine_version: str) -> Measured | None:
    """The measurement of this model x GPU x engine release, if one was kept."""
    return find(store_path(), store_key(model_id, gpu, engine_version), _measured)


def _measured(e: dict[str, Any]) -> Measured:
    return Measured(
        output_tokens_per_s=float(e["output_tokens_per_s"]),
        predicted_output_tokens_per_s=e.get("predicted_output_tokens_per_s"),
        concurrency=int(e["concurrency"]),
        input_len=int(e["input_len"]),
        output_len=int(e["output_len"]),
        engine_version=str(e.get("engine_version", "")),
        measured_at=str(e.get("measured_at", "")),
    )
