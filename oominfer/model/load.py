"""Where a model's spec comes from, in order.

A local folder (config.json and the safetensors headers); the local Hugging Face cache; the
built-in catalog (exact sizes, offline, instant) unless a revision is asked for; then the Hub
over the network.
"""

from __future__ import annotations

from pathlib import Path

from oominfer.errors import ModelNotFoundError
from oominfer.model.catalog import catalog_entry
from oominfer.model.config import spec_from_config
from oominfer.model.folder import read_config, spec_from_folder
from oominfer.model.hub import from_hf_cache, from_hub
from oominfer.model.spec import ModelSpec


def load_spec(name: str, *, revision: str | None = None) -> ModelSpec:
    """Find a model by folder path, catalog name or Hub id.

    Raises:
        ModelNotFoundError: nowhere to be found; GatedModelError: no access;
        UnsupportedConfigError / CorruptWeightsError: found but unreadable.
    """
    path = Path(name).expanduser()
    if path.is_dir():
        return spec_from_folder(path)
    if path.is_file() and path.name == "config.json":
        return spec_from_config(read_config(path), model_id=str(path.parent))
    if name.count("/") > 1 or name.startswith((".", "/", "~")):
        raise ModelNotFoundError(f"no model folder at {name}.")
    if revision is None:
        cached = from_hf_cache(name)
        if cached is not None:
            return cached
        entry = catalog_entry(name)
        if entry is not None:
            return spec_from_config(
                entry.config,
                model_id=entry.model_id,
                checkpoint=entry.checkpoint,
                source="catalog",
            )
    return from_hub(name, revision=revision)
