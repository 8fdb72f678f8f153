"""The built-in catalog: config.json and published sizes of popular models, offline."""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

from oominfer.model.config import with_modelopt
from oominfer.model.spec import Checkpoint


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
