"""The built-in catalog: config.json and published sizes of popular models, offline."""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

from oominfer.base.errors import ModelError
from oominfer.model.config import spec_from_config, with_modelopt
from oominfer.model.spec import Checkpoint, ModelSpec


@dataclass(frozen=True, slots=True)
class CatalogEntry:
    """One model of the built-in catalog."""

    model_id: str
    config: dict[str, Any]
    checkpoint: Checkpoint
    source: str


@functools.cache
def _catalog() -> dict[str, Any]:
    text = resources.files("oominfer.data").joinpath("models.json").read_text(encoding="utf-8")
    models: dict[str, Any] = json.loads(text)["models"]
    return models


def _key(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


@functools.cache
def _catalog_index() -> dict[str, str]:
    index: dict[str, str] = {}
    for model_id, entry in _catalog().items():
        for alias in (model_id, model_id.split("/")[-1], *entry.get("aliases", [])):
            index.setdefault(_key(alias), model_id)
    return index


def catalog_ids() -> list[str]:
    """Every model id in the built-in catalog, sorted."""
    return sorted(_catalog())


def catalog_entry(name: str) -> CatalogEntry | None:
    """The catalog's entry for a model id or short name (case- and punctuation-insensitive)."""
    model_id = _catalog_index().get(_key(name))
    if model_id is None:
        return None
    entry = _catalog()[model_id]
    config = with_modelopt(entry["config"], entry.get("hf_quant_config"))
    checkpoint = Checkpoint(
        parameters=dict(entry.get("parameters") or {}),
        total_bytes=entry.get("total_size_bytes"),
    )
    return CatalogEntry(model_id, config, checkpoint, entry.get("source", ""))


def _shape(spec: ModelSpec) -> tuple[object, ...]:
    """What two checkpoints of the same model share whatever their weight format."""
    return (
        spec.model_type.split("_")[0],
        spec.num_layers,
        spec.hidden_size,
        spec.num_attention_heads,
        spec.num_kv_heads,
        spec.vocab_size,
        spec.num_experts,
    )


@functools.cache
def _quantized_by_shape() -> dict[tuple[object, ...], tuple[str, ...]]:
    found: dict[tuple[object, ...], list[str]] = {}
    for model_id in catalog_ids():
        entry = catalog_entry(model_id)
        if entry is None or "quantization_config" not in entry.config:
            continue
        try:
            spec = spec_from_config(entry.config, model_id=model_id, checkpoint=entry.checkpoint)
        except ModelError:
            continue
        found.setdefault(_shape(spec), []).append(model_id)
    return {shape: tuple(ids) for shape, ids in found.items()}


def quantized_siblings(spec: ModelSpec) -> tuple[str, ...]:
    """Pre-quantized checkpoints in the catalog of the same model (the same architecture
    shape), smallest formats last."""
    return tuple(m for m in _quantized_by_shape().get(_shape(spec), ()) if m != spec.model_id)
